"""task=gsm8k | math | openr1_math: splits, held-out sources, rewards, prompt fitting, errors."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.config.errors import ConfigError
from replay_exp.tasks import TASKS, make_task
from replay_exp.tasks.math_data import REQUIRED_FIELDS, MathDataWarning
from replay_exp.tasks.math_task import MATH_TASKS, MathTask, _load

FIX = Path(__file__).parents[1] / "fixtures" / "math"
GSM8K, MATH500, OPENR1 = FIX / "gsm8k.jsonl", FIX / "math500.jsonl", FIX / "openr1.parquet"


def test_registry_covers_every_math_format():
    assert set(MATH_TASKS) == set(REQUIRED_FIELDS)
    assert all(TASKS[name] is MathTask for name in MATH_TASKS)


def test_held_out_split_from_the_training_file():
    task = MathTask("gsm8k", path=str(GSM8K), n_eval=2)
    train, held = task._train, task.eval_problems()
    assert (len(train), len(held)) == (4, 2)
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    # Prompts are rendered with the default template; references are the numbers after ####.
    assert all(p.prompt.endswith("put your final answer within \\boxed{}.") for p in train)
    assert {p.answer for p in train + held} >= {"216"}
    # The same config gives the same split; another seed another one.
    again = MathTask("gsm8k", path=str(GSM8K), n_eval=2)
    assert again.eval_problems() == held
    assert task.eval_source == "2 held out of the training data (seed 0)"


def test_separate_eval_file_in_another_format():
    task = MathTask("gsm8k", path=str(GSM8K), eval_dataset="math", eval_path=str(MATH500))
    assert len(task.eval_problems()) == 7 and task.n_train == 6  # n_eval is not used
    assert task.eval_source == str(MATH500)


def test_training_problems_also_held_out_are_dropped():
    # Held out = the training file itself: every training problem is held out, none is left.
    with pytest.raises(ConfigError, match=r"0 training and 7 held-out problems left"):
        MathTask("math", path=str(MATH500), eval_path=str(MATH500))


def test_openr1_parquet_skips_proofs_and_uses_answers():
    _load.cache_clear()  # the warning comes with a load; an earlier test may have cached this one
    with pytest.warns(MathDataWarning, match="skipped 1 row"):
        task = MathTask("openr1_math", path=str(OPENR1), n_eval=1)
    assert task.n_train + len(task.eval_problems()) == 5


def test_rewards_verify_the_final_answer():
    task = MathTask("gsm8k", path=str(GSM8K), n_eval=1, template="plain")
    p = next(p for p in task._train + task.eval_problems() if p.answer == "216")
    assert task.reward(p, "So it made $216. The answer is \\boxed{216}.", finished=True) == 1.0
    assert task.reward(p, "#### 216", finished=False) == 1.0  # scored even without EOS
    assert task.reward(p, "The answer is \\boxed{215}.", finished=True) == 0.0
    assert task.reward(p, "I do not know.", finished=True) == 0.0


def test_sample_train_is_seeded_and_distinct():
    task = MathTask("gsm8k", path=str(GSM8K), n_eval=2)
    a = task.sample_train(np.random.default_rng(3), 4)
    assert a == task.sample_train(np.random.default_rng(3), 4)
    assert len({p.prompt for p in a}) == 4  # all four training problems, no repeat
    assert len(task.sample_train(np.random.default_rng(3), 9)) == 9  # repeats only when needed


def test_fit_prompts_drops_long_prompts_and_refuses_to_drop_everything():
    task = MathTask("gsm8k", path=str(GSM8K), n_eval=2, template="plain")
    lengths = {p.prompt: len(p.prompt) for p in task._train + task.eval_problems()}
    limit = sorted(lengths.values())[-2]  # drops the longest prompt only

    def measure(texts):
        return [lengths[t] for t in texts]

    with pytest.warns(MathDataWarning, match="dropped"):
        assert task.fit_prompts(measure, limit) == 1
    assert max(len(p.prompt) for p in task._train + task.eval_problems()) <= limit
    assert task.max_prompt_chars <= limit
    with pytest.raises(ValueError, match="task.max_prompt_tokens=1"):
        task.fit_prompts(measure, 1)


def test_template_string_with_question_placeholder():
    task = MathTask("gsm8k", path=str(GSM8K), n_eval=1, template="Q: {question}\nA:")
    assert all(p.prompt.startswith("Q: ") and p.prompt.endswith("\nA:") for p in task._train)


def test_hub_failure_names_the_key_and_the_fix(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ConfigError) as err:
        MathTask("gsm8k", hub_id="openai/gsm8k-test-only", split="train")
    msg = str(err.value)
    assert msg.startswith("task.hub_id=openai/gsm8k-test-only: ") and "\n" not in msg
    assert "offline?" in msg and "pass task.path=<local" in msg


def test_compose_resolve_with_a_local_model_and_file(tiny_hub_dir):
    cfg, d = resolve(
        compose([f"model={tiny_hub_dir}", "task=gsm8k", f"task.path={GSM8K}", "task.n_eval=2"])
    )
    assert cfg.model.pretrained == str(tiny_hub_dir) and cfg.model.name == "tiny-qwen2"
    assert (d.max_prompt_len, d.max_new_tokens) == (512, 512)  # task.max_*_tokens of gsm8k.yaml
    assert isinstance(make_task(cfg.task), MathTask)
    # The local model's context bounds prompt + response.
    with pytest.raises(ConfigError) as err:
        resolve(
            compose(
                [f"model={tiny_hub_dir}", "task=gsm8k", f"task.path={GSM8K}", "task.n_eval=2",
                 "task.max_prompt_tokens=2000"]
            )
        )  # fmt: skip
    assert str(err.value) == (
        f"max_position_embeddings of model.pretrained={tiny_hub_dir} = 2048 < prompt 2000 + "
        "generation.max_new_tokens=512 tokens"
    )


def test_the_documented_gpu_command_composes():
    """`model=qwen3_0_6b task=openr1_math generation=vllm` composes here; resolving it needs
    the hub (dataset) and vLLM, neither of which this machine has: one clear line."""
    cfg = compose(["model=qwen3_0_6b", "task=openr1_math", "generation=vllm"])
    assert cfg.model.pretrained == "Qwen/Qwen3-0.6B" and cfg.model.tie_word_embeddings is False
    assert cfg.task.name == "openr1_math" and cfg.task.eval_hub_id == "HuggingFaceH4/MATH-500"
    assert cfg.generation.backend == "vllm"
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(ConfigError, match=r"^generation.backend=vllm needs the vllm"):
                resolve(cfg)
