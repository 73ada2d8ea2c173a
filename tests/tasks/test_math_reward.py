"""Math answer extraction and the math_verify-based reward, with its string fallback."""

from __future__ import annotations

import threading

import pytest
from math_verify.errors import TimeoutException

from replay_exp.tasks import math_reward as mr
from replay_exp.tasks.math_reward import (
    extract_answer,
    extract_reference,
    math_reward,
    normalize_answer,
    reset_reward_stats,
    reward_stats,
)


@pytest.fixture(autouse=True)
def _fresh_caches():
    mr._judge.cache_clear()
    mr._mv_parse.cache_clear()
    reset_reward_stats()
    yield
    mr._judge.cache_clear()
    mr._mv_parse.cache_clear()


PAIRS = [
    # --- fractions, boxes ---
    (r"So the answer is $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}", 1.0),  # nested braces in a box
    (r"\boxed{0.5}", r"\frac12", 1.0),  # decimal vs fraction written without braces
    (r"\boxed{\dfrac{3}{4}}", r"\frac{3}{4}", 1.0),  # \dfrac vs \frac
    (r"\boxed{\tfrac34}", "0.75", 1.0),  # \tfrac without braces vs decimal
    (r"\boxed{\frac{1}{3}}", "0.333333", 1.0),  # floats compared at 6 decimal places
    (r"\boxed{0.33}", r"\frac13", 0.0),  # ... so a coarse rounding is wrong
    # --- negative numbers ---
    (r"The result is \fbox{-7}.", "-7", 1.0),  # \fbox counts like \boxed
    (r"\boxed{7}", "-7", 0.0),  # the sign matters
    # --- units, \text{}, degrees, LaTeX variants ---
    (r"\boxed{5\text{ cm}}", "5", 1.0),  # a \text unit is dropped
    (r"\boxed{12 \text{ inches}^2}", "12", 1.0),  # a unit with an exponent too
    (r"\boxed{30^{\circ}}", "30", 1.0),  # degrees are dropped
    (
        r"\boxed{\left( 3, \frac{\pi}{2} \right)}",
        r"(3,\frac{\pi}{2})",
        1.0,
    ),  # \left( \right), spaces
    (r"\boxed{\$18.90}", "18.9", 1.0),  # currency sign and a trailing zero
    (r"\boxed{\frac{1}{2}.}", "0.5", 1.0),  # a trailing period: math_verify alone fails
    # --- percentages (math_verify: 25% equals both 25 and 0.25) ---
    (r"\boxed{25\%}", "25", 1.0),  # needs the percent split: antlr 4.9.3 cannot parse 25\%
    (r"\boxed{25\%}", "0.25", 1.0),  # a percentage equals its fraction when the other is a float
    (r"\boxed{20\%}", r"25\%", 0.0),  # a different percentage
    # --- thousands separators ---
    (r"\boxed{1,000}", "1000", 1.0),  # comma separator
    (r"\boxed{1\,000}", "1000", 1.0),  # thin-space separator (math_verify alone reads 1*0)
    ("The total is 1,250 dollars.", "1250", 1.0),  # last-number rule keeps the separators
    # --- intervals, tuples ---
    (r"\boxed{(1,2]}", r"(1, 2]", 1.0),  # same half-open interval, different spacing
    (r"\boxed{(1,2)}", r"(1, 2]", 0.0),  # open vs half-open
    (r"\boxed{[-2,\infty)}", r"[-2, \infty)", 1.0),  # unbounded interval
    (r"\boxed{(3, 2)}", r"(2,3)", 0.0),  # order matters for pairs
    # --- last box wins, no answer, wrong answers ---
    (r"First \boxed{3}, but wait, it is actually \boxed{5}.", "5", 1.0),  # the last box wins
    (r"First \boxed{3}, but wait, it is actually \boxed{5}.", "3", 0.0),  # earlier boxes do not
    ("I am not sure how to solve this.", "5", 0.0),  # no box, no ####, no number: no answer
    ("", "5", 0.0),  # empty completion
    (r"\boxed{6}", "5", 0.0),  # plainly wrong
    # --- GSM8K, last number ---
    ("Each tray holds 3 * 24 = <<3*24=72>>72 eggs.\n#### 72", "72", 1.0),  # GSM8K marker
    ("x - 5 = 2, so x = -3.", "-3", 1.0),  # last number, with its sign, without the period
    # --- expressions vs simplified forms, equations, choices ---
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", 1.0),  # symbolic equality
    (r"\boxed{\sqrt{2}/2}", r"\frac{\sqrt2}{2}", 1.0),  # a/b vs \frac, \sqrt2 without braces
    (r"\boxed{x = 3}", "3", 1.0),  # an assignment counts as its value
    (r"\boxed{\text{(B)}}", "B", 1.0),  # multiple choice letter in \text and parentheses
    (r"\boxed{\textbf{(C)}}", "B", 0.0),  # the wrong letter
    # --- fallback: math_verify parses neither side, normalised strings decide ---
    (r"\boxed{\{x \mid x > 0\}}", r"\left\{x \mid x>0\right\}", 1.0),  # \left \right, spaces
    (r"\boxed{\{x \mid x < 0\}}", r"\left\{x \mid x>0\right\}", 0.0),  # different set
    (r"\boxed{\text{甲}}", "甲", 1.0),  # a non-Latin name (OpenR1 has some): \text unwrapped
]


