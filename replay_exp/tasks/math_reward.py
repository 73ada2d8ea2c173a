r"""Binary correctness reward for free-form math answers (GSM8K, MATH, OpenR1-Math).

``math_reward(completion, reference)`` is 1.0 iff the completion's final answer is equivalent to
the reference answer, else 0.0. It never raises. The exact rules:

1. **The completion's answer** (:func:`extract_answer`), first rule that applies:

   a. the content of the LAST complete ``\boxed{...}`` or ``\fbox{...}`` (balanced braces, so
      ``\boxed{\frac{1}{2}}`` gives ``\frac{1}{2}``; a box never closed, e.g. a truncated
      completion, and an empty box ``\boxed{}`` are ignored);
   b. else the rest of the line after the LAST ``####`` marker (GSM8K style, ``#### 72``), when
      not empty;
   c. else the LAST number in the text: an integer or decimal, optionally negative (a ``-`` right
      after a letter, digit or closing bracket is a minus sign, not a sign: ``5-3`` gives ``3``),
      with optional thousands separators (``1,000``), optionally a fraction ``a/b`` or
      ``\frac{a}{b}`` (also ``\dfrac`` / ``\tfrac``) of such numbers;
   d. else there is no answer: reward 0.0.

   So a truncated ``\boxed{\frac{1}{2}`` falls through to rule c and reads ``\frac{1}{2}``:
   giving unfinished completions (no EOS) 0.0 is the task's job, as in the arithmetic task.

2. **The reference's answer** (:func:`extract_reference`): the last complete box if the
   reference contains one (a full MATH solution), else the text after the last ``####`` (a full
   GSM8K answer), else the whole reference, stripped (``72``, ``\frac{1}{2}``).

3. **Pre-normalisation** of both answers (:func:`_pre_normalise`): strip whitespace, drop
   ``\!``, drop a thin-space / ``~`` / ``\ `` thousands separator between digits
   (``1\,000`` -> ``1000``; math_verify reads ``1\,000`` as ``1*0``), drop one trailing ``.``
   (math_verify cannot parse ``72.``), and split off a trailing percent sign (``\%`` or ``%``).

4. **math_verify** (0.9.0): each answer is parsed on its own as ``\boxed{<answer>}`` with
   ``LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)`` (its
   default LaTeX normalisation: ``\dfrac``/``\tfrac``, ``\left``/``\right``, units and
   ``\text{...}`` units, ``^\circ``, ``\$``, thousands separators ``1,000`` / ``1{,}000``...).
   A split-off percent sign is re-applied with latex2sympy's ``convert_to_pct``, which gives
   math_verify's percentage rules: ``25\%`` equals ``25`` and ``0.25`` (and ``\frac14``).
   (The antlr 4.9.3 runtime that hydra pins cannot parse ``25\%`` inside LaTeX: latex2sympy2's
   4.9.3 grammar lacks ``FUNC_GAMMA`` and raises AttributeError, hence the split.)
   If both answers parse, ``math_verify.verify(gold, pred)`` (float_rounding=6, strict=True)
   is the verdict: numeric equality (``0.5`` = ``\frac12``, ``\frac13`` = ``0.333333`` but not
   ``0.33``), symbolic equality (``2\sqrt2`` = ``\sqrt8``), ``x=3`` = ``3``, intervals (open /
   closed ends must match), sets / tuples, matrices, ``\text{(B)}`` = ``B``.

5. **Fallback**, used when math_verify cannot parse either answer, raises, times out, or an
   answer is longer than :data:`MAX_ANSWER_CHARS`: the answers match iff their
   :func:`normalize_answer` forms are equal and non-empty. :func:`normalize_answer` applies
   step 3, then removes ``$`` and ``\$``, ``\left`` / ``\right``, ``\displaystyle``; maps
   ``\dfrac`` / ``\tfrac`` to ``\frac``; unwraps an answer that is a single ``\text{...}`` /
   ``\textbf`` / ``\textrm`` / ``\mathrm`` / ``\mbox`` group, and otherwise drops such groups
   (optionally with a ``^2``-style exponent) at the end of the answer (units); removes
   ``^\circ`` / ``^{\circ}`` / ``\circ`` / ``\degree`` / ``°`` and the percent sign; removes
   the commas of a number written with thousands separators (``-1,234.5``); removes all
   whitespace and the spacing commands ``\,`` ``\;`` ``\:`` ``\ `` ``\quad`` ``\qquad`` ``~``;
   strips trailing ``.``. The comparison is case-sensitive.

Robustness. Any exception inside ``math_reward`` gives 0.0 and is counted in
:func:`reward_stats` (key ``"error"``); the other keys count which path decided each call
(``"math_verify"``, ``"fallback_unparsed"``, ``"fallback_error"``, ``"fallback_timeout"``,
``"fallback_long"``, ``"no_answer"``). math_verify's timeouts use ``signal.alarm``, which only
works in the main thread: there each parse / verify gets :data:`TIMEOUT_S` seconds (whole
seconds; note that ``signal.alarm`` cancels any alarm the caller had pending). From any other
thread math_verify runs WITHOUT a timeout (calling it with one would raise); answers longer
than :data:`MAX_ANSWER_CHARS` never reach sympy, which bounds but does not remove the risk of
a slow simplification. Verdicts are cached per (reference answer, completion answer) pair
(an LRU cache of 65536 pairs), so a group of completions with the same answer costs one check.
"""

