"""The embedded task: deterministic disjoint split, exact reward parsing, demonstrations."""

from __future__ import annotations

import numpy as np
import pytest

from replay_exp.config.errors import ConfigError
from replay_exp.tasks import Problem, make_task
from replay_exp.tasks.arithmetic import ArithmeticTask, _add_without_carry


def test_split_is_deterministic_and_disjoint():
    a, b = ArithmeticTask(split_seed=1), ArithmeticTask(split_seed=1)
    assert a.eval_problems() == b.eval_problems()
    assert ArithmeticTask(split_seed=2).eval_problems() != a.eval_problems()
    held_out = {p.prompt for p in a.eval_problems()}
    assert len(held_out) == 256  # no duplicates in the held-out list
    train = a.sample_train(np.random.default_rng(0), 20_000)
    assert not held_out & {p.prompt for p in train}
    # Same rng seed -> same training problems.
    assert a.sample_train(np.random.default_rng(5), 10) == a.sample_train(
        np.random.default_rng(5), 10
    )


@pytest.mark.parametrize(
    ("completion", "finished", "reward"),
    [
        ("579", True, 1.0),
        (" 579 ", True, 1.0),  # surrounding whitespace is stripped
        ("0579", True, 1.0),  # compared as integers: leading zeros are accepted
        ("579", False, 0.0),  # no EOS within the budget: truncated, scores 0
        ("578", True, 0.0),
        ("57 9", True, 0.0),  # inner whitespace is not an integer
        ("579+", True, 0.0),
        ("", True, 0.0),
        ("-579", True, 0.0),
    ],
)
def test_reward_parsing_rules(completion, finished, reward):
    task = ArithmeticTask()
    assert task.reward(Problem("123+456=", "579"), completion, finished) == reward


def test_negative_answers_parse():
    task = ArithmeticTask(operations=("-",))
    assert task.reward(Problem("12-345=", "-333"), "-333", True) == 1.0


def test_lengths_cover_every_answer():
    for ops in [("+",), ("-",), ("*",), ("+", "-", "*")]:
        task = ArithmeticTask(n_digits=2, operations=ops, n_eval=8, eval_fraction=0.05)
        problems = task.sample_train(np.random.default_rng(0), 2000) + task.eval_problems()
        assert max(len(p.prompt) for p in problems) <= task.max_prompt_chars
        assert max(len(p.answer) for p in problems) <= task.max_answer_chars


def test_carry_dropping_demonstrations():
    # 478 + 256: units 8+6=14 -> 4, tens 7+5(+0)=12 -> 2, hundreds 4+2=6 -> 624 (true: 734).
    assert _add_without_carry(478, 256) == 624
    assert _add_without_carry(999, 1) == 990
    task = ArithmeticTask(demo_carry_drop=1.0)
    p = Problem("478+256=", "734")
    assert task.demonstration(p, np.random.default_rng(0)) == "624"
    assert ArithmeticTask().demonstration(p, np.random.default_rng(0)) == "734"
    rng = np.random.default_rng(0)
    half = ArithmeticTask(demo_carry_drop=0.5)
    dropped = sum(half.demonstration(p, rng) == "624" for _ in range(2000))
    assert 900 < dropped < 1100


def test_bad_settings_raise_config_errors():
    with pytest.raises(ConfigError, match=r"task.n_eval=500 must be in \[1, 50\]"):
        ArithmeticTask(n_digits=2, n_eval=500)
    with pytest.raises(ConfigError, match="task.demo_carry_drop=2"):
        ArithmeticTask(demo_carry_drop=2)


def test_make_task_from_config_node():
    from omegaconf import OmegaConf

    node = OmegaConf.create({"name": "arithmetic", "n_digits": 2, "operations": ["*"],
                             "n_eval": 4, "eval_fraction": 0.05, "split_seed": 0,
                             "demo_carry_drop": 0.0})  # fmt: skip
    task = make_task(node)
    assert isinstance(task, ArithmeticTask) and task.ops == ["*"] and task.max_answer_chars == 4
