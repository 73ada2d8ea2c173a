"""replay_exp.theory.bound: the paper's optimum (closed form vs numeric), recommendations, mu
estimates, figures and the command line. Expected values are computed by hand in comments."""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from replay_exp.theory import bound as theory
from replay_exp.theory import cli as theory_cli
from replay_exp.theory.bound import (
    K,
    Recommendation,
    closed_form_optimum,
    estimate_mu,
    estimate_mu_from_run,
    j_star,
    numeric_optimum,
    objective,
    on_policy_regime,
    optimal_reuse,
    recommend,
    sigma_bar2_from_profile,
)
from replay_exp.theory.cli import main, plot_theory

ALPHAS = (0.05, 0.1, 0.2, 0.3, 0.45)
RHOS = (0.05, 0.1, 0.3, 0.6, 1.0)
MUS = (1.0, 2.0, 5.28, 6.84, 20.0)


def paper_formula(mu, a, rho):
    """The paper's closed forms, literally (singular at rho = 1/mu and rho = 0)."""
    x = (-(a / mu + rho * (1 - 2 * a)) + math.sqrt(a**2 / mu**2 + rho * (1 - 2 * a) / mu)) / (
        2 * a * rho * (1 / mu - rho)
    )
    y = (-a + math.sqrt(a**2 + mu * rho * (1 - 2 * a))) / rho
    return x, y


def singular(mu, rho):
    return abs(rho - 1 / mu) < 1e-3


# ---------------------------------------------------------------------------------------------
# Closed form vs numeric
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", ALPHAS)
def test_closed_form_matches_numeric_minimisation(alpha):
    for rho, mu in itertools.product(RHOS, MUS):
        if singular(mu, rho):  # (rho, mu) = (1, 1) and (0.05, 20): see test_singular_case
            continue
        xc, yc = closed_form_optimum(mu, alpha, rho)
        xn, yn = numeric_optimum(mu, rho, alpha=alpha)
        assert xn == pytest.approx(xc, rel=1e-4), (alpha, rho, mu)
        assert yn == pytest.approx(yc, rel=1e-4), (alpha, rho, mu)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_closed_form_is_the_papers_formula_and_a_stationary_minimum(alpha):
    for rho, mu in itertools.product(RHOS, MUS):
        if singular(mu, rho):
            continue
        x, y = closed_form_optimum(mu, alpha, rho)
        xp, yp = paper_formula(mu, alpha, rho)
        assert x == pytest.approx(xp, rel=1e-9)
        assert y == pytest.approx(yp, rel=1e-9)
        # y* = y*(x*) and the unsquared condition 1 - 2a - 2 a rho x* >= 0 picks this root.
        assert y == pytest.approx(float(optimal_reuse(x, mu, rho)), rel=1e-12)
        assert 1 - 2 * alpha - 2 * alpha * rho * x >= 0
        # d log K / d log x = 0 there, and K is larger on either side.
        h = 1e-5
        k_lo, k0, k_hi = K(np.array([x * (1 - h), x, x * (1 + h)]), mu, alpha, rho)
        assert abs(math.log(k_hi / k_lo)) < 1e-9
        assert k0 < k_lo and k0 < k_hi


def test_paper_worked_examples():
    # alpha=0.1, rho=0.1, mu=5.28: b = 0.1/5.28 + 0.08 = 0.098939, D = 0.1/5.28^2... sqrt(D)
    # = 0.124540, x* = 0.64 / (0.2 (0.098939 + 0.124540)) = 14.319;
    # y* = 5.28 * 0.8 / (0.1 + sqrt(0.01 + 0.4224)) = 4.224 / 0.757575 = 5.5757.
    for x, y in (closed_form_optimum(5.28, 0.1, 0.1), numeric_optimum(5.28, 0.1, alpha=0.1)):
        assert round(x, 1) == 14.3 and round(y, 1) == 5.6
        assert x == pytest.approx(14.318992, rel=1e-6)
        assert y == pytest.approx(5.575713, rel=1e-6)
    # alpha=0.3, rho=1, mu=1 (rho = 1/mu): x* = mu (1-2a)^2 / (4a(1-a)) = 0.16/0.84 = 0.190476;
    # y* = (-0.3 + sqrt(0.09 + 0.4)) / 1 = 0.4.
    for x, y in (closed_form_optimum(1.0, 0.3, 1.0), numeric_optimum(1.0, 1.0, alpha=0.3)):
        assert round(x, 2) == 0.19 and round(y, 1) == 0.4
        assert x == pytest.approx(0.16 / 0.84, rel=1e-6)
        assert y == pytest.approx(0.4, rel=1e-6)


