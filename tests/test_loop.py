"""The loop's warning when the response budget cuts most rollouts off before EOS (the silent
zero-reward case), in both runtimes."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.loop import truncated_fraction, warn_if_truncated
from replay_exp.runtime.base import Arrival
from replay_exp.train import run
from replay_exp.types import RolloutBatch

EOS, PAD = 2, 0


def _batch(completions: list[list[int]]) -> RolloutBatch:
    """Rollouts whose completions are ``completions`` (EOS included where emitted)."""
    B, C = len(completions), max(len(c) for c in completions)
    ids = torch.full((B, C), PAD)
    mask = torch.zeros(B, C, dtype=torch.bool)
    for i, c in enumerate(completions):
        ids[i, : len(c)], mask[i, : len(c)] = torch.tensor(c), True
    z, zl = torch.zeros(B), torch.zeros(B, dtype=torch.long)
    return RolloutBatch(
        prompt_ids_BxP=torch.ones(B, 2, dtype=torch.long),
        prompt_mask_BxP=torch.ones(B, 2, dtype=torch.bool),
        completion_ids_BxC=ids, completion_mask_BxC=mask, behaviour_logp_BxC=torch.zeros(B, C),
        reward_B=z, advantage_B=z, version_B=zl, created_step_B=zl, group_id_B=zl,
        uid_B=torch.arange(B), group_reward_B=z, engine_gap_BxC=torch.zeros(B, C),
    )  # fmt: skip


def test_truncated_fraction_counts_full_budget_rows_without_eos():
    # Budget 3: [5, 6, 7] is cut off; [5, 6, EOS] used the whole budget but finished;
    # [5, EOS] finished early; [9, 9, 9] cut off -> 2 of 4.
    b = _batch([[5, 6, 7], [5, 6, EOS], [5, EOS], [9, 9, 9]])
    assert truncated_fraction(b, 3, EOS) == 0.5
    assert truncated_fraction(b, 4, EOS) == 0.0  # nothing reached a budget of 4


def _parts(budget: int) -> SimpleNamespace:
    tok = SimpleNamespace(eos_token_id=EOS)
    return SimpleNamespace(
        truncation_warned=False, lead=True, response_budget=budget,
        built=SimpleNamespace(tokenizer=tok),
    )  # fmt: skip


def test_warns_once_when_most_rollouts_are_cut_off(caplog):
    p = _parts(budget=3)
    half = Arrival(_batch([[5, 6, 7], [5, EOS]]), 0.0)  # 1 of 2 cut off: not most
    cut = Arrival(_batch([[5, 6, 7], [1, 1, 1], [4, EOS]]), 0.0)  # 2 of 3
    with caplog.at_level(logging.WARNING, logger="replay_exp"):
        warn_if_truncated(p, [half], step=0)
        assert not caplog.records
        warn_if_truncated(p, [cut, half], step=1)  # 3 of 5 = 60 %
        warn_if_truncated(p, [cut], step=2)  # once per run
    (record,) = caplog.records
    assert record.getMessage() == (
        "step 1: 60% of 5 fresh completions hit the response budget of 3 tokens without EOS "
        "(their answers may be cut off and score 0): raise generation.max_new_tokens (or "
        "task.max_response_tokens when it is null)"
    )
    assert "\n" not in record.getMessage()


def test_only_the_lead_warns(caplog):
    p = _parts(budget=3)
    p.lead = False
    with caplog.at_level(logging.WARNING, logger="replay_exp"):
        warn_if_truncated(p, [Arrival(_batch([[5, 6, 7]]), 0.0)], step=0)
    assert not caplog.records


WARNING = "fresh completions hit the response budget of 1 tokens without EOS"


def test_a_run_whose_budget_cuts_every_answer_warns_in_its_log(fast, tmp_path):
    # The 1-digit addition's answers are "d<eos>" or "dd<eos>": one token never holds them.
    overrides = [*fast, "schedule.max_steps=2", "generation.max_new_tokens=1",
                 f"run_dir={tmp_path / 'run'}"]  # fmt: skip
    cfg, d = resolve(compose(overrides))
    run(cfg, d, tmp_path / "run")
    lines = [x for x in (tmp_path / "run" / "train.log").read_text().splitlines() if WARNING in x]
    assert len(lines) == 1 and "step 0: 100% of " in lines[0], lines


def test_a_run_with_room_for_its_answers_does_not_warn(fast, tmp_path):
    cfg, d = resolve(compose([*fast, "schedule.max_steps=1", f"run_dir={tmp_path / 'run'}"]))
    run(cfg, d, tmp_path / "run")
    assert "response budget" not in (tmp_path / "run" / "train.log").read_text()


@pytest.mark.slow
def test_the_distributed_runtime_warns_too(fast, tmp_path):
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "replay_exp.train", *fast, f"run_dir={run_dir}",
        "runtime=distributed", "schedule=async", "schedule.gpus=null", "schedule.workers=1",
        "schedule.trainers=1", "buffer.shards=1", "schedule.max_steps=2", "eval.every=2",
        "generation.max_new_tokens=1",
    ]  # fmt: skip
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [x for x in (run_dir / "train.log").read_text().splitlines() if WARNING in x]
    assert len(lines) == 1, lines
