"""The controller on hand-made signal sequences (replay_exp/control/controller.py): the knobs
it sets on the real buffer, optimizer and arrival count, its ``controller/*`` values, the budget
rule, its state mid-window, and what resolve() refuses or derives for it."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from replay_exp.buffer import make_buffer
from replay_exp.compute.ledger import Ledger
from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.config.errors import ConfigError
from replay_exp.control.controller import Controller

# On-policy start (R = N = B = 64, G = 8), a decision every 2 steps, a budget of 100 units.
START = ["controller=adaptive", "controller.every=2", "buffer.capacity=64",
         "schedule.max_steps=null", "schedule.max_compute=100", "compute.mu=3.0"]  # fmt: skip


# The one process's collective (runtime/inprocess.py: InProcess.gather / broadcast): the lead
# alone, nothing to agree with.
ONE = SimpleNamespace(gather=lambda obj: [obj], broadcast=lambda obj: obj)
# The async node of one trainer and one generator at mu 3: R = B W / (mu T) = 64 / 3 = 21.3
# rollouts a step, scored as 24 (3 whole groups of 8).
ASYNC = ["schedule=async", "schedule.trainers=1", "schedule.workers=1", "schedule.gpus=null"]


def build(*extra: str) -> tuple[Controller, object, torch.optim.Optimizer, Ledger]:
    cfg, d = resolve(compose([*START, *extra]))
    buffer = make_buffer(cfg.buffer, capacity=d.max_capacity, max_prompt_len=d.max_prompt_len,
                         max_completion_len=d.max_new_tokens, seed=0)  # fmt: skip
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=cfg.algo.lr)
    led = Ledger(mu=cfg.compute.mu, batch_size=64, n_params=1, n_layers=1, hidden=1)
    return Controller(cfg, d, buffer, opt), buffer, opt, led


def step(ctl: Controller, s: int, kl=0.0, ess=1.0, grad=1.0, fresh=64, rows=None) -> None:
    """One step's signals: ``fresh`` rollouts generated, a batch of 64 trained (``rows``: its
    rows' (lags, log-weights), as the update's ``control_rows``)."""
    arrivals = [SimpleNamespace(batch=SimpleNamespace(reward_B=torch.ones(fresh)))]
    stats = {"approx_kl": kl, "clip_frac": 0.0, "ess_frac": ess, "grad_norm": grad}
    if rows is not None:
        stats["control_rows"] = {"lag": rows[0], "logw": rows[1]}
    ctl.observe(s, stats, arrivals, SimpleNamespace(reward_B=torch.zeros(64)))


def test_resolve_derives_the_bounds_of_a_controlled_run():
    cfg, d = resolve(compose(START))
    # The cheapest step is R = G = 8: (64 + 3 x 8) / (64 x 4) = 0.34375 units, so 100 units
    # buy at most floor(100 / 0.34375) = 290 steps; N may grow to every rollout the budget can
    # generate, the most at R = B: 100 steps x 64 = 6400.
    assert d.total_steps == 290
    assert d.max_capacity == 6400
    assert (d.rollouts_per_step, d.capacity) == (64, 64)  # where it starts


def test_guard_decisions_set_the_buffer_optimizer_and_arrivals():
    ctl, buffer, opt, led = build()
    base_lr = opt.param_groups[0]["lr"]
    assert (ctl.knobs.rollouts_per_step, ctl.knobs.capacity, buffer.capacity) == (64, 64, 64)
    # Steps 0, 1 calm -> version 2: calm (1 of 2), hold. Between decisions: None.
    step(ctl, 0)
    assert ctl.decide(1, led, ONE) is None
    step(ctl, 1)
    row = ctl.decide(2, led, ONE)
    assert row["controller/action"] == 0.0 and row["controller/rollouts_per_step"] == 64.0
    # Steps 2, 3 calm -> version 4: calm for 2 windows, one rung up: R = 32, N = 256.
    step(ctl, 2)
    step(ctl, 3)
    row = ctl.decide(4, led, ONE)
    assert row["controller/action"] == 1.0
    assert (row["controller/rollouts_per_step"], row["controller/capacity"]) == (32.0, 256.0)
    assert (row["controller/reuse_ratio"], row["controller/horizon"]) == (2.0, 8.0)
    assert row["controller/rung"] == 1.0 and row["controller/decisions"] == 2.0
    assert buffer.capacity == 256 and ctl.groups_at(4) == 4
    # 4 steps of 64 rollouts = 32 groups of 8 numbered so far
    assert ctl.groups_before(4) == 32
    assert opt.param_groups[0]["lr"] == base_lr  # the lr knob is not owned
    # Steps 4, 5 at R = 32 with kl 0.08 > 0.05 -> version 6: breach, back to (64, 64).
    step(ctl, 4, kl=0.08, fresh=32)
    step(ctl, 5, kl=0.08, fresh=32)
    row = ctl.decide(6, led, ONE)
    assert row["controller/action"] == -1.0 and row["controller/breach/kl"] == 1.0
    assert row["controller/in/kl"] == pytest.approx(0.08)
    assert buffer.capacity == 64 and ctl.groups_before(6) == 32 + 8


def test_the_lr_knob_scales_by_the_window_ess():
    ctl, _, opt, led = build("controller.knobs=[reuse,capacity,lr]")
    base_lr = opt.param_groups[0]["lr"]
    step(ctl, 0, ess=0.7)
    step(ctl, 1, ess=0.5)
    ctl.decide(2, led, ONE)
    # window ESS (0.7 + 0.5) / 2 = 0.6 -> lr x 0.6 (ess 0.6 >= ess_min: no breach)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.6 * base_lr)
    assert ctl.metrics()["controller/lr_scale"] == pytest.approx(0.6)


def test_the_budget_ends_the_run_before_an_overrunning_step():
    ctl, _, _, led = build()
    # Nominal units: at R = 64 a step costs 1, at R = 32 (64 + 96) / 256 = 0.625 (mu 3).
    step(ctl, 0)
    assert ctl.spent == pytest.approx(1.0)
    # 99.5 spent -> the next step at R = 64 would end at 100.5 > 100: last.
    ctl.spent = 99.5
    assert ctl.last(150, led)
    ctl.spent = 99.0
    assert not ctl.last(150, led)
    assert ctl.budget_left(led) == pytest.approx(1.0)
    assert ctl.last(290, led)  # resolve()'s bound
    ctl.knobs.rollouts_per_step = 32  # 99.5 + 0.625 > 100, 99.375 + 0.625 = 100 is not over
    ctl.spent = 99.5
    assert ctl.last(150, led)
    ctl.spent = 99.375
    assert not ctl.last(150, led)


def test_a_state_mid_window_continues_to_the_same_decisions():
    a, _, _, led = build()
    for s in range(3):
        step(a, s)
    a.decide(2, led, ONE)  # (steps 0, 1) then step 2 is in the open window
    b, buffer_b, _, _ = build()
    b.load_state_dict(a.state_dict())
    assert buffer_b.capacity == b.knobs.capacity
    for ctl in (a, b):
        step(ctl, 3, grad=1.5)
    ra, rb = a.decide(4, led, ONE), b.decide(4, led, ONE)
    assert ra == rb and ra["controller/rollouts_per_step"] == 32.0
    assert a.state_dict()["guard"] == b.state_dict()["guard"]


def test_the_model_policy_probes_from_an_all_fresh_start():
    ctl, buffer, _, led = build("controller.policy=model")
    step(ctl, 0)
    step(ctl, 1)
    ctl.window.rows = [(torch.zeros(64, dtype=torch.long).numpy(), torch.zeros(64).numpy())] * 2
    row = ctl.decide(2, led, ONE)
    # every row is fresh (age 0): no alpha; one rung up to (32, 256)
    assert math.isnan(row["controller/in/alpha"]) and row["controller/in/aged_rows"] == 0.0
    assert (ctl.knobs.rollouts_per_step, ctl.knobs.capacity) == (32, 256)
    assert buffer.capacity == 256


def test_the_lag_rule_sets_the_lr_from_the_trained_rows_lag():
    ctl, _, opt, led = build("controller.knobs=[reuse,capacity,lr]", "controller.lr_rule=lag",
                             "controller.lr_lag_scale=256")  # fmt: skip
    base_lr = opt.param_groups[0]["lr"]
    # the window's rows: lags 0 and 1536 (step 0), 768 and 768 (step 1): mean S = 768, so
    # lr x (1 + 768 / 256)^-1/2 = 0.5 (the ESS, 0.6, is not this rule's signal)
    step(ctl, 0, ess=0.7, rows=(np.array([0, 1536]), np.zeros(2)))
    step(ctl, 1, ess=0.5, rows=(np.array([768, 768]), np.zeros(2)))
    row = ctl.decide(2, led, ONE)
    assert row["controller/in/lag"] == pytest.approx(768.0)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * base_lr)
    assert row["controller/lr_scale"] == pytest.approx(0.5)


def aged_window(ctl, s: int, k: float) -> None:
    """Two steps whose trained rows are two of age 1 each, with importance weights 1 and k:
    inflation 2 (1 + k^2) / (1 + k)^2 in every step, so alpha = log(inflation) / (2 log 2)
    with no spread over steps (an identified alpha for k > 1): k = 1.5 -> 0.0283, k = 2 ->
    0.0760, k = 5 -> 0.2653."""
    for t in (s, s + 1):
        step(ctl, t, rows=(np.array([1, 1]), np.log([1.0, k])))


# The model policy on the embedded testbed's rho (its default input), START's B = 64, mu 3 and
# budget 100 (N up to 6400): paper_gap picks (N, R) = (4096, 40) at alpha 0.0283, (256, 40) at
# 0.0760 and on-policy (64, 64) at 0.2653 (replay_exp.control.model.pick_design at those
# alphas, computed once and written here).
MODEL = ("controller.policy=model", "controller.model.min_aged_rows=2")


def test_the_model_policy_keeps_reading_and_moves_back_down():
    ctl, buffer, _, led = build(*MODEL)
    designs = []
    for s, k in zip((0, 2, 4), (1.5, 1.5, 5.0), strict=True):
        aged_window(ctl, s, k)
        ctl.decide(s + 2, led, ONE)
        designs.append((ctl.knobs.capacity, ctl.knobs.rollouts_per_step))
    # low alpha: up to (4096, 40); the same again: hold; a high alpha: back down to on-policy
    assert designs == [(4096, 40), (4096, 40), (64, 64)]
    m = ctl.metrics()
    assert (m["controller/moves_up"], m["controller/moves_down"]) == (1.0, 1.0)
    assert buffer.capacity == 64


@pytest.mark.parametrize(
    ("extra", "want", "held"),
    [
        # No hysteresis: alpha alternating across the boundary between (4096, 40) and
        # (256, 40) moves at every decision after the first: 5 moves in 5 decisions.
        ((), [(4096, 40), (256, 40), (4096, 40), (256, 40), (4096, 40)], 0),
        # persist 2: (4096, 40) is named at decisions 1 and 2 (move at 2); after that each
        # target is named once in a row: held at 1, 3 and 5 (4 names the current design).
        (
            ("controller.model.persist=2",),
            [(64, 64), (4096, 40), (4096, 40), (4096, 40), (4096, 40)],
            3,
        ),
        # min_gain 0.05: the move down to (256, 40) gains 1.06 % (held at 3 and 5); the first
        # move up from on-policy gains more than 5 %.
        (
            ("controller.model.min_gain=0.05",),
            [(4096, 40), (4096, 40), (4096, 40), (4096, 40), (4096, 40)],
            2,
        ),
    ],
    ids=["none", "persist", "min_gain"],
)
def test_hysteresis_stops_the_flapping(extra, want, held):
    ctl, _, _, led = build(*MODEL, *extra)
    designs = []
    for i, k in enumerate((1.5, 1.5, 2.0, 1.5, 2.0) if extra else (1.5, 2.0, 1.5, 2.0, 1.5)):
        aged_window(ctl, 2 * i, k)
        ctl.decide(2 * i + 2, led, ONE)
        designs.append((ctl.knobs.capacity, ctl.knobs.rollouts_per_step))
    assert designs == want
    assert ctl.metrics()["controller/held"] == float(held)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["runtime=distributed", *ASYNC],
         "controller.knobs=['reuse', 'capacity'] holds reuse, but under schedule=async R is "
         "what the generator ranks deliver: list only capacity and/or lr (or use "
         "schedule=sync)"),
        ([*ASYNC, "controller.knobs=[lr,reuse]"],
         "controller.knobs=['lr', 'reuse'] holds reuse, but under schedule=async R is what W, "
         "T and mu set: list only capacity and/or lr (or use schedule=sync)"),
        (["runtime=distributed", *ASYNC[:1], "schedule.trainers=2", "schedule.workers=1",
          "schedule.gpus=null", "buffer.shards=2", "controller.knobs=[capacity]",
          "buffer=max_age", "buffer.capacity=64"],
         "controller=adaptive resizes one FIFO a trainer: use buffer=fifo with buffer.shards=2 "
         "(given buffer=max_age, buffer.shards=2)"),
        (["buffer=on_policy", "buffer.capacity=null"],
         "controller=adaptive resizes one FIFO a trainer: use buffer=fifo with buffer.shards=1 "
         "(given buffer=on_policy, buffer.shards=1)"),
        # mu 12 with one generator per trainer: R = 64 / 12 = 5.3 < G = 8 a step
        ([*ASYNC, "controller.knobs=[capacity]", "controller.policy=model", "compute.mu=12"],
         "controller.policy=model scores an async split as the sync design at R in whole "
         "groups, but schedule.workers=1 and trainers=1 at compute.mu=12 bring R=5.33 < "
         "algo.group_size=8 a step"),
        (["controller.knobs=[reuse,speed]"],
         "controller.knobs=['reuse', 'speed']: list some of ['reuse', 'capacity', 'lr'], each "
         "once"),
        (["controller.policy=magic"],
         "controller.policy=magic is unknown; choose one of ['guard', 'model'] (or "
         "controller=fixed)"),
        (["controller.policy=model", "schedule.max_compute=null", "schedule.max_steps=50"],
         "controller.policy=model searches the designs at the remaining compute: set "
         "schedule.max_compute (given max_steps / max_rollouts)"),
        (["controller.policy=model", "controller.model.noise=/nonexistent/noise.json"],
         "controller.model.noise=/nonexistent/noise.json is not a file (a theory.measure "
         "output; measure one with python -m replay_exp.theory.measure)"),
        (["controller.min_rollouts_per_step=12"],
         "controller.min_rollouts_per_step=12 must be a multiple of algo.group_size=8 in [8, "
         "schedule.batch_size=64]"),
        (["controller.max_capacity=32"],
         "controller.max_capacity=32 is below schedule.batch_size=64"),
        (["buffer.capacity=256", "controller.max_capacity=128"],
         "controller.max_capacity=128 is below the run's own buffer.capacity=256, where the "
         "controller starts"),
        (["schedule.reuse_ratio=4", "controller.min_rollouts_per_step=32"],
         "controller.min_rollouts_per_step=32 is above the run's own "
         "schedule.rollouts_per_step=16, where the controller starts"),
        (["controller.guard.ess_min=1.5"],
         "controller.guard: ess_min=1.5 and calm=0.5 must be < 1, clip_max=0.2 <= 1"),
        (["controller.lr_min_scale=0"], "controller.lr_min_scale=0 must be in (0, 1]"),
        (["controller.lr_rule=kl"],
         "controller.lr_rule=kl is unknown; choose one of ['ess', 'lag']"),
        (["controller.lr_lag_scale=0"], "controller.lr_lag_scale=0.0 must be > 0"),
        (["controller.policy=model", "controller.model.min_gain=1.5"],
         "controller.model.min_gain=1.5 must be in [0, 1) (a relative gain; null: no margin)"),
        (["controller.policy=model", "controller.model.persist=0"],
         "controller.model.persist=0 must be > 0"),
    ],
    ids=["distributed", "async", "distributed_fifo", "on_policy", "async_model_r", "knobs",
         "policy", "model_budget", "model_noise", "r_min", "n_max_b", "n_max_start",
         "r_min_start", "guard", "lr_min", "lr_rule", "lr_lag_scale", "min_gain", "persist"],
)  # fmt: skip
def test_resolve_refuses_what_the_controller_cannot_set(extra, message):
    with pytest.raises(ConfigError) as e:
        resolve(compose([*START, *extra]))
    assert str(e.value) == message


def test_fixed_takes_no_controller_key():
    with pytest.raises(ConfigError, match="controller.policy=null .fixed. has no key"):
        resolve(compose(["++controller.every=5"]))
    cfg, d = resolve(compose([]))
    assert cfg.controller.policy is None and d.max_capacity is None


def test_under_async_it_sets_n_and_lr_and_the_schedule_keeps_r():
    # One trainer, one generator, mu 3: R = 21.3 a step, scored as 24; each step costs
    # gamma = (1 + W/T) / (1 + mu) = 2 / 4 = 0.5 units, so 100 units are 200 steps, as for the
    # same run without a controller.
    extra = [*ASYNC, "controller.knobs=[capacity,lr]", "controller.guard.patience=1"]
    ctl, buffer, opt, led = build(*extra)
    fixed_cfg, fixed = resolve(compose([s for s in START if "controller" not in s] + ASYNC))
    assert ctl.max_steps == fixed.total_steps == 200
    assert not ctl.sets_arrivals and ctl.knobs.rollouts_per_step == 24
    # calm steps 0, 1 -> one rung up: N 64 -> 256 (x capacity_growth 4), R stays
    step(ctl, 0, fresh=16)
    step(ctl, 1, fresh=24)
    row = ctl.decide(2, led, ONE)
    assert (ctl.knobs.rollouts_per_step, ctl.knobs.capacity, buffer.capacity) == (24, 256, 256)
    assert row["controller/action"] == 1.0 and ctl.spent == pytest.approx(2 * 0.5)
    # the budget is the fixed step count, whatever R the generators bring
    assert not ctl.last(199, led) and ctl.last(200, led)


def test_windows_of_several_ranks_pool_their_signals():
    # two trainer ranks over steps 0, 1: kl 0.1, 0.3 on rank 0 and 0.5, NaN on rank 1 -> the
    # mean of the finite three, 0.3; the lag over all rows: (0 + 2 + 4) / 3 = 2
    from replay_exp.control.signals import Window

    ranks = []
    for kls, lags in (([0.1, 0.3], [0, 2]), ([0.5, math.nan], [4])):
        w = Window()
        for s, kl in enumerate(kls):
            rows = {"lag": lags if s == 0 else [], "logw": [0.0] * (len(lags) if s == 0 else 0)}
            w.add(s, {"approx_kl": kl, "control_rows": rows}, 1.0, 0.5)
        ranks.append(w)
    summary = Window.merged(ranks).summary()
    assert summary["steps"] == 2.0  # the steps, not steps x ranks
    assert summary["kl"] == pytest.approx(0.3) and summary["lag"] == pytest.approx(2.0)
    assert Window.merged(ranks[:1]) is ranks[0]


def test_the_controller_reads_the_cost_in_force():
    # START of test_controller: on-policy (R = N = B = 64) at mu 3, 100 units; from 2 units on
    # mu = 9: an on-policy step then costs (64 + 9 x 64) / (64 x 4) = 2.5 units.
    ctl, _, _, led = build("compute.mu_schedule=[[2,9.0]]")
    assert ctl.mu_now() == 3.0 and ctl.step_units(64) == 1.0
    step(ctl, 0)
    step(ctl, 1)
    assert ctl.spent == 2.0 and ctl.mu_now() == 9.0 and ctl.step_units(64) == 2.5
    # At R = 8: (64 + 72) / 256 = 0.53125.
    assert ctl.step_units(8) == 0.53125
    row = ctl.decide(2, led, ONE)
    assert row["controller/in/mu"] == 9.0
    assert row["controller/in/budget_left"] == 98.0
    # The budget rule: 97.5 units spent would leave room for one step of 2.5, not two.
    ctl.spent = 97.5
    assert not ctl.last(3, led)
    ctl.spent = 97.6
    assert ctl.last(3, led)