@pytest.mark.parametrize(("mu", "alpha"), [(1.0, 0.3), (20.0, 0.2), (5.28, 0.1), (2.0, 0.45)])
def test_singular_case(mu, alpha):
    rho = 1 / mu
    x, y = closed_form_optimum(mu, alpha, rho)
    # The linear root of the quadratic: (1-2a)^2 / (4a (a/mu + rho (1-2a))).
    linear = (1 - 2 * alpha) ** 2 / (4 * alpha * (alpha / mu + rho * (1 - 2 * alpha)))
    assert x == pytest.approx(linear, rel=1e-12)
    assert x == pytest.approx(mu * (1 - 2 * alpha) ** 2 / (4 * alpha * (1 - alpha)), rel=1e-12)
    xn, yn = numeric_optimum(mu, rho, alpha=alpha)
    assert xn == pytest.approx(x, rel=1e-5) and yn == pytest.approx(y, rel=1e-5)
    # The paper's formula tends to it from both sides (rho in [0, 1] or not, it is algebra).
    for d in (1e-4, -1e-4):
        xp, yp = paper_formula(mu, alpha, rho * (1 + d))
        assert xp == pytest.approx(x, rel=1e-3) and yp == pytest.approx(y, rel=1e-3)
    below = closed_form_optimum(mu, alpha, rho * (1 - 1e-9))
    assert below == pytest.approx((x, y), rel=1e-7)


@pytest.mark.parametrize(("mu", "alpha"), [(5.28, 0.1), (1.0, 0.3), (20.0, 0.05)])
def test_rho_zero(mu, alpha):
    # K = x^a (1/sqrt(mu) + x^-1/2): x* = mu (1-2a)^2 / (4a^2), y* = sqrt(mu x*) = mu(1-2a)/(2a).
    # mu=5.28, a=0.1: x* = 5.28 * 0.64 / 0.04 = 84.48, y* = 5.28 * 0.8 / 0.2 = 21.12.
    x, y = closed_form_optimum(mu, alpha, 0.0)
    assert x == pytest.approx(mu * (1 - 2 * alpha) ** 2 / (4 * alpha**2), rel=1e-12)
    assert y == pytest.approx(math.sqrt(mu * x), rel=1e-12)
    assert y == pytest.approx(mu * (1 - 2 * alpha) / (2 * alpha), rel=1e-12)
    assert closed_form_optimum(mu, alpha, 1e-12) == pytest.approx((x, y), rel=1e-7)
    assert paper_formula(mu, alpha, 1e-8) == pytest.approx((x, y), rel=1e-4)
    assert numeric_optimum(mu, 0.0, alpha=alpha) == pytest.approx((x, y), rel=1e-5)
    assert closed_form_optimum(5.28, 0.1, 0.0) == pytest.approx((84.48, 21.12), rel=1e-12)


@pytest.mark.parametrize("alpha", [0.5, 0.7, 1.0])
def test_alpha_at_least_half_has_no_interior_optimum(alpha):
    assert closed_form_optimum(5.28, alpha, 0.1) == (0.0, 0.0)
    assert on_policy_regime(5.28, alpha, 0.1)
    k = K(np.logspace(-3, 4, 200), 5.28, alpha, 0.1)
    assert np.all(np.diff(k) > 0)  # K increases: the infimum is x -> 0
    xn, _ = numeric_optimum(5.28, 0.1, alpha=alpha, x_bounds=(1e-2, 1e3))
    assert xn == pytest.approx(1e-2, rel=1e-9)  # the lower bound
    rec = recommend(5.28, alpha, 0.1, 64)
    assert rec.on_policy and not rec.interior
    assert (rec.rollouts_per_step, rec.capacity) == (64, 64)
    assert "no interior optimum" in rec.describe()


