"""The exact variance of FIFO replay (replay_exp.theory.exact): hand-derived values, and a
Monte Carlo simulation of the sampling process itself."""

from __future__ import annotations

import numpy as np
import pytest

from replay_exp.theory.exact import (
    j_exact,
    j_on_policy,
    j_paper,
    lifetimes,
    mean_reuse_gap,
    rho_interpolated,
    variance_rate,
)


def test_lifetimes_of_a_fifo():
    assert lifetimes(4, 16) == [(4, 1.0)]
    # x = 2.5, R = 4: position p lives floor(1.5 + p / 4) + 1 steps: 2, 2, 3, 3
    assert lifetimes(2.5, 4) == [(2, 0.5), (3, 0.5)]
    assert lifetimes(1, 8) == [(1, 1.0)]
    with pytest.raises(ValueError, match="x = N / R must be >= 1"):
        lifetimes(0.5, 8)


def test_constant_rho_whole_x_by_hand():
    """sigma = 1, rho constant, whole x: R V = (1 - 1/N)/y + 1/x + rho (1 - 1/x). x = 4, y = 2,
    R = 16 (N = 64), rho = 0.5: 63/128 + 0.25 + 0.375 = 1.1171875."""
    v = variance_rate(4, 2, 16, rho=lambda d: 0.5)
    assert v == pytest.approx(63 / 128 + 0.25 + 0.375, abs=1e-12)
    # x = y = 1, sampling B = R from the R fresh rollouts with replacement: 2 - 1/N, where
    # the on-policy baseline (each once) has 1 and the paper's bound 2 + rho
    assert variance_rate(1, 1, 64, rho=lambda d: 0.5) == pytest.approx(2 - 1 / 64)
    assert j_paper(1, 1, mu=6.84, rho=0.5) == pytest.approx((1 + 1 / 6.84) * 2.5)
    assert j_on_policy(6.84) == pytest.approx(1 + 1 / 6.84)
    # J per unit of compute: (1 + y / mu) R V
    assert j_exact(4, 2, 16, 6.84, lambda d: 0.5) == pytest.approx((1 + 2 / 6.84) * v)


def test_a_decaying_rho_and_a_staleness_profile_by_hand():
    """x = 2, y = 1, R = 2 (N = 4), rho(1) = 0.8, sigma^2(a) = 1 + a: lifetime 2, ages 0, 1.
    Resampling: (1 - 1/4) / 2 * (1 + 2) = 1.125. Reuse: (1/4) [1 + 2 + 2 * 0.8 * sqrt(2)] =
    (3 + 2.2627417) / 4 = 1.3156854. R V = 2.4406854."""
    v = variance_rate(2, 1, 2, rho=lambda d: 0.8, sigma2=lambda a: 1 + a)
    assert v == pytest.approx(1.125 + (3 + 1.6 * np.sqrt(2)) / 4, abs=1e-12)


def test_rho_interpolation_and_the_mean_reuse_gap():
    rho = rho_interpolated([1, 2, 4], [0.9, 0.8, 0.6])
    assert rho(0) == 1 and rho(1) == 0.9 and rho(3) == pytest.approx(0.7)
    assert rho(100) == 0.6  # constant after the last measured gap
    with pytest.raises(ValueError):
        rho_interpolated([2, 1], [0.9, 0.8])
    assert mean_reuse_gap(1, 8) == 0
    assert mean_reuse_gap(3, 8) == pytest.approx(4 / 3)  # gaps 1, 1, 2
    # x = 2.5, R = 4: half live 2 steps (1 pair, gap 1), half 3 (3 pairs, mean 4/3):
    # (0.5 * 1 * 1 + 0.5 * 3 * 4/3) / (0.5 * 1 + 0.5 * 3) = 2.5 / 2 = 1.25
    assert mean_reuse_gap(2.5, 4) == pytest.approx(1.25)


