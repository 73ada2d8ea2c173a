"""Arrival schedules: the async-cluster emulation's arrivals, reuse and compute charge."""

from __future__ import annotations

import pytest
import torch

from replay_exp.buffer import FIFOBuffer
from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.rollout.synthetic import rollout_batch
from replay_exp.runtime.schedule import AsyncArrivals, SyncArrivals, WeightHistory
from replay_exp.theory.bound import async_gamma
from replay_exp.types import RolloutBatch

MU = 6.84  # the paper's measured mu for Qwen3-0.6B


@pytest.mark.parametrize(
    ("W", "T", "gamma"),
    [
        # gamma = (1 + W/T) / (1 + mu), mu = 6.84 -> 1 + mu = 7.84:
        (7, 1, 8 / 7.84),  # 1.0204
        (6, 2, 4 / 7.84),  # 0.5102 (the paper's Table 3 prints 0.41: a typo)
        (5, 3, (8 / 3) / 7.84),  # 0.3401
        (4, 4, 2 / 7.84),  # 0.2551
        (2, 6, (4 / 3) / 7.84),  # 0.1701
        (1, 7, (8 / 7) / 7.84),  # 0.1458
    ],
)
def test_gamma_matches_the_paper_formula(W, T, gamma):
    assert async_gamma(W, T, MU) == pytest.approx(gamma)
    _, d = resolve(
        compose(["schedule=async", f"schedule.workers={W}", f"schedule.trainers={T}",
                 f"compute.mu={MU}", "buffer.capacity=1024"])
    )  # fmt: skip
    assert d.paper_units_per_step == pytest.approx(gamma)
    assert d.reuse_ratio == pytest.approx(MU * T / W)


def test_arrivals_accumulate_fractions_deterministically():
    # B=60, W=6, T=2, mu=6.84, G=16: rate = 60*6 / (6.84*2*16) = 1.6447 groups per step.
    a = AsyncArrivals(6, 2, MU, 60, 16)
    assert a.rate == pytest.approx(360 / 218.88)
    counts = [a.groups_at(t) for t in range(1000)]
    assert set(counts) == {1, 2}
    # Cumulative deliveries never drift: A(t) = floor((t+1) rate).
    assert sum(counts) == int(1000 * a.rate)
    assert a.groups_before(1000) == sum(counts)
    assert [a.groups_before(t) for t in range(4)] == [0, 1, 3, 4]


def test_slow_generation_still_delivers_at_the_first_step():
    a = AsyncArrivals(1, 7, MU, 16, 16)  # rate = 16 / (6.84*7*16) = 0.0209 groups/step
    counts = [a.groups_at(t) for t in range(100)]
    assert counts[0] == 1 and sum(counts) == 2  # A(99) = floor(100 * 0.0209) = 2


def test_sync_arrivals_are_constant():
    s = SyncArrivals(4)
    assert [s.groups_at(t) for t in range(3)] == [4, 4, 4] and s.groups_before(3) == 12


def _synthetic(n: int, step: int, uid0: int) -> RolloutBatch:
    return rollout_batch(torch.full((n, 2), 5), torch.full((n, 2), 6), version=step, uid_start=uid0)


@pytest.mark.parametrize(("W", "T"), [(6, 2), (5, 3), (4, 4)])
def test_emulated_reuse_matches_mu_T_over_W(W, T):
    """Mean uses per rollout = B / mean R = mu T / W (first order), the paper's replay ratio."""
    B, G, N, steps = 60, 4, 4096, 3000
    a = AsyncArrivals(W, T, MU, B, G)
    buf = FIFOBuffer(N, 2, 2, seed=0)
    for t in range(steps):
        n = a.groups_at(t) * G
        if n:
            buf.add(_synthetic(n, t, a.groups_before(t) * G), t)
        buf.sample(B, t)
    # Every delivered rollout that was evicted or is still stored counts; the mean over the
    # run's deliveries is trained samples / delivered rollouts.
    delivered = a.groups_before(steps) * G
    reuse = (steps * B) / delivered
    assert reuse == pytest.approx(MU * T / W, rel=0.02)


def test_W_over_T_equal_to_mu_reduces_to_the_baseline():
    # mu = 3, W/T = 3: rate = B/G exactly, one paper unit per step, every rollout used once.
    cfg, d = resolve(
        compose(["schedule=async", "schedule.workers=6", "schedule.trainers=2", "compute.mu=3",
                 "buffer=on_policy"])
    )  # fmt: skip
    assert d.rollouts_per_step == cfg.schedule.batch_size
    assert d.paper_units_per_step == pytest.approx(1.0)
    a = AsyncArrivals(6, 2, 3.0, 64, 8)
    assert [a.groups_at(t) for t in range(50)] == [8] * 50


def test_async_has_no_fixed_R():
    """The async schedule derives R: rollouts_per_step is not one of its keys."""
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="rollouts_per_step"):
        compose(["schedule=async", "schedule.rollouts_per_step=16"])


def test_weight_history_serves_lagged_versions():
    lin = torch.nn.Linear(2, 2, bias=False)
    h = WeightHistory(lag=2)
    for v in range(5):
        with torch.no_grad():
            lin.weight.fill_(v)
        h.push(v, lin)
    version, w = h.weights_for(4, lin)
    assert version == 2 and float(w["weight"][0, 0]) == 2.0
    assert sorted(h.versions) == [2, 3, 4]  # only lag + 1 copies kept
    zero = WeightHistory(lag=0)
    zero.push(0, lin)
    assert zero.weights_for(3, lin) == (3, lin) and zero.versions == {}


@pytest.mark.slow
def test_async_run_end_to_end_charges_gamma_and_lags_weights(fast, tmp_path):
    from replay_exp.runlog import read_metrics
    from replay_exp.train import run

    # B=16, G=4, W=1, T=3, mu=1: rate = 16 / (1*3*4) = 1.333 groups/step -> arrivals 1,1,2,1,...
    over = [*fast, "schedule=async", "schedule.workers=1", "schedule.trainers=3",
            "schedule.gpus=null", "compute.mu=1", "schedule.sync_lag=1", "schedule.max_steps=5",
            "eval.every=5", f"run_dir={tmp_path / 'run'}"]  # fmt: skip
    cfg, d = resolve(compose(over))
    run(cfg, d, tmp_path / "run")
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["step"] > 0]
    assert [r["train/fresh_rollouts"] for r in rows] == [4, 4, 8, 4, 4]
    # gamma = (1 + 1/3) / (1 + 1) = 2/3 per step.
    assert rows[-1]["compute/paper_units"] == pytest.approx(5 * 2 / 3)
    # Synced every step to version step - 1 (never below 0).
    assert [r["policy/generator_version"] for r in rows] == [0, 0, 1, 2, 3]