@pytest.mark.parametrize(
    ("mu", "alpha", "rho", "what"),
    [
        (5.28, 0.0, 0.1, "alpha"),
        (5.28, -0.1, 0.1, "alpha"),
        (5.28, float("nan"), 0.1, "alpha"),
        (0.0, 0.1, 0.1, "mu"),
        (-1.0, 0.1, 0.1, "mu"),
        (5.28, 0.1, -0.01, "rho"),
        (5.28, 0.1, 1.01, "rho"),
    ],
)
def test_closed_form_rejects_bad_ranges(mu, alpha, rho, what):
    with pytest.raises(ValueError, match=what):
        closed_form_optimum(mu, alpha, rho)
    with pytest.raises(ValueError, match=what):
        recommend(mu, alpha, rho, 64)


# ---------------------------------------------------------------------------------------------
# y*(x), J*(x), the objective
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mu", "rho"), [(5.28, 0.1), (1.0, 1.0), (20.0, 0.0)])
def test_optimal_reuse_at_fixed_x_and_j_star_identity(mu, rho):
    ys = np.logspace(-3, 4, 200_001)  # step 8e-5 in log y
    for x in (0.3, 1.0, 14.3, 300.0):
        y_grid = ys[np.argmin(objective(x, ys, mu, rho, alpha=0.1))]
        y_opt = float(optimal_reuse(x, mu, rho))
        assert y_grid == pytest.approx(y_opt, rel=1e-4)
        # J(x, y*(x)) = sigma_bar^2(x) (1/sqrt(mu) + sqrt(rho + 1/x))^2 = K(x)^2 (power law).
        j = float(objective(x, y_opt, mu, rho, alpha=0.1))
        hand = x**0.2 * (1 / math.sqrt(mu) + math.sqrt(rho + 1 / x)) ** 2
        assert j == pytest.approx(hand, rel=1e-12)
        assert float(j_star(x, mu, rho, alpha=0.1)) == pytest.approx(hand, rel=1e-12)
        assert float(K(x, mu, 0.1, rho)) ** 2 == pytest.approx(hand, rel=1e-12)
        assert float(objective(x, ys, mu, rho, alpha=0.1).min()) >= j * (1 - 1e-12)


def test_objective_hand_value_and_arguments():
    # x=2, y=4, mu=5.28, rho=0.1, alpha=0.25: 2^0.5 (1 + 4/5.28)(1/4 + 1/2 + 0.1)
    hand = math.sqrt(2) * (1 + 4 / 5.28) * 0.85
    assert float(objective(2.0, 4.0, 5.28, 0.1, alpha=0.25)) == pytest.approx(hand, rel=1e-12)
    got = objective(2.0, 4.0, 5.28, 0.1, sigma_bar2=lambda x: np.sqrt(x))
    assert float(got) == pytest.approx(hand, rel=1e-12)
    grid = objective(np.array([[1.0], [2.0]]), np.array([1.0, 4.0]), 5.28, 0.1, alpha=0.25)
    assert grid.shape == (2, 2) and float(grid[1, 1]) == pytest.approx(hand, rel=1e-12)
    with pytest.raises(ValueError, match="exactly one"):
        objective(1.0, 1.0, 5.28, 0.1)
    with pytest.raises(ValueError, match="exactly one"):
        objective(1.0, 1.0, 5.28, 0.1, sigma_bar2=lambda x: x, alpha=0.1)
    with pytest.raises(ValueError, match="exactly one"):
        numeric_optimum(5.28, 0.1, sigma=lambda t: t, alpha=0.1)


# ---------------------------------------------------------------------------------------------
# Variance profiles
# ---------------------------------------------------------------------------------------------


def test_sigma_bar2_from_profile():
    x = np.array([1e-3, 0.19, 1.0, 14.3, 1e4])
    for a in (0.05, 0.1, 0.3, 0.45, 1.0):
        # (1/x) int_0^x tau^(2a) dtau = x^(2a) / (2a + 1)
        got = sigma_bar2_from_profile(lambda t, a=a: t**a, x)
        np.testing.assert_allclose(got, x ** (2 * a) / (2 * a + 1), rtol=1e-12)
    # sigma^2 = 1 + tau: (1/x)(x + x^2/2) = 1 + x/2
    got = sigma_bar2_from_profile(lambda t: np.sqrt(1 + t), x)
    np.testing.assert_allclose(got, 1 + x / 2, rtol=1e-12)
    assert float(sigma_bar2_from_profile(lambda t: t**0.1, 14.3)) > 0
    with pytest.raises(ValueError, match="x > 0"):
        sigma_bar2_from_profile(lambda t: t, 0.0)


