"""End-to-end training on a tiny model: parameters move, metrics are complete and
deterministic, and the on-policy preset trains exactly like a loop without a buffer."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.config.seeding import derive_seed
from replay_exp.eval.evaluate import decode_details
from replay_exp.models import load_policy, load_pretrained
from replay_exp.rollout import HFGenerator, SamplingParams
from replay_exp.rollout.collect import generate_rollouts
from replay_exp.rollout.synthetic import without_wall_clock
from replay_exp.runlog import read_metrics
from replay_exp.tasks import make_task
from replay_exp.train import run
from replay_exp.update import policy_update


def _run(overrides: list[str], run_dir):
    cfg, derived = resolve(compose([*overrides, f"run_dir={run_dir}"]))
    return run(cfg, derived, run_dir), cfg, derived


def test_two_steps_change_parameters_and_log_expected_keys(fast, tmp_path):
    summary, cfg, d = _run([*fast, "schedule.max_steps=2"], tmp_path / "run")
    run_dir = tmp_path / "run"
    assert {p.name for p in run_dir.iterdir()} >= {
        "config.yaml", "metrics.jsonl", "summary.json", "train.log", "final_model",
    }  # fmt: skip
    rewards = [r["train/reward"] for r in read_metrics(run_dir / "metrics.jsonl") if r["step"]]
    assert any(0 < x < 1 for x in rewards), f"no learning signal in this setup: {rewards}"
    initial, _, _ = load_policy(cfg.model, cfg.task, make_task(cfg.task))
    final, _ = load_pretrained(run_dir / "final_model")
    moved = [
        n for (n, p0), p1 in zip(initial.named_parameters(), final.parameters(), strict=True)
        if not torch.equal(p0, p1)
    ]  # fmt: skip
    assert moved, "no parameter changed after 2 updates"

    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    expected = {
        "train/reward", "loss/loss", "loss/clip_frac", "loss/approx_kl", "loss/ratio_mean",
        "loss/ratio_max", "loss/entropy", "loss/grad_norm", "buffer/size", "buffer/uses_mean",
        "buffer/batch_age_max", "compute/paper_units", "compute/rollouts", "compute/flops_gen",
        "compute/flops_train", "compute/seconds_gen", "compute/seconds_train",
        "compute/seconds_eval", "compute/measured_mu", "eval/pass@1", "eval/pass@4_sampled",
        "eval/entropy", "policy/version",
    }  # fmt: skip
    assert expected <= set(rows[2]), expected - set(rows[2])
    diag = {"diag/update_kl", "diag/ess_frac", "diag/kl", "diag/clip_frac", "diag/lag0/kl",
            "diag/lag1-3/token_frac", "diag/lag16+/kl"}  # fmt: skip
    assert diag <= set(rows[2]) and "diag/seconds" not in rows[2]
    assert rows[1]["diag/update_kl"] > 0  # an update moves the policy, even on fresh data
    # Per-problem results of each evaluation, matching the logged pass@1.
    details = [json.loads(line) for line in (run_dir / "eval_details.jsonl").open()]
    assert [d["step"] for d in details] == [0, 2]  # eval.every=2
    for d, r in zip(details, [rows[0], rows[2]], strict=True):
        assert decode_details(d)["pass1"].mean() == pytest.approx(r["eval/pass@1"])
    # Paper units: fifo with R = B = 16, mu = 1 -> (16 + 16) / (16 * 2) = 1 unit per step.
    assert rows[2]["compute/paper_units"] == pytest.approx(2.0)
    assert rows[2]["compute/rollouts"] == 32
    assert summary["status"] == "finished"
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2


def test_same_config_and_seed_give_identical_metrics(fast, tmp_path):
    over = [*fast, "schedule.max_steps=3", "schedule.rollouts_per_step=8", "seed=3"]
    _run(over, tmp_path / "a")
    _run(over, tmp_path / "b")
    a = without_wall_clock(read_metrics(tmp_path / "a" / "metrics.jsonl"))
    b = without_wall_clock(read_metrics(tmp_path / "b" / "metrics.jsonl"))
    assert a == b
    _run([*over[:-1], "seed=4"], tmp_path / "c")  # and the seed matters
    assert without_wall_clock(read_metrics(tmp_path / "c" / "metrics.jsonl")) != a


def test_default_thread_count_is_deterministic(default_small, tmp_path):
    """The embedded default at its default thread count (all cores): two runs, the same
    metrics. Before the shared-prompt broadcast used index_select, the backward of a replay
    batch summed rows in a thread-dependent order and these differed from step 1 on."""
    over = [*default_small, "schedule.max_steps=6", "seed=7"]
    _, _, d = _run(over, tmp_path / "a")
    assert d.threads == (os.cpu_count() or 1)
    _run(over, tmp_path / "b")
    a = without_wall_clock(read_metrics(tmp_path / "a" / "metrics.jsonl"))
    b = without_wall_clock(read_metrics(tmp_path / "b" / "metrics.jsonl"))
    assert len(a) == 7 and a == b
    weights = "final_model/model.safetensors"
    assert (tmp_path / "a" / weights).read_bytes() == (tmp_path / "b" / weights).read_bytes()


def test_on_policy_preset_trains_exactly_like_a_loop_without_buffer(fast, tmp_path):
    steps = 3
    _, cfg, d = _run([*fast, "buffer=on_policy", f"schedule.max_steps={steps}"], tmp_path / "run")
    trained, _ = load_pretrained(tmp_path / "run" / "final_model")

    # The reference: generate -> update on exactly those rollouts; no buffer anywhere.
    task = make_task(cfg.task)
    policy, tok, _ = load_policy(cfg.model, cfg.task, task)
    torch.set_num_threads(d.threads)
    a = cfg.algo
    opt = torch.optim.AdamW(policy.parameters(), lr=a.lr, betas=tuple(a.betas), weight_decay=0)
    gen = HFGenerator(policy, tok.pad_token_id, tok.eos_token_id)
    params = SamplingParams(cfg.generation.temperature, cfg.generation.top_p, d.max_new_tokens)
    for step in range(steps):
        prompts = task.sample_train(
            np.random.default_rng(derive_seed(cfg.seed, "prompts", step)), d.prompts_per_step
        )
        fresh = generate_rollouts(
            gen, tok, task, prompts, a.group_size, params, derive_seed(cfg.seed, "gen", step),
            step, step * d.rollouts_per_step, step * d.prompts_per_step,
        )  # fmt: skip
        policy_update(policy, opt, fresh.trimmed(), a, cfg.generation.temperature, d.max_new_tokens)

    for (name, p_ref), p_run in zip(policy.named_parameters(), trained.parameters(), strict=True):
        assert torch.equal(p_ref, p_run), name


def test_sync_every_k_generates_from_stale_weights(fast, tmp_path):
    _run([*fast, "schedule.max_steps=4", "schedule.sync_every=2"], tmp_path / "run")
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["step"] > 0]
    # Weights are copied at steps 0 and 2, so rollouts of steps 0..3 come from versions 0,0,2,2.
    assert [r["policy/generator_version"] for r in rows] == [0, 0, 2, 2]
    assert [r["buffer/batch_version_lag_max"] for r in rows][1] == 1


def test_compute_grid_evaluates_every_arm_at_the_same_x(fast, tmp_path):
    """eval.unit=compute: an on-policy step costs 1 unit and a y = 4 replay step about
    (1 + 6.84 / 4) / 7.84 = 0.346 (less while its buffer holds fewer than B rollouts), yet both
    are evaluated at the start, at the first step that reaches 2 units and at their end (4
    units), equally often; diagnostics off drops diag/*."""
    grid = ["compute.mu=6.84", "schedule.max_steps=null", "schedule.max_compute=4",
            "eval.unit=compute", "eval.every=2", "logger.diagnostics=false"]  # fmt: skip
    evals = {}
    for name, arm in (("on_policy", ["buffer=on_policy"]), ("replay", ["schedule.reuse_ratio=4"])):
        _run([*fast, *grid, *arm], tmp_path / name)
        rows = read_metrics(tmp_path / name / "metrics.jsonl")
        assert not any(k.startswith("diag/") for r in rows for k in r)
        x = [r["compute/paper_units"] for r in rows]  # one row per step (log_every=1)
        crossed = [i for i in range(1, len(x)) if x[i - 1] < 2 <= x[i]]
        want = [0, *crossed, len(x) - 1]
        assert [i for i, r in enumerate(rows) if "eval/pass@1" in r] == want, name
        evals[name] = [x[i] for i in want]
    assert evals["on_policy"] == pytest.approx([0, 2, 4])
    assert evals["replay"][0] == 0 and 2 <= evals["replay"][1] < 2 + 0.35
    assert 3.5 < evals["replay"][2] <= 4  # the budget buys whole steps at the full cost


def test_diagnostics_do_not_change_training(fast, tmp_path):
    """logger.diagnostics=false (what the 3000-unit studies set: the per-step no-grad forward
    was ~1/5 of their wall time, uncharged) drops diag/* and nothing else: every other metric
    of every row, evaluations included, is the same number (wall-clock keys aside)."""
    rows = {}
    for on in (True, False):
        run_dir = tmp_path / f"diag_{on}"
        _run([*fast, "schedule.max_steps=6", "schedule.reuse_ratio=2", "eval.every=3",
              f"logger.diagnostics={str(on).lower()}"], run_dir)  # fmt: skip
        rows[on] = without_wall_clock(read_metrics(run_dir / "metrics.jsonl"))
    with_diag = [{k: v for k, v in r.items() if not k.startswith("diag/")} for r in rows[True]]
    assert any(k.startswith("diag/") for r in rows[True] for k in r)
    assert with_diag == rows[False]
