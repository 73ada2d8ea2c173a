"""task=reasoning_gym: datasets, the disjoint split, the dataset's scorer, answer extraction,
prompt fitting, and the one-line errors of bad names and params."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from replay_exp.config.errors import ConfigError
from replay_exp.tasks import TASKS, make_task
from replay_exp.tasks.gym_task import GymDataWarning, ReasoningGymTask

# Three datasets of different families (and countdown, whose items are slow to generate:
# 8 of them). For each: a right and a wrong answer to its first held-out problem.
DATASETS = {
    "chain_sum": {"min_terms": 3, "max_terms": 4, "min_digits": 1, "max_digits": 2},
    "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
    "gsm_symbolic": {},
    "countdown": {},
}


@pytest.mark.parametrize("name", DATASETS)
def test_each_dataset_builds_scores_and_keeps_its_held_out_list(name):
    n_eval = 8 if name == "countdown" else 64
    task = ReasoningGymTask(name, params=DATASETS[name], n_eval=n_eval, n_train=1000)
    held = task.eval_problems()
    assert len(held) == n_eval
    again = ReasoningGymTask(name, params=DATASETS[name], n_eval=n_eval, n_train=1000)
    assert [p.prompt for p in again.eval_problems()] == [p.prompt for p in held]
    first = held[0]
    # The reference answer scores 1 through the dataset's own score_answer (countdown's
    # reference is an expression, e.g. "94*4 - 61 - 6", that it evaluates).
    assert task.reward(first, f"  {first.answer}\n", finished=True) == 1.0
    assert task.reward(first, "no answer here", finished=True) < 0.5
    # extract=completion: a completion without EOS was cut by the budget, it scores 0.
    assert task.reward(first, first.answer, finished=False) == 0.0
    train = task.sample_train(np.random.default_rng(0), 16)
    assert all(task.reward(p, p.answer, finished=True) == 1.0 for p in train)


def test_training_draws_never_hit_the_held_out_split():
    """chain_sum with two 1-digit terms has 10 x 10 x 2 = 200 questions: 100 held-out items
    cover a large part of it, and training items of the other seed repeat those questions
    often; every one is redrawn."""
    task = ReasoningGymTask(
        "chain_sum", params={"min_terms": 2, "max_terms": 2, "max_digits": 1}, n_eval=100
    )
    held = {p.prompt for p in task.eval_problems()}
    assert 40 < len(held) <= 100  # the held-out list itself repeats questions
    train = task.sample_train(np.random.default_rng(1), 2000)
    assert not held & {p.prompt for p in train}
    # the same RNG gives the same draws
    again = task.sample_train(np.random.default_rng(1), 2000)
    assert [p.prompt for p in again] == [p.prompt for p in train]


def test_template_and_extract_modes():
    params = {"min_terms": 2, "max_terms": 2, "max_digits": 1}
    task = ReasoningGymTask("chain_sum", params=params, n_eval=4, template="Q: {question}\nA:")
    p = task.eval_problems()[0]
    assert p.prompt.startswith("Q: State the final answer") and p.prompt.endswith("=\nA:")
    final = ReasoningGymTask("chain_sum", params=params, n_eval=4, extract="final")
    q = final.eval_problems()[0]
    # the last number, finished or not
    assert final.reward(q, f"Let me add. The answer is {q.answer}.", finished=False) == 1.0
    tag = ReasoningGymTask("chain_sum", params=params, n_eval=4, extract="answer_tag")
    r = tag.eval_problems()[0]
    assert tag.reward(r, f"<think>easy</think><answer>{r.answer}</answer>", True) == 1.0
    assert tag.reward(r, r.answer, True) == 0.0  # no tags, no answer
    mv = ReasoningGymTask("chain_sum", params=params, n_eval=4, extract="final",
                          reward="math_verify")  # fmt: skip
    s = mv.eval_problems()[0]
    assert mv.reward(s, f"so {s.answer}.0", True) == 1.0  # 5.0 is equivalent to 5


def test_partial_credit_only_when_asked():
    """chain_sum's scorer pays len(reference) / len(answer) for an answer containing the
    reference: "-12" for "12" gets 2/3; binary by default, passed through on request."""
    params = {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2}
    binary = ReasoningGymTask("chain_sum", params=params, n_eval=64)
    p = next(q for q in binary.eval_problems() if not q.answer.startswith("-") and q.answer != "0")
    wrong_sign = "-" + p.answer
    assert binary.reward(p, wrong_sign, True) == 0.0
    partial = ReasoningGymTask("chain_sum", params=params, n_eval=64, partial_credit=True)
    assert partial.reward(p, wrong_sign, True) == pytest.approx(len(p.answer) / len(wrong_sign))
    assert partial.reward(p, p.answer, True) == binary.reward(p, p.answer, True) == 1.0


def test_fit_prompts_drops_long_held_out_problems_and_redraws_long_training_ones():
    task = ReasoningGymTask("chain_sum", params={"min_terms": 2, "max_terms": 4}, n_eval=50)
    n_terms = {p.prompt: p.prompt.count(" + ") + p.prompt.count(" - ") + 1
               for p in task.eval_problems()}  # fmt: skip
    # a "tokenizer" that counts terms: only two-term prompts fit a budget of 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dropped = task.fit_prompts(lambda ps: [ps_.count(" + ") + ps_.count(" - ") + 1
                                               for ps_ in ps], 2)  # fmt: skip
    assert dropped == sum(n > 2 for n in n_terms.values()) > 0
    assert any(issubclass(w.category, GymDataWarning) for w in caught)
    assert all(n_terms[p.prompt] == 2 for p in task.eval_problems())
    train = task.sample_train(np.random.default_rng(0), 30)
    assert all(p.prompt.count(" + ") + p.prompt.count(" - ") == 1 for p in train)
    assert task.dropped_train > 0


def test_registry_and_config_node():
    assert TASKS["reasoning_gym"] is ReasoningGymTask
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({
        "name": "reasoning_gym", "dataset": "chain_sum", "params": None, "n_eval": 4,
        "n_train": 100, "split_seed": 3, "template": "{question}", "extract": "completion",
        "reward": "score_answer", "partial_credit": False, "max_prompt_tokens": 64,
        "max_response_tokens": 8,
    })  # fmt: skip
    task = make_task(cfg)
    assert isinstance(task, ReasoningGymTask) and task.params == {}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dataset": "nope_dataset"}, "task.dataset=nope_dataset is not a reasoning-gym dataset"),
        ({"dataset": "chain_sum", "params": {"max_digits": 0}}, "is invalid: "),
        ({"dataset": "chain_sum", "reward": "exact"}, "task.reward=exact is unknown"),
        ({"dataset": "chain_sum", "template": "no field"}, "must contain {question}"),
        ({"dataset": "chain_sum", "n_eval": 0}, "task.n_eval=0 must be >= 1"),
    ],
)
def test_bad_input_is_one_line(kwargs, message):
    with pytest.raises(ConfigError) as err:
        ReasoningGymTask(**kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)