def test_power_law_profile_gives_the_closed_form():
    # sigma(tau) = tau^a averages to x^(2a)/(2a+1): same argmin as x^(2a).
    got = numeric_optimum(5.28, 0.1, sigma=lambda t: t**0.1)
    assert got == pytest.approx(closed_form_optimum(5.28, 0.1, 0.1), rel=1e-5)


def test_non_power_law_profile():
    mu, rho = 5.28, 0.1
    # sigma^2 = 1 + tau, i.e. sigma_bar^2(x) = 1 + x/2, given either way.
    x, y = numeric_optimum(mu, rho, sigma=lambda t: np.sqrt(1 + t))
    assert (x, y) == pytest.approx(
        numeric_optimum(mu, rho, sigma_bar2=lambda v: 1 + v / 2), rel=1e-6
    )
    # Brute force on a fine grid (log steps 5e-4 in x and 2e-3 in y around the optimum).
    xs = np.logspace(-1, 2, 6001)
    ys = np.logspace(-1, 2, 1501)
    J = objective(xs[:, None], ys[None, :], mu, rho, sigma_bar2=lambda v: 1 + v / 2)
    i, j = np.unravel_index(np.argmin(J), J.shape)
    assert x == pytest.approx(xs[i], rel=2e-3) and y == pytest.approx(ys[j], rel=5e-3)
    assert y == pytest.approx(float(optimal_reuse(x, mu, rho)), rel=1e-6)  # y*(x) holds always
    # Its local exponent alpha(x) = (1/2) dlog sigma_bar^2 / dlog x = x / (2 (2 + x)) varies
    # (0.167 at x=1, 0.26 at x*): no single power law describes it. The optimum is the
    # power-law optimum at the local exponent of x* (same first-order condition) ...
    a_local = x / (2 * (2 + x))
    assert closed_form_optimum(mu, a_local, rho)[0] == pytest.approx(x, rel=1e-5)
    # ... but not that of the power law matched at x = 1 (alpha = 1/6 gives x* = 6.2 vs 2.17).
    x_fit, _ = closed_form_optimum(mu, 1 / 6, rho)
    assert abs(math.log(x_fit / x)) > 0.5


# ---------------------------------------------------------------------------------------------
# Regime and recommendation
# ---------------------------------------------------------------------------------------------


def test_on_policy_regime():
    assert on_policy_regime(1.0, 0.3, 1.0)  # y* = 0.4
    assert not on_policy_regime(5.28, 0.1, 0.1)  # y* = 5.6


def test_recommend_replay_example():
    rec = recommend(5.28, 0.1, 0.1, batch_size=64, group_size=16)
    assert isinstance(rec, Recommendation) and not rec.on_policy and rec.interior
    assert rec.x == pytest.approx(14.318992, rel=1e-6) and rec.y == pytest.approx(5.575713)
    # B/y* = 64/5.5757 = 11.48 -> multiples of 16 in [16, 64]: 16 (log dist 0.33) wins.
    assert rec.rollouts_per_step == 16
    # N = max(64, round(14.319 * 16)) = round(229.10) = 229
    assert rec.capacity == 229
    assert rec.reuse == 4.0 and rec.horizon == 229 / 16
    # J(229/16, 4) / J(1, 1) = (14.3125^0.2 (1 + 4/5.28)(1/4 + 16/229 + 0.1))
    #                          / ((1 + 1/5.28)(1 + 1 + 0.1)) = 1.25647 / 2.49773 = 0.50305
    hand = 14.3125**0.2 * (1 + 4 / 5.28) * (0.25 + 16 / 229 + 0.1) / ((1 + 1 / 5.28) * 2.1)
    assert rec.j_rel == pytest.approx(hand, rel=1e-12) and rec.j_rel == pytest.approx(
        0.50305, abs=1e-4
    )
    # mu T/W for T = 1..7 (W = 8 - T): 0.754, 1.76, 3.168, 5.28, 8.8, 15.84, 36.96 -> T = 4.
    assert (rec.workers, rec.trainers) == (4, 4)
    assert rec.async_reuse == pytest.approx(5.28)
    assert rec.gamma == pytest.approx(2 / 6.28)
    # R_a = 64 * 4 / (5.28 * 4) = 12.12; N = max(64, 16, round(14.319 * 12.12) = 174)
    assert rec.async_rollouts_per_step == pytest.approx(64 / 5.28)
    assert rec.async_capacity == 174
    text = str(rec)
    assert text == rec.describe()
    assert "buffer=fifo buffer.capacity=229 schedule.rollouts_per_step=16" in text
    assert "schedule.batch_size=64" in text and "compute.mu=5.28" in text
    assert "schedule=async schedule.gpus=8 schedule.workers=4 schedule.trainers=4" in text
    assert "buffer.capacity=174" in text
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.capacity = 1  # type: ignore[misc]


