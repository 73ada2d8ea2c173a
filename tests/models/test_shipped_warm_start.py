"""The embedded default starts from warm-started weights shipped with the package: the same
bytes on every machine (pinned by their SHA-256), loaded without training, and the README main
command's step-0 pass@1 is the documented number."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.eval.evaluate import evaluate
from replay_exp.models import build_char_tokenizer, build_tokenizer, load_policy
from replay_exp.models.warm_start import (
    SHIPPED_DIR,
    file_sha256,
    recipe_key,
    shipped_warm_start,
)
from replay_exp.rollout import HFGenerator
from replay_exp.tasks import make_task

# python -m replay_exp.models.ship_warm_start prints this when it rebuilds the shipped copy.
SHIPPED_SHA256 = "7f5b698db862405a0b39aa18d3b401f021710899662a82bb70ee58ec4d1eb068"
# Greedy pass@1 of the shipped model on the default held-out split (task.n_eval problems).
STEP0_CORRECT, STEP0_PROBLEMS = 446, 2048
# The second testbed's (testbed=chain_sum): stored in bfloat16 (--dtype bfloat16).
CHAIN_SUM_SHA256 = "de5368d6d534225d40fb2372efeb525ae6fc97d6269bafb95b75b268e48b1a9f"
CHAIN_SUM_STEP0_CORRECT = 488
TESTBED_DOC = Path(__file__).parents[2] / "docs" / "testbed.md"
README = Path(__file__).parents[2] / "README.md"


def test_the_shipped_weights_are_the_pinned_bytes():
    cfg = compose([])
    path = shipped_warm_start(cfg.model, cfg.task, build_char_tokenizer())
    assert path is not None and path.parent == SHIPPED_DIR
    assert file_sha256(path / "model.safetensors") == SHIPPED_SHA256
    second = compose(["testbed=chain_sum"])
    other = shipped_warm_start(second.model, second.task, build_tokenizer("chain_sum_bpe"))
    assert other is not None and file_sha256(other / "model.safetensors") == CHAIN_SUM_SHA256
    shipped = {p.name for p in SHIPPED_DIR.iterdir() if not p.name.startswith(".")}
    assert shipped == {path.name, other.name}


def test_the_default_loads_the_shipped_copy_without_training(tmp_path):
    cfg = compose([f"model.warm_start.cache_dir={tmp_path}"])
    _, _, source = load_policy(cfg.model, cfg.task, make_task(cfg.task))
    assert Path(source).parent == SHIPPED_DIR
    assert not any(tmp_path.iterdir())  # nothing trained, nothing cached


def test_the_recipe_ignores_what_does_not_change_the_weights():
    tok = build_char_tokenizer()
    base = compose([])
    key = recipe_key(base.model, base.task, tok)
    for same in (["task.n_eval=256"], ["model.warm_start.cache_dir=/elsewhere"],
                 ["model.name=other"], ["model.warm_start.shipped=false"]):  # fmt: skip
        cfg = compose(same)
        assert recipe_key(cfg.model, cfg.task, tok) == key, same
    for different in (["task.demo_carry_drop=0.5"], ["model.warm_start.steps=700"],
                      ["task.split_seed=1"], ["model.hidden_size=64"]):  # fmt: skip
        cfg = compose(different)
        assert recipe_key(cfg.model, cfg.task, tok) != key, different
        assert shipped_warm_start(cfg.model, cfg.task, tok) is None


def test_shipped_false_ignores_the_shipped_copy():
    cfg = compose(["model.warm_start.shipped=false"])
    assert shipped_warm_start(cfg.model, cfg.task, build_char_tokenizer()) is None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "correct", "doc", "pattern"),
    [
        ([], STEP0_CORRECT, README, r"step 0 \| pass@1 {}"),
        (
            ["testbed=chain_sum"],
            CHAIN_SUM_STEP0_CORRECT,
            TESTBED_DOC,
            r"Step-0 greedy pass@1 of the shipped copy: \*\*{}\*\*",
        ),
    ],  # fmt: skip
    ids=["embedded", "chain_sum"],
)
def test_step0_pass1_is_the_documented_number(overrides, correct, doc, pattern):
    cfg, d = resolve(compose(overrides))
    torch.set_num_threads(d.threads)
    task = make_task(cfg.task)
    policy, tok, _ = load_policy(cfg.model, cfg.task, task)
    problems = task.eval_problems()
    assert len(problems) == STEP0_PROBLEMS
    evaluator = HFGenerator(policy, tok.pad_token_id, tok.eos_token_id)
    out, details = evaluate(evaluator, policy, tok, task, problems, cfg.eval, d.max_new_tokens, 0)
    assert int(details["pass1"].sum()) == correct
    documented = f"{correct / STEP0_PROBLEMS:.3f}"
    assert re.search(pattern.format(re.escape(documented)), doc.read_text()), documented


def test_the_second_testbed_loads_its_shipped_copy_without_training(tmp_path):
    cfg = compose(["testbed=chain_sum", f"model.warm_start.cache_dir={tmp_path}"])
    policy, tok, source = load_policy(cfg.model, cfg.task, make_task(cfg.task))
    assert Path(source).parent == SHIPPED_DIR and not any(tmp_path.iterdir())
    assert type(policy).__name__ == "Qwen2ForCausalLM" and len(tok) == 305
    assert next(policy.parameters()).dtype == torch.float32  # stored bf16, loaded as float32
