"""controller=adaptive through the real command line: a run killed with SIGKILL after a
snapshot and relaunched ends with the same metrics.jsonl as an uninterrupted one (bitwise, as
tests/test_resume.py for fixed runs), for both policies; the knobs really change mid-run; the
run stops when its compute budget is spent, charged step by step as a fixed run is; and the
controller's state is in the snapshot."""

from __future__ import annotations

import json
import sys

import pytest
from test_resume import _kill_after_snapshot_past, _launch

from replay_exp.checkpoint import load_latest
from replay_exp.rollout.synthetic import without_wall_clock
from replay_exp.runlog import read_metrics

pytestmark = pytest.mark.slow

# The fast model, started on-policy (R = N = B = 16), a decision every 2 steps, a budget of 8
# paper units at mu = 3 (on-policy: 8 steps; at R = 4: (16 + 12) / 64 = 0.4375 a step).
CONTROLLED = ["controller=adaptive", "controller.every=2", "buffer.capacity=16",
              "schedule.max_steps=null", "schedule.max_compute=8", "compute.mu=3.0",
              "checkpoint.every=2", "eval.every=4"]  # fmt: skip
POLICIES = {
    # patience 1: a rung up at every calm decision, so the knobs move within the few steps
    "guard": ["controller.guard.patience=1"],
    # few aged rows suffice to estimate alpha at this batch size
    "model": [
        "controller.policy=model",
        "controller.model.min_aged_rows=4",
        "controller.model.bootstrap=20",
    ],  # fmt: skip
    # the same with the lr set from the rows' lag and the hysteresis gate on (their state in
    # the snapshot: the pending target, its count)
    "model_lag_hysteresis": [
        "controller.policy=model",
        "controller.model.min_aged_rows=4",
        "controller.model.bootstrap=20",
        "controller.knobs=[reuse,capacity,lr]",
        "controller.lr_rule=lag",
        "controller.lr_lag_scale=4",
        "controller.model.persist=2",
        "controller.model.min_gain=0.0",
    ],  # fmt: skip
}