def test_recommend_on_policy_example():
    rec = recommend(1.0, 0.3, 1.0, batch_size=64, group_size=16)
    assert rec.on_policy and rec.interior and rec.y == pytest.approx(0.4)
    assert (rec.rollouts_per_step, rec.capacity) == (64, 64)
    assert (rec.reuse, rec.horizon, rec.j_rel) == (1.0, 1.0, 1.0)
    # Async aims at no reuse: mu T/W = T/W = 1 at (4, 4), gamma = (1 + 1)/(1 + 1) = 1, R_a = B.
    assert (rec.workers, rec.trainers) == (4, 4)
    assert rec.gamma == pytest.approx(1.0) and rec.async_capacity == 64
    assert "experiment=on_policy schedule.batch_size=64" in rec.describe()
    assert "buffer.capacity" not in rec.sync_overrides()


def test_recommend_async_split_mu_684():
    # alpha=0.3, rho=0.3: y* = 6.84 * 0.4 / (0.3 + sqrt(0.09 + 0.8208)) = 2.736 / 1.25436 = 2.181;
    # mu T/W: T=2 -> 13.68/6 = 2.28 (log dist 0.044), T=3 -> 4.104, T=1 -> 0.977: T = 2.
    rec = recommend(6.84, 0.3, 0.3, batch_size=64)
    assert rec.y == pytest.approx(2.1812, rel=1e-4)
    assert (rec.workers, rec.trainers) == (6, 2)
    assert rec.gamma == pytest.approx((1 + 3) / 7.84) and round(rec.gamma, 3) == 0.510
    assert rec.async_reuse == pytest.approx(2.28)
    # B/y* = 29.3 -> 32 (2 groups); N = max(64, round(0.879 * 32) = 28) = 64: reuse 2, x = 2.
    assert (rec.rollouts_per_step, rec.capacity) == (32, 64)
    # alpha=0.1, rho=0.1: y* = 5.472 / (0.1 + sqrt(0.5572)) = 6.465 -> T = 4 (mu T/W = 6.84).
    rec = recommend(6.84, 0.1, 0.1, batch_size=64)
    assert rec.y == pytest.approx(6.4646, rel=1e-4)
    assert (rec.workers, rec.trainers) == (4, 4)
    assert rec.gamma == pytest.approx(2 / 7.84)
    assert theory.async_gamma(6, 2, 6.84) == pytest.approx(0.5102, abs=1e-4)


@pytest.mark.parametrize(
    ("mu", "alpha", "rho", "B", "G"),
    [(5.28, 0.1, 0.1, 64, 16), (6.84, 0.2, 0.05, 256, 16), (2.0, 0.1, 0.3, 96, 8)],
)
def test_rounding_of_r_minimises_j_at_fixed_x(mu, alpha, rho, B, G):
    rec = recommend(mu, alpha, rho, B, G)
    choices = np.arange(G, B + 1, G)
    best = choices[np.argmin(objective(rec.x, B / choices, mu, rho, alpha=alpha))]
    assert rec.rollouts_per_step == best
    assert rec.capacity == max(B, round(rec.x * rec.rollouts_per_step))


def test_log_rounding_differs_from_linear():
    # B/y* = 23.5 between 16 and 32: linear picks 16, log picks 32 (ln(32/23.5) = 0.309 <
    # ln(23.5/16) = 0.384).
    assert theory._nearest_log([16, 32, 48, 64], 23.5) == 1