def _simulate(x, y, R, phi, steps=300, chains=6000, seed=0):
    """Var(sum_t g_t) / T of the process itself: a FIFO of N = x R rollouts whose noise
    follows an AR(1) in age (rho(delta) = phi^delta, unit variance), B = y R uniform draws
    with replacement per step, after a warm-up that fills the buffer."""
    rng = np.random.default_rng(seed)
    N, B = int(round(x * R)), int(round(y * R))
    state = rng.standard_normal((chains, N))  # column 0 oldest ... N - 1 newest
    total = np.zeros(chains)
    for t in range(steps + 2 * N):
        state = phi * state + np.sqrt(1 - phi * phi) * rng.standard_normal(state.shape)
        state = np.concatenate([state[:, R:], rng.standard_normal((chains, R))], axis=1)
        idx = rng.integers(0, N, size=(chains, B))
        g = np.take_along_axis(state, idx, axis=1).mean(axis=1)
        if t >= 2 * N:
            total += g
    return total.var() / steps


@pytest.mark.slow
@pytest.mark.parametrize("x, y, R", [(3, 2, 4), (2.5, 1, 4), (1, 1, 8)])
def test_the_exact_rate_matches_a_simulation_of_the_sampling(x, y, R):
    """Monte Carlo SE of a variance from 6000 chains: sqrt(2 / 6000) = 1.8 %; the finite
    window adds a bias of O(x / T) (< 2 %): 7 % tolerance (checked over 5 seeds: the mean
    of the simulated rates is within 1 % of the exact one)."""
    phi = 0.8
    exact = variance_rate(x, y, R, rho=lambda d: phi**d)
    # the simulated rate is per step in units of the per-rollout variance, R V / R
    assert _simulate(x, y, R, phi) * R == pytest.approx(exact, rel=0.07)


def test_compare_models_normalises_each_model_by_its_own_on_policy_value():
    """rho = 0 (independent reuses), sigma flat, mu = 6.84, x = 8, y = 2, R = 32 (N = 256):
    exact R V = (1 - 1/256) / 2 + 1/8 = 0.623047, J = (1 + 2/6.84) 0.623047 = 0.805216,
    J_on = 1 + 1/6.84 = 1.146199 -> 0.70251. Paper: (1 + 2/6.84)(1/2 + 1/8) / ((1 + 1/6.84) 2)
    = 0.807740 / 2.292398 = 0.35236."""
    from replay_exp.theory.exact import compare_models

    (row,) = compare_models(6.84, lambda d: 0.0, configs=[("N=256, y=2", 256, 32)])
    assert (row["x"], row["y"]) == (8, 2) and row["mean_gap"] == pytest.approx(3.0)
    assert row["exact"] == pytest.approx(0.70251, abs=1e-5)
    assert row["paper_rho1"] == pytest.approx(0.35236, abs=1e-5)


def test_share_of_pairs_beyond_a_gap():
    """x = 4 (lifetime 4): pairs at gaps 1, 2, 3 number 3, 2, 1; beyond gap 1: 3 of 6."""
    from replay_exp.theory.exact import share_of_pairs_beyond

    assert share_of_pairs_beyond(4, 8, 1) == pytest.approx(0.5)
    assert share_of_pairs_beyond(4, 8, 3) == 0 and share_of_pairs_beyond(1, 8, 0) == 0


def test_the_cli_writes_the_comparison_table_and_figure(tmp_path, capsys):
    """rho(delta) = 0.5 everywhere (a two-point noise file): every config's exact J/J_on in the
    printed table and in compare.csv, with the figure beside it."""
    import json

    import pandas as pd

    from replay_exp.theory.exact import main

    noise = tmp_path / "noise.json"
    noise.write_text(json.dumps({"deltas": [1, 2], "pooled": {"rho": [0.5, 0.5]}}))
    main(["--noise", str(noise), "--out", str(tmp_path / "out")])
    table = pd.read_csv(tmp_path / "out" / "compare.csv")
    assert len(table) == 7 and (tmp_path / "out" / "compare.png").stat().st_size > 10_000
    assert f"{table['exact'][0]:.3f}" in capsys.readouterr().out