from __future__ import annotations

import functools
import re
import threading
from collections import Counter

from latex2sympy2_extended.latex2sympy2 import convert_to_pct
from math_verify import LatexExtractionConfig, parse, verify
from math_verify.errors import TimeoutException

__all__ = [
    "MAX_ANSWER_CHARS",
    "TIMEOUT_S",
    "after_hashes",
    "extract_answer",
    "extract_reference",
    "last_boxed",
    "math_reward",
    "normalize_answer",
    "reset_reward_stats",
    "reward_stats",
]

TIMEOUT_S = 3  # seconds per math_verify parse / verify call (main thread only; signal.alarm)
MAX_ANSWER_CHARS = 1000  # longer answers skip math_verify and use the string fallback

_LATEX_CONFIG = LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_GSM8K_MARKER = re.compile(r"####[ \t]*([^\n]*)")
_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
_SIGN = r"(?:(?<![\w)\]}])-\s*)?"
_LAST_NUMBER = re.compile(
    rf"{_SIGN}\\[dt]?frac\{{\s*-?(?:{_NUM})\s*\}}\{{\s*(?:{_NUM})\s*\}}"
    rf"|{_SIGN}(?:{_NUM})(?:\s*/\s*(?:{_NUM}))?"
)

_THIN_SPACE_THOUSANDS = re.compile(r"(?<=\d)(?:\\[,;: ]|~)(?=\d{3}(?!\d))")
_PERCENT = re.compile(r"\s*\\?%$")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_TEXT_GROUP = r"\\(?:text|textbf|textrm|mathrm|mbox)\s*\{([^{}]*)\}"
_WHOLE_TEXT = re.compile(rf"{_TEXT_GROUP}")
_TRAILING_TEXT = re.compile(rf"\s*{_TEXT_GROUP}(?:\^\{{?\d\}}?)?\s*$")
_DEGREES = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree|°")
_SPACING = re.compile(r"\\(?:qquad|quad|[,;: ])|~|\s")

_stats: Counter[str] = Counter()
_stats_lock = threading.Lock()


def _count(key: str) -> None:
    with _stats_lock:
        _stats[key] += 1


def reward_stats() -> dict[str, int]:
    """How many :func:`math_reward` calls each path decided (and ``"error"``: crashed -> 0.0)."""
    with _stats_lock:
        return dict(_stats)


def reset_reward_stats() -> None:
    with _stats_lock:
        _stats.clear()


def last_boxed(text: str) -> str | None:
    """Content of the last complete, non-empty ``\\boxed{...}`` / ``\\fbox{...}``."""
    found = None
    for m in _BOX_OPEN.finditer(text):
        depth, start = 1, m.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    content = text[start:i].strip()
                    if content:
                        found = content
                    break
    return found