def _command(fast, run_dir, policy) -> list[str]:
    return [sys.executable, "-m", "replay_exp.train", *fast, f"run_dir={run_dir}",
            *CONTROLLED, *POLICIES[policy]]  # fmt: skip


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_controlled_run_resumes_bitwise_and_spends_its_budget(policy, fast, tmp_path):
    full, again, killed = tmp_path / "full", tmp_path / "again", tmp_path / "killed"
    for run_dir in (full, again):  # two uninterrupted runs: deterministic
        proc = _launch(_command(fast, run_dir, policy), tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
    want = without_wall_clock(read_metrics(full / "metrics.jsonl"))
    assert without_wall_clock(read_metrics(again / "metrics.jsonl")) == want

    # The knobs changed mid-run, and every decision is logged with its inputs.
    decisions = [r for r in want if "controller/action" in r]
    assert len({r["controller/rollouts_per_step"] for r in want if "controller/rung" in r}) > 1
    assert all("controller/in/kl" in r and "controller/in/budget_left" in r for r in decisions)
    assert "controller at step" in (full / "train.log").read_text()

    # The budget: 8 units spent to within one step, none overrun; the summary's step count is
    # the steps taken (more than the 8 an on-policy run buys: the replay steps are cheaper).
    summary = json.loads((full / "summary.json").read_text())
    units, steps = summary["compute"]["paper_units"], summary["steps"]
    assert 8.0 - 1.0 < units <= 8.0 + 1e-9
    assert steps == want[-1]["step"] > 8

    _kill_after_snapshot_past(_command(fast, killed, policy), tmp_path, killed, step=2)
    snap = load_latest(killed / "checkpoints")
    assert sorted(snap.states["source"]) == ["controller", "generator", "rng", "weight_history"]
    proc = _launch(_command(fast, killed, policy), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming from" in (killed / "train.log").read_text()
    assert without_wall_clock(read_metrics(killed / "metrics.jsonl")) == want
    weights = "final_model/model.safetensors"
    assert (killed / weights).read_bytes() == (full / weights).read_bytes()


def test_a_controller_that_never_moves_trains_and_charges_as_the_fixed_run(fast, tmp_path):
    """controller=adaptive deciding only after the budget is spent (every 1000 steps) keeps
    the run's own R and N: the same training, the same compute charged step by step and the
    same step count (its budget rule against the fixed run's derived steps, on a replay design
    whose step costs (16 + 3 x 8) / 64 = 0.625 units: floor(8 / 0.625) = 12 steps) as
    controller=fixed; only its own keys (controller/*, loss/ess_frac) are added."""
    common = [*fast, "buffer.capacity=64", "schedule.rollouts_per_step=8",
              "schedule.max_steps=null", "schedule.max_compute=8", "compute.mu=3.0",
              "eval.every=4"]  # fmt: skip
    fixed, ctl = tmp_path / "fixed", tmp_path / "ctl"
    for run_dir, extra in ((fixed, []), (ctl, ["controller=adaptive", "controller.every=1000"])):
        cmd = [sys.executable, "-m", "replay_exp.train", *common, f"run_dir={run_dir}", *extra]
        proc = _launch(cmd, tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
    want = without_wall_clock(read_metrics(fixed / "metrics.jsonl"))
    got = [
        {k: v for k, v in r.items() if not k.startswith("controller/") and k != "loss/ess_frac"}
        for r in without_wall_clock(read_metrics(ctl / "metrics.jsonl"))
    ]
    assert got == want
    assert want[-1]["step"] == 12
    assert any("controller/rollouts_per_step" in r for r in read_metrics(ctl / "metrics.jsonl"))


@pytest.mark.parametrize(
    ("policy", "moves"),
    [
        (["controller.guard.patience=1"], "controller/rollouts_per_step"),
        # the model policy with the lag lr rule and the hysteresis gate: its lr moves
        (["controller.policy=model", "controller.model.min_aged_rows=4",
          "controller.model.bootstrap=20", "controller.knobs=[reuse,capacity,lr]",
          "controller.lr_rule=lag", "controller.lr_lag_scale=4", "controller.model.persist=2",
          "controller.model.min_gain=0.0"], "controller/lr_scale"),
    ],
    ids=["guard", "model_lag_hysteresis"],
)  # fmt: skip
def test_a_controlled_run_resumes_bitwise_at_the_default_thread_count(
    policy, moves, default_small, tmp_path
):
    """A policy on the embedded default at its default thread count (where thread order could
    show; tests/conftest.default_overrides), started at y = 2, N = 64: killed after a snapshot
    and relaunched, it ends with the uninterrupted run's metrics."""
    extra = ["controller=adaptive", "controller.every=2", *policy,
             "buffer.capacity=64", "schedule.max_steps=null", "schedule.max_compute=6",
             "compute.mu=3.0", "checkpoint.every=2"]  # fmt: skip
    full, killed = tmp_path / "full", tmp_path / "killed"

    def command(run_dir):
        return [sys.executable, "-m", "replay_exp.train", *default_small, f"run_dir={run_dir}",
                *extra]  # fmt: skip

    proc = _launch(command(full), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = without_wall_clock(read_metrics(full / "metrics.jsonl"))
    assert len({r[moves] for r in want if "controller/rung" in r}) > 1
    _kill_after_snapshot_past(command(killed), tmp_path, killed, step=2)
    proc = _launch(command(killed), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert without_wall_clock(read_metrics(killed / "metrics.jsonl")) == want


def test_under_the_async_schedule_it_sets_n_and_lr_and_resumes_bitwise(fast, tmp_path):
    """schedule=async in process (one generator, one trainer at mu 1: R = B = 16 a step, each
    step 2 / 2 = 1 unit): the controller owns N and the lr; R and the step count (12 units: 12
    steps) are the schedule's. Two runs agree, N moves, and a kill after a snapshot resumes to
    the same metrics."""
    extra = ["schedule=async", "schedule.trainers=1", "schedule.workers=1", "schedule.gpus=null",
             "compute.mu=1.0", "controller=adaptive", "controller.every=2",
             "controller.knobs=[capacity,lr]", "controller.guard.patience=1",
             "buffer.capacity=16", "schedule.max_steps=null", "schedule.max_compute=12",
             "checkpoint.every=2", "eval.every=4"]  # fmt: skip
    full, again, killed = tmp_path / "full", tmp_path / "again", tmp_path / "killed"

    def command(run_dir):
        return [sys.executable, "-m", "replay_exp.train", *fast, f"run_dir={run_dir}", *extra]

    for run_dir in (full, again):
        proc = _launch(command(run_dir), tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
    want = without_wall_clock(read_metrics(full / "metrics.jsonl"))
    assert without_wall_clock(read_metrics(again / "metrics.jsonl")) == want
    knobs = [r for r in want if "controller/rung" in r]
    assert len({r["controller/capacity"] for r in knobs}) > 1
    assert {r["controller/rollouts_per_step"] for r in knobs} == {16.0}
    assert want[-1]["step"] == 12
    _kill_after_snapshot_past(command(killed), tmp_path, killed, step=2)
    assert "controller" in load_latest(killed / "checkpoints").states["source"]
    proc = _launch(command(killed), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert without_wall_clock(read_metrics(killed / "metrics.jsonl")) == want