def test_recommend_rejects_bad_sizes():
    with pytest.raises(ValueError, match="multiple of group_size"):
        recommend(5.28, 0.1, 0.1, batch_size=60, group_size=16)
    with pytest.raises(ValueError, match="multiple of group_size"):
        recommend(5.28, 0.1, 0.1, batch_size=8, group_size=16)
    with pytest.raises(ValueError, match="gpus"):
        recommend(5.28, 0.1, 0.1, batch_size=64, gpus=1)


# ---------------------------------------------------------------------------------------------
# Estimating mu
# ---------------------------------------------------------------------------------------------


def test_estimate_mu_hand_numbers():
    # (6400 / 2) / (2800 / 6) = 3200 / 466.67 = 48/7 = 6.857
    assert estimate_mu(6400, 2800, workers=6, trainers=2) == pytest.approx(48 / 7)
    # A run at the first-order reuse mu T/W gives mu back: K_train/K_inf = 6.84 * 2/6.
    assert estimate_mu(6840 * 2, 6000, 6, 2) == pytest.approx(6.84)
    with pytest.raises(ValueError, match="rollouts"):
        estimate_mu(6400, 0, 6, 2)


def _write_run(run_dir, schedule: str, rows: list[dict], truncated: bool) -> None:
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(
        "schedule:\n"
        f"  name: {schedule}\n"
        "  batch_size: 64\n"
        "  workers: null\n"
        "  trainers: 2\n"
        "  gpus: 8\n"
        "compute:\n"
        "  mu: 6.84\n"
    )
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if truncated:
        text += '{"step": 40, "compute/samples_trained": 25'  # killed mid-write
    (run_dir / "metrics.jsonl").write_text(text)


def test_estimate_mu_from_run(tmp_path):
    rows = [
        {"step": 0, "eval/pass@1": 0.1},
        {"step": 10, "compute/samples_trained": 640, "compute/rollouts": 300},
        {"step": 20, "eval/pass@1": 0.2},
        {
            "step": 30,
            "compute/samples_trained": 1920,
            "compute/rollouts": 840,
            "compute/measured_mu": 3.5,
        },
    ]
    run = tmp_path / "async_run"
    _write_run(run, "async", rows, truncated=True)
    with pytest.warns(UserWarning, match="truncated"):
        est = estimate_mu_from_run(run)
    # workers = gpus - trainers = 6; (1920 / 2) / (840 / 6) = 960 / 140 = 6.857
    assert est["workers"] == 6 and est["trainers"] == 2
    assert est["mu_paper"] == pytest.approx(48 / 7)
    assert est["mu_timed"] == 3.5 and est["mu_config"] == 6.84
    assert (est["samples_trained"], est["rollouts"]) == (1920, 840)

    run = tmp_path / "sync_run"
    _write_run(run, "sync", rows[:2], truncated=False)
    est = estimate_mu_from_run(run)
    assert est["mu_paper"] is None and est["workers"] is None and est["trainers"] is None
    assert est["mu_timed"] is None and est["samples_trained"] == 640

    with pytest.raises(ValueError, match="not found"):
        estimate_mu_from_run(tmp_path / "missing")


# ---------------------------------------------------------------------------------------------
# Figures and command line
# ---------------------------------------------------------------------------------------------


def test_plot_theory(tmp_path):
    mu_grid = np.logspace(-0.5, 1.5, 12)
    paths = plot_theory(tmp_path / "fig", mu=6.84, mu_grid=mu_grid)
    names = [p.name for p in paths]
    assert names == ["theory_xy_vs_mu.png", "theory_K.png", "theory_xy_vs_mu.csv", "theory_K.csv"]
    for p in paths[:2]:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
    with open(paths[2]) as f:
        xy = list(csv.DictReader(f))
    assert list(xy[0]) == ["alpha", "rho", "mu", "x_star", "y_star", "on_policy"]
    assert len(xy) == 9 * 12  # 3 alphas x 3 rhos x 12 mu
    row = next(r for r in xy if float(r["alpha"]) == 0.1 and float(r["rho"]) == 0.1)
    x, y = closed_form_optimum(float(row["mu"]), 0.1, 0.1)
    assert float(row["x_star"]) == pytest.approx(x) and float(row["y_star"]) == pytest.approx(y)
    assert row["on_policy"] == str(int(y <= 1))
    with open(paths[3]) as f:
        k = list(csv.DictReader(f))
    assert list(k[0]) == ["alpha", "rho", "mu", "x", "K_rel"]
    assert len(k) % 9 == 0 and len(k) >= 9 * 100
    at_one = [r for r in k if float(r["x"]) == 1.0]
    assert len(at_one) == 9 and all(float(r["K_rel"]) == pytest.approx(1.0) for r in at_one)