@pytest.mark.parametrize(("completion", "reference", "expected"), PAIRS)
def test_reward_pairs(completion, reference, expected):
    assert math_reward(completion, reference) == expected
    assert reward_stats().get("error", 0) == 0


@pytest.mark.parametrize(
    ("completion", "reference"),
    [
        (r"\boxed{\{x \mid x > 0\}}", r"\left\{x \mid x>0\right\}"),
        (r"\boxed{A \to B}", r"A\to B"),
        (r"\boxed{\text{甲}}", "甲"),
    ],
)
def test_fallback_path_is_taken_when_math_verify_cannot_parse(completion, reference):
    assert math_reward(completion, reference) == 1.0
    assert reward_stats() == {"fallback_unparsed": 1}


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        (r"$\boxed{\frac{1}{2}}$", r"\frac{1}{2}"),  # balanced nested braces
        (r"\boxed{1} then \fbox{2}", "2"),  # last of \boxed / \fbox
        (r"\boxed{ 3 } and put it in \boxed{}", "3"),  # empty boxes are ignored
        (r"\boxed{4} and \boxed{5", "4"),  # a box never closed (truncated) is ignored
        ("#### 1,000\n", "1,000"),  # GSM8K marker, rest of the line
        (r"#### 7 but \boxed{8}", "8"),  # a box beats the marker
        ("####\nthe answer is 9", "9"),  # an empty marker line is ignored
        ("there were 12 then 15 apples", "15"),  # last number
        ("it is 3/4 of the cake", "3/4"),  # a fraction a/b
        (r"it is \dfrac{3}{4}.", r"\dfrac{3}{4}"),  # a \frac of integers
        ("so 5-3 is what we get", "3"),  # a minus after a digit is not a sign
        ("the value is .5", ".5"),  # leading decimal point
        ("no digits here", None),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


def test_extract_reference():
    assert extract_reference(r"so it is $\boxed{\frac{1}{2}}$.") == r"\frac{1}{2}"
    assert extract_reference("48/2 = <<48/2=24>>24\n#### 72") == "72"
    assert extract_reference(r"  \frac{1}{2} ") == r"\frac{1}{2}"
    assert extract_reference("  ") is None


@pytest.mark.parametrize(
    ("answer", "normal"),
    [
        (r"$\left( 1, 2 \right)$", "(1,2)"),
        (r"\dfrac{1}{2}.", r"\frac{1}{2}"),
        (r"5\text{ cm}", "5"),
        (r"10 \text{ cm}^2", "10"),
        (r"\text{Monday}", "Monday"),
        (r"30^{\circ}", "30"),
        (r"25\%", "25"),
        ("-1,234.5", "-1234.5"),
        (r"1\,000", "1000"),
        (r"3\!\cdot\! 4", r"3\cdot4"),
        (r"\$18", "18"),
    ],
)
def test_normalize_answer(answer, normal):
    assert normalize_answer(answer) == normal


def test_math_verify_errors_fall_back_to_strings(monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("parser crashed")

    monkeypatch.setattr(mr, "parse", boom)
    assert math_reward(r"\boxed{ 42 }", "42.") == 1.0  # strings equal after normalisation
    assert math_reward(r"\boxed{0.5}", r"\frac12") == 0.0  # strings differ: no math here
    assert reward_stats() == {"fallback_error": 2}


def test_math_verify_timeouts_fall_back_to_strings(monkeypatch):
    def slow(*args, **kwargs):
        raise TimeoutException("Operation timed out!")

    monkeypatch.setattr(mr, "verify", slow)
    assert math_reward(r"\boxed{x^2}", "x^2") == 1.0
    assert reward_stats() == {"fallback_timeout": 1}


def test_real_timeout_in_the_main_thread(monkeypatch):
    monkeypatch.setattr(mr, "TIMEOUT_S", 1)
    # sympy tries to evaluate a power tower; math_verify's signal.alarm stops it.
    assert math_reward(r"\boxed{9^{9^{9^{9}}}}", r"9^{9^{9^{8}}}") == 0.0
    assert reward_stats() == {"fallback_timeout": 1}


def test_unexpected_exceptions_give_zero_and_are_counted(monkeypatch):
    def boom(text):
        raise MemoryError("no")

    monkeypatch.setattr(mr, "extract_answer", boom)
    assert math_reward(r"\boxed{1}", "1") == 0.0
    assert reward_stats() == {"error": 1}


def test_answers_too_long_skip_math_verify():
    long = "+".join(["1"] * 600)  # 1199 characters
    assert math_reward(rf"\boxed{{{long}}}", long) == 1.0
    assert math_reward(rf"\boxed{{{long}}}", "600") == 0.0
    assert reward_stats() == {"fallback_long": 2}


def test_works_from_a_worker_thread():
    results: list[float] = []

    def work():
        results.append(math_reward(r"\boxed{\frac{2}{4}}", "0.5"))
        results.append(math_reward(r"\boxed{\frac{2}{5}}", "0.5"))

    t = threading.Thread(target=work)
    t.start()
    t.join(timeout=30)
    assert results == [1.0, 0.0]
    assert reward_stats() == {"math_verify": 2}


def test_stats_count_each_call_even_when_cached():
    for _ in range(3):
        assert math_reward(r"\boxed{4}", "4") == 1.0
    assert math_reward("nothing", "4") == 0.0
    assert reward_stats() == {"math_verify": 3, "no_answer": 1}
