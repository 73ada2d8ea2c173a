"""Math dataset loaders on small local fixtures in the real GSM8K / MATH-500 / OpenR1 formats."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import datasets
import pandas as pd
import pytest

from replay_exp.tasks.base import Problem
from replay_exp.tasks.math_data import (
    MATH_SUBJECTS,
    PROMPT_TEMPLATES,
    MathDataWarning,
    load_math_problems,
    render_prompt,
    split_problems,
)
from replay_exp.tasks.math_reward import math_reward

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "math"
GSM8K_ANSWERS = ["216", "10", "1250", "36", "7.5", "-7"]
MATH500_ANSWERS = [r"\frac{3}{4}", "12", r"2\sqrt{3}", "(2,-1)", "[-3,5]", "10", r"25\%"]
OPENR1_ANSWERS = ["2", "7", r"\frac{1}{2}", "C", "(-1,3)"]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def load(tmp_path):
    """load_math_problems with a per-test datasets cache (nothing written to ~/.cache)."""

    def _load(*args, **kwargs):
        return load_math_problems(*args, cache_dir=str(tmp_path / "hf_cache"), **kwargs)

    return _load


def test_gsm8k_fixture(load):
    problems = load("gsm8k", FIX / "gsm8k.jsonl")
    rows = _rows(FIX / "gsm8k.jsonl")
    assert [p.answer for p in problems] == GSM8K_ANSWERS  # "#### 1,250" -> "1250"
    assert [p.prompt for p in problems] == [r["question"] for r in rows]
    assert all(isinstance(p, Problem) for p in problems)


def test_math500_fixture(load):
    problems = load("math", FIX / "math500.jsonl")
    rows = _rows(FIX / "math500.jsonl")
    assert [p.answer for p in problems] == MATH500_ANSWERS  # the answer column wins
    assert [p.prompt for p in problems] == [r["problem"] for r in rows]


def test_hendrycks_math_rows_use_the_last_box_of_the_solution(load, tmp_path):
    rows = [
        {"problem": r["problem"], "level": f"Level {r['level']}", "type": r["subject"]}
        | {"solution": r["solution"]}
        for r in _rows(FIX / "math500.jsonl")
    ]
    problems = load("math", _write_jsonl(tmp_path / "hendrycks.jsonl", rows))
    assert [p.answer for p in problems] == [
        r"\frac{3}{4}",
        "12",
        r"2\sqrt{3}",
        "(2,-1)",
        "[-3, 5]",
        r"10\text{ cm}",
        r"25\%",
    ]


def test_openr1_fixture_skips_the_proof_row(load):
    with pytest.warns(MathDataWarning, match=r"skipped 1 row\(s\)"):
        problems = load("openr1_math", FIX / "openr1.parquet")
    assert [p.answer for p in problems] == OPENR1_ANSWERS
    df = pd.read_parquet(FIX / "openr1.parquet")
    assert [p.prompt for p in problems] == list(df.problem[df.answer != "proof"])


def test_limit_keeps_the_first_usable_problems(load):
    assert [p.answer for p in load("gsm8k", FIX / "gsm8k.jsonl", limit=2)] == GSM8K_ANSWERS[:2]
    with pytest.raises(ValueError, match="limit=0"):
        load("gsm8k", FIX / "gsm8k.jsonl", limit=0)


def test_directory_of_files(load, tmp_path):
    lines = (FIX / "gsm8k.jsonl").read_text().splitlines(keepends=True)
    d = tmp_path / "gsm8k_dir"
    d.mkdir()
    (d / "part-0.jsonl").write_text("".join(lines[:4]))
    (d / "part-1.jsonl").write_text("".join(lines[4:]))
    (d / "notes.txt").write_text("ignored")
    assert load("gsm8k", d) == load("gsm8k", FIX / "gsm8k.jsonl")
    pq_dir = tmp_path / "openr1_dir"
    pq_dir.mkdir()
    shutil.copy(FIX / "openr1.parquet", pq_dir / "train-00000.parquet")
    with pytest.warns(MathDataWarning):
        assert [p.answer for p in load("openr1_math", pq_dir)] == OPENR1_ANSWERS


def test_json_array_file(load, tmp_path):
    path = tmp_path / "gsm8k.json"
    path.write_text(json.dumps(_rows(FIX / "gsm8k.jsonl")))
    assert [p.answer for p in load("gsm8k", path)] == GSM8K_ANSWERS


def test_rows_without_a_reference_are_skipped_with_a_count(load, tmp_path):
    rows = _rows(FIX / "gsm8k.jsonl")
    rows[1]["answer"] = "She reads for ten evenings."  # no "####"
    rows[2]["question"] = "  "
    with pytest.warns(MathDataWarning, match=r"skipped 2 row\(s\)"):
        problems = load("gsm8k", _write_jsonl(tmp_path / "g.jsonl", rows))
    assert [p.answer for p in problems] == ["216", "36", "7.5", "-7"]


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda d: FIX / "gsm8k.jsonl", ValueError, r"unknown math dataset 'gsm9k'"),
        (lambda d: d / "missing.jsonl", FileNotFoundError, r"path not found: .*missing\.jsonl"),
        (lambda d: d, FileNotFoundError, r"no \.jsonl/\.json/\.parquet files in directory"),
        (lambda d: FIX / "README.md", ValueError, r"unsupported math dataset file .*README\.md"),
    ],
)
def test_path_errors(load, tmp_path, make, error, match):
    name = "gsm9k" if "unknown" in match else "gsm8k"
    with pytest.raises(error, match=match):
        load(name, make(tmp_path))


def test_wrong_fields_name_found_and_expected(load):
    with pytest.raises(ValueError) as e:
        load("math", FIX / "wrong_fields.jsonl")
    msg = str(e.value)
    assert "\n" not in msg
    assert "wrong_fields.jsonl is not in the math format" in msg
    assert "missing field(s) ['problem', 'solution']" in msg
    assert "found ['prompt', 'target']" in msg
    with pytest.raises(ValueError, match=r"expected \['question', 'answer'\]"):
        load("gsm8k", FIX / "math500.jsonl")


def test_empty_and_broken_files(load, tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n  \n")
    with pytest.raises(ValueError, match=r"empty math dataset file: .*empty\.jsonl"):
        load("gsm8k", tmp_path / "empty.jsonl")
    empty = pd.DataFrame({"question": pd.Series([], dtype=str), "answer": pd.Series([], dtype=str)})
    empty.to_parquet(tmp_path / "empty.parquet")
    with pytest.raises(ValueError, match=r"empty math dataset file: .*empty\.parquet"):
        load("gsm8k", tmp_path / "empty.parquet")
    (tmp_path / "broken.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n{"question": \n')
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really parquet")
    with pytest.raises(ValueError, match=r"could not read .*broken\.parquet as parquet"):
        load("gsm8k", tmp_path / "broken.parquet")
    with pytest.raises(ValueError, match=r"could not read .*broken\.jsonl as json") as e:
        load("gsm8k", tmp_path / "broken.jsonl")
    assert "\n" not in str(e.value)
    _write_jsonl(tmp_path / "useless.jsonl", [{"question": "q", "answer": "no marker"}])
    with (
        pytest.raises(ValueError, match="no row has a usable question and reference answer"),
        pytest.warns(MathDataWarning, match=r"skipped 1 row\(s\)"),
    ):
        load("gsm8k", tmp_path / "useless.jsonl")


def test_mixed_formats_in_a_directory(load, tmp_path):
    shutil.copy(FIX / "gsm8k.jsonl", tmp_path / "a.jsonl")
    shutil.copy(FIX / "openr1.parquet", tmp_path / "b.parquet")
    with pytest.raises(ValueError, match="mixes json and parquet"):
        load("gsm8k", tmp_path)


def test_hub_failure_is_one_clear_line(load, monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(RuntimeError) as e:
        load("gsm8k")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("could not load openai/gsm8k (config main, split train) from the hub")
    assert "offline?" in msg and "pass task.path=<local" in msg


def test_hub_loads_use_the_default_ids_and_configs(load, monkeypatch):
    calls = []

    def fake(hub_id, config=None, split=None, cache_dir=None):
        calls.append((hub_id, config, split))
        return datasets.Dataset.from_list(
            [{"problem": f"{config} problem", "solution": r"so \boxed{1}", "answer": "1"}]
        )

    monkeypatch.setattr(datasets, "load_dataset", fake)
    problems = load("math", split="test")
    assert calls == [("EleutherAI/hendrycks_math", s, "test") for s in MATH_SUBJECTS]
    assert [p.prompt for p in problems] == [f"{s} problem" for s in MATH_SUBJECTS]
    calls.clear()
    load("openr1_math")
    load("math", hub_id="HuggingFaceH4/MATH-500", split="test")
    assert calls == [
        ("open-r1/OpenR1-Math-220k", "default", "train"),
        ("HuggingFaceH4/MATH-500", None, "test"),
    ]


def test_prompt_rendering(load):
    question = load("math", FIX / "math500.jsonl")[0].prompt
    default = render_prompt(question)
    assert default == question + (
        "\nPlease reason step by step, and put your final answer within \\boxed{}."
    )
    assert render_prompt(question, "plain") == question
    assert render_prompt("2+2?", "Q: {question}\nA: \\boxed{}") == "Q: 2+2?\nA: \\boxed{}"
    assert set(PROMPT_TEMPLATES) >= {"default", "plain"}
    with pytest.raises(ValueError, match="neither one of"):
        render_prompt(question, "fancy")


def _problems(n: int) -> list[Problem]:
    return [Problem(f"question {i}", str(i)) for i in range(n)]


def test_split_is_deterministic_and_disjoint():
    problems = _problems(50)
    train, held = split_problems(problems, n_eval=10, seed=3)
    assert len(held) == 10 and len(train) == 40
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    assert split_problems(problems, 10, seed=3) == (train, held)
    # Row order does not matter; the seed does.
    shuffled_train, shuffled_held = split_problems(problems[::-1], 10, seed=3)
    assert {p.prompt for p in shuffled_held} == {p.prompt for p in held}
    assert {p.prompt for p in split_problems(problems, 10, seed=4)[1]} != {p.prompt for p in held}
    # Held-out problems keep the input order.
    assert held == [p for p in problems if p in held]


def test_split_handles_duplicate_prompts():
    problems = _problems(6) + [Problem("question 0", "0"), Problem("question 1", "1")]
    train, held = split_problems(problems, n_eval=5, seed=0)
    assert len(held) == 5 and len({p.prompt for p in held}) == 5
    assert len({p.prompt for p in train}) == 1
    assert not {p.prompt for p in train} & {p.prompt for p in held}


def test_split_bounds():
    assert split_problems(_problems(3), 0) == (_problems(3), [])
    with pytest.raises(ValueError, match=r"n_eval=3 must be in \[0, 2\]"):
        split_problems(_problems(3), 3)
    with pytest.raises(ValueError, match="n_eval=-1"):
        split_problems(_problems(3), -1)


def test_fixture_split_is_stable(load):
    problems = load("gsm8k", FIX / "gsm8k.jsonl")
    _, held = split_problems(problems, n_eval=2, seed=0)
    assert [p.answer for p in held] == ["216", "-7"]  # pinned: same file -> same held-out set


def test_reference_solutions_score_one(load):
    gsm8k = load("gsm8k", FIX / "gsm8k.jsonl")
    for row, p in zip(_rows(FIX / "gsm8k.jsonl"), gsm8k, strict=True):
        assert math_reward(row["answer"], p.answer) == 1.0  # full worked answer vs its number
    math500 = load("math", FIX / "math500.jsonl")
    for row, p in zip(_rows(FIX / "math500.jsonl"), math500, strict=True):
        assert math_reward(row["solution"], p.answer) == 1.0  # boxed solution vs the answer
        assert math_reward(row["solution"], row["solution"]) == 1.0  # a solution as reference
    df = pd.read_parquet(FIX / "openr1.parquet")
    with pytest.warns(MathDataWarning):
        openr1 = load("openr1_math", FIX / "openr1.parquet")
    usable = df[df.answer != "proof"]
    for (_, row), p in zip(usable.iterrows(), openr1, strict=True):
        assert math_reward(row.solution, p.answer) == 1.0
        # The dataset's own math_verify flags on its generations agree with our reward.
        rewards = [math_reward(g, p.answer) for g in row.generations]
        assert rewards == [float(c) for c in row.correctness_math_verify]
