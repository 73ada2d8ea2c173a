"""A generation cost that changes mid-run (``compute.mu_schedule``): the cost model's rule
(replay_exp/compute/costmodel.py), what the ledger charges, the steps a budget buys
(config/derive.py), what resolve() refuses, and a real run through the command line whose rows
show the change (the controller's reading of it: tests/control/test_controller.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from replay_exp.compute import costmodel
from replay_exp.compute.ledger import Ledger
from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.config.errors import ConfigError
from replay_exp.runlog import read_metrics

SCHEDULE = [[3, 17.6]]  # mu 2 (compute.mu) for the first 3 units, 17.6 from there


def test_mu_in_force_switches_at_the_units_reached():
    assert costmodel.mu_in_force(2.0, None, 1e6) == 2.0
    assert costmodel.mu_in_force(2.0, SCHEDULE, 2.999) == 2.0
    assert costmodel.mu_in_force(2.0, SCHEDULE, 3.0) == 17.6  # reached (to 1e-9): in force
    assert costmodel.mu_in_force(2.0, SCHEDULE, 3.0 - 1e-12) == 17.6
    # Two changes, up then back down.
    two = [[3, 17.6], [5, 4.0]]
    assert [costmodel.mu_in_force(2.0, two, u) for u in (0, 3, 4.9, 5, 99)] == [
        2.0, 17.6, 17.6, 4.0, 4.0,
    ]  # fmt: skip
    assert costmodel.as_schedule([[3, 17.6]]) == ((3.0, 17.6),)
    assert costmodel.as_schedule(None) is None and costmodel.as_schedule([]) is None


def test_scheduled_steps_hand_checked():
    # B = 64, R = 16, mu 2: (64 + 2 x 16) / (64 x 3) = 0.5 a step until 3 units (6 steps),
    # then (64 + 17.6 x 16) / 192 = 345.6 / 192 = 1.8: 3 + 1.8 = 4.8 <= 6, 6.6 > 6: 7 steps.
    assert costmodel.scheduled_steps(64, 16, 2.0, SCHEDULE, 6) == 7
    # On-policy (R = B): 1 a step, then (1 + 17.6) / 3 = 6.2: 3 steps, and 3 + 6.2 > 6.
    assert costmodel.scheduled_steps(64, 64, 2.0, SCHEDULE, 6) == 3
    # 9.2 units: 3 + 6.2 = 9.2 exactly: a fourth step (the budget's 1e-9 tolerance).
    assert costmodel.scheduled_steps(64, 64, 2.0, SCHEDULE, 9.2) == 4
    # Without a schedule: floor(budget / units) as derive_steps has always counted.
    assert costmodel.scheduled_steps(64, 16, 2.0, None, 6) == 12


def test_the_ledger_charges_the_mu_in_force_in_the_reference_units():
    led = Ledger(mu=2.0, batch_size=64, n_params=1, n_layers=1, hidden=1,
                 mu_schedule=costmodel.as_schedule([[1, 17.6]]))  # fmt: skip
    lengths = torch.full((64,), 5)
    assert led.mu_now() == 2.0
    # Step 1, on-policy at mu 2: (64 + 2 x 64) / (64 x 3) = 1 unit.
    led.add_generation(lengths, gen_tokens=64, seconds=0.0)
    led.add_training(lengths, loss_tokens=64, seconds=0.0)
    assert led.paper_units == pytest.approx(1.0) and led.budget_units() == pytest.approx(1.0)
    assert led.mu_now() == 17.6 and led.metrics()["mu"] == 17.6
    # Step 2 starts at 1 unit: its 64 rollouts at mu 17.6, (64 + 1126.4) / 192 = 6.2 more.
    led.add_generation(lengths, gen_tokens=64, seconds=0.0)
    led.add_training(lengths[:32], loss_tokens=32, seconds=0.0)  # a buffer short of B
    # Charged: what it trained, (32 + 1126.4) / 192 = 6.0333; the budget's count: B, 6.2.
    assert led.paper_units == pytest.approx(1 + 1158.4 / 192)
    assert led.budget_units() == pytest.approx(7.2)
    # Without a schedule the ledger logs no compute/mu (the rows of every earlier run).
    plain = Ledger(mu=2.0, batch_size=64, n_params=1, n_layers=1, hidden=1)
    assert "mu" not in plain.metrics() and plain.mu_now() == 2.0


FIXED = ["schedule.max_steps=null", "schedule.max_compute=6", "compute.mu=2.0",
         "schedule.reuse_ratio=4", "buffer.capacity=256"]  # fmt: skip


def test_resolve_counts_the_steps_a_scheduled_budget_buys():
    _, d = resolve(compose([*FIXED, "compute.mu_schedule=[[3,17.6]]"]))
    assert d.total_steps == 7  # test_scheduled_steps_hand_checked, B = 64, R = 16
    _, d = resolve(compose(FIXED))
    assert d.total_steps == 12  # 6 / 0.5
    # A controlled run's bound: the cheapest step, R = G = 8: (64 + 16) / 192 = 0.41667 until
    # 3 units (8 steps reach 3.333), then (64 + 140.8) / 192 = 1.06667: 3.333 + 2 x 1.0667 =
    # 5.467 <= 6 < 6.533: 10 steps. N may grow to every rollout the budget can generate at
    # R = B, 3 on-policy steps (above): 192.
    cfg, d = resolve(compose(["controller=adaptive", "buffer.capacity=64", *FIXED[:3],
                              "compute.mu_schedule=[[3,17.6]]"]))  # fmt: skip
    assert d.total_steps == 10 and d.max_capacity == 192


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ("5", "compute.mu_schedule=5 must be a list of [from_units, mu] pairs, e.g. "
              "'[[1500,17.6]]'"),
        ("[[3,17.6,1]]", "compute.mu_schedule=[[3,17.6,1]] must be a list of [from_units, mu] "
                         "pairs, e.g. '[[1500,17.6]]'"),
        ("[[3,2],[3,5]]", "compute.mu_schedule=[[3,2],[3,5]]: the from_units must be positive "
                          "and increasing"),
        ("[[0,2]]", "compute.mu_schedule=[[0,2]]: the from_units must be positive and "
                    "increasing"),
        ("[[3,-1]]", "compute.mu_schedule=[[3,-1]]: every mu must be >= 0"),
        ("[[3,x]]", "compute.mu_schedule=[[3,'x']]: every pair must be two numbers "
                    "[from_units, mu]"),
    ],
)  # fmt: skip
def test_a_bad_schedule_is_refused_at_resolve(schedule, message):
    with pytest.raises(ConfigError) as err:
        resolve(compose([f"compute.mu_schedule={schedule}"]))
    assert str(err.value) == message


def test_a_schedule_is_refused_under_async():
    with pytest.raises(ConfigError) as err:
        resolve(compose(["schedule=async", "compute.mu_schedule=[[3,17.6]]"]))
    assert str(err.value) == (
        "compute.mu_schedule=[[3,17.6]] needs schedule=sync (given schedule=async: the "
        "emulated arrivals and the generator ranks' modelled cost take one compute.mu)"
    )


@pytest.mark.slow
def test_a_run_charges_each_step_at_the_cost_in_force(fast, tmp_path):
    # The fast model at B = 16, R = 8 (y = 2), mu 1 then 3 from 2 units on: 0.75 a step
    # ((16 + 8) / 32) until 2 units (3 steps reach 2.25), then (16 + 24) / 32 = 1.25: 2.25 +
    # 1.25 x 3 = 6.0 <= 6: 6 steps in all (at mu 1 throughout: 8).
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "replay_exp.train", *fast, f"run_dir={run_dir}",
           "schedule.max_steps=null", "schedule.max_compute=6", "schedule.reuse_ratio=2",
           "compute.mu=1.0", "compute.mu_schedule=[[2,3.0]]", "logger.log_every=1",
           "eval.every=100"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["step"]: r for r in read_metrics(run_dir / "metrics.jsonl")}
    # The row of step s carries the cost in force after it: the budget's count is 0.75 after
    # step 1, 1.5 after step 2, 2.25 after step 3.
    assert [rows[s]["compute/mu"] for s in range(7)] == [1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 3.0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 6
    # Charged: step 1 trains on the 8 rollouts the buffer holds (short of B = 16), (8 + 8) /
    # 32 = 0.5; steps 2, 3 0.75 each; steps 4-6 1.25 each: 0.5 + 1.5 + 3.75 = 5.75.
    assert summary["compute"]["paper_units"] == pytest.approx(5.75)
    assert [rows[s]["compute/paper_units"] for s in (1, 3, 6)] == pytest.approx([0.5, 2.0, 5.75])