def after_hashes(text: str) -> str | None:
    """Rest of the line after the last ``####`` marker, when not empty."""
    matches = _GSM8K_MARKER.findall(text)
    if matches and matches[-1].strip():
        return matches[-1].strip()
    return None


def extract_answer(text: str) -> str | None:
    """The final answer of a completion: last box, else ``####`` line, else last number."""
    for rule in (last_boxed, after_hashes):
        found = rule(text)
        if found is not None:
            return found
    numbers = _LAST_NUMBER.findall(text)
    return numbers[-1].strip() if numbers else None


def extract_reference(reference: str) -> str | None:
    """The reference's answer: last box, else ``####`` line, else the whole text stripped."""
    for rule in (last_boxed, after_hashes):
        found = rule(reference)
        if found is not None:
            return found
    return reference.strip() or None


def _pre_normalise(answer: str) -> tuple[str, bool]:
    """Step 3 of the module rules: (answer, whether a trailing percent sign was split off)."""
    s = answer.strip().replace("\\!", "")
    s = _THIN_SPACE_THOUSANDS.sub("", s)
    s = s.strip().removesuffix(".").strip()
    s, n_pct = _PERCENT.subn("", s)
    return s.strip(), n_pct > 0


def normalize_answer(answer: str) -> str:
    """The string form the fallback compares (step 5 of the module rules)."""
    s, _ = _pre_normalise(answer)
    s = s.replace("\\$", "").replace("$", "").replace("\\displaystyle", "")
    s = re.sub(r"\\(?:left|right)(?![a-zA-Z])", "", s)
    s = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", s)
    whole = _WHOLE_TEXT.fullmatch(s.strip())
    if whole:
        s = whole.group(1)
    else:
        while True:
            stripped = _TRAILING_TEXT.sub("", s)
            if stripped == s or not stripped.strip():
                break
            s = stripped
    s = _DEGREES.sub("", s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.strip()
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    s = _SPACING.sub("", s)
    return s.rstrip(".")


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@functools.lru_cache(maxsize=65536)
def _mv_parse(answer: str, percent: bool, timeout_s: int | None) -> tuple:
    """math_verify's parse of ``\\boxed{answer}``: () when it cannot parse it."""
    parsed = parse(
        "\\boxed{" + answer + "}",
        [_LATEX_CONFIG],
        fallback_mode="no_fallback",
        parsing_timeout=timeout_s,
        raise_on_error=True,
    )
    if percent:
        parsed = [convert_to_pct(p) for p in parsed]
    return tuple(parsed)


@functools.lru_cache(maxsize=65536)
def _judge(gold: str, pred: str) -> tuple[bool, str]:
    """(verdict, path that decided it) for two extracted answers."""
    timeout_s = TIMEOUT_S if _in_main_thread() else None
    path = "fallback_unparsed"
    if max(len(gold), len(pred)) > MAX_ANSWER_CHARS:
        path = "fallback_long"
    else:
        try:
            g = _mv_parse(*_pre_normalise(gold), timeout_s)
            p = _mv_parse(*_pre_normalise(pred), timeout_s) if g else ()
            if g and p:
                ok = verify(list(g), list(p), timeout_seconds=timeout_s, raise_on_error=True)
                return bool(ok), "math_verify"
        except TimeoutException:
            path = "fallback_timeout"
        except Exception:
            path = "fallback_error"
    g_norm, p_norm = normalize_answer(gold), normalize_answer(pred)
    return bool(g_norm) and g_norm == p_norm, path


def math_reward(completion: str, reference: str) -> float:
    """1.0 iff the completion's final answer is equivalent to the reference (module rules)."""
    try:
        pred = extract_answer(completion)
        gold = extract_reference(reference)
        if pred is None or gold is None:
            _count("no_answer")
            return 0.0
        ok, path = _judge(gold, pred)
        _count(path)
        return 1.0 if ok else 0.0
    except (Exception, TimeoutException):  # TimeoutException is a BaseException
        _count("error")
        return 0.0