def test_cli_prints_the_recommendation(capsys):
    main(["--mu", "5.28", "--alpha", "0.1", "--rho", "0.1", "--batch-size", "64"])
    out = capsys.readouterr().out
    assert "x* = N/R = 14.32" in out and "y* = B/R = 5.576" in out
    assert "schedule.rollouts_per_step=16" in out and "buffer.capacity=229" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["--mu", "5.28", "--alpha", "0.1", "--rho", "2", "--batch-size", "64"],
        ["--mu", "5.28", "--alpha", "0", "--rho", "0.1", "--batch-size", "64"],
        ["--mu", "abc", "--alpha", "0.1", "--rho", "0.1", "--batch-size", "64"],
        ["--alpha", "0.1", "--rho", "0.1", "--batch-size", "64"],
        ["--mu", "5.28", "--alpha", "0.1", "--rho", "0.1", "--batch-size", "60"],
    ],
)
def test_cli_errors_exit_2_with_one_line(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "error" in err


def test_cli_run_and_plot(tmp_path, capsys, monkeypatch):
    rows = [{"step": 9, "compute/samples_trained": 1920, "compute/rollouts": 840}]
    run = tmp_path / "run"
    _write_run(run, "async", rows, truncated=False)
    main(["--run", str(run), "--alpha", "0.1", "--rho", "0.1", "--batch-size", "64"])
    out = capsys.readouterr().out
    assert "paper (K_train/T)/(K_inf/W) = 6.857" in out and "timed = n/a" in out
    assert "using mu = 6.857" in out and "compute.mu=6.85714" in out
    # --mu wins over the run's estimate; --plot calls plot_theory at that mu (rendering is
    # covered by test_plot_theory).
    calls = []

    def fake_plot(out_dir, mu):
        calls.append((out_dir, mu))
        return [tmp_path / "a.png", tmp_path / "b.csv"]

    monkeypatch.setattr(theory_cli, "plot_theory", fake_plot)
    figs = str(tmp_path / "figs")
    main(
        ["--mu", "5.28", "--run", str(run), "--alpha", "0.1", "--rho", "0.1"]
        + ["--batch-size", "64", "--plot", figs]
    )
    out = capsys.readouterr().out
    assert calls == [(figs, 5.28)]
    assert "using mu" not in out and "compute.mu=5.28" in out
    assert f"wrote {tmp_path / 'a.png'}" in out and out.count("wrote ") == 2


def test_python_dash_m(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "replay_exp.theory.cli", "--mu", "1", "--alpha", "0.3", "--rho", "1"]
        + ["--batch-size", "64"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "experiment=on_policy" in proc.stdout


def test_overrides_compose_in_the_project_config():
    # compose() rejects unknown keys and wrong types (the structured schema); resolve() would
    # check the sizes too but imports torch (seconds), so it is left to the training tests.
    from replay_exp.config.composition import compose

    replay, on_policy = recommend(5.28, 0.1, 0.1, 64), recommend(1.0, 0.3, 1.0, 64)
    cfg = compose(replay.sync_overrides().split())
    assert cfg.buffer.name == "fifo" and cfg.buffer.capacity == 229
    assert cfg.schedule.rollouts_per_step == 16 and cfg.schedule.batch_size == 64
    assert cfg.algo.group_size == 16 and cfg.compute.mu == 5.28
    cfg = compose(on_policy.sync_overrides().split())
    assert cfg.buffer.name == "on_policy" and cfg.schedule.rollouts_per_step is None
    cfg = compose(replay.async_overrides().split())
    assert cfg.schedule.name == "async" and cfg.buffer.capacity == 174
    assert (cfg.schedule.gpus, cfg.schedule.workers, cfg.schedule.trainers) == (8, 4, 4)
