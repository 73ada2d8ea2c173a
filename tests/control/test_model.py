"""The model-based policy: alpha from the trained rows' importance weights, and the design it
picks (replay_exp/control/model.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from replay_exp.control import model
from replay_exp.theory.design import candidates, design

NOISE = Path(__file__).parents[2] / "analysis/results/theory_vs_experiment/rho_long/noise.json"


def test_alpha_of_one_bin_by_hand():
    # One step, two rows of age 1 with w = 1 and 3 (log w = 0, log 3), one fresh row (age 0,
    # not used): inflation n sum w^2 / (sum w)^2 = 2 (1 + 9) / 16 = 1.25 at x = 2 log(1 + 1),
    # so alpha = log 1.25 / (2 log 2) = 0.16096.
    rows = [(np.array([0, 1, 1]), np.array([0.0, 0.0, math.log(3)]))]
    alpha, lo, hi, aged = model.estimate_alpha(rows, np.random.default_rng(0), 20)
    assert alpha == pytest.approx(math.log(1.25) / (2 * math.log(2)))
    assert aged == 2
    assert lo == pytest.approx(alpha) and hi == pytest.approx(alpha)  # one step: no spread


def test_alpha_pools_bins_and_steps_weighted_by_rows():
    # Step 1: ages 2, 3 (bin floor(log2) = 1, mean age 2.5) with w = 1, 1: inflation 1, y = 0,
    # x = 2 log 3.5. Step 2: ages 4, 4, 4, 4 (bin 2) with w = 1, 1, 1, 3: inflation
    # 4 (3 + 9) / 36 = 4/3, x = 2 log 5. Fit through the origin weighted by rows (2 and 4):
    # alpha = (2 x1 0 + 4 x2 log(4/3)) / (2 x1^2 + 4 x2^2).
    rows = [
        (np.array([2, 3]), np.zeros(2)),
        (np.array([4, 4, 4, 4]), np.log([1.0, 1.0, 1.0, 3.0])),
    ]
    alpha, lo, hi, aged = model.estimate_alpha(rows, np.random.default_rng(0), 200)
    x1, x2 = 2 * math.log(3.5), 2 * math.log(5)
    want = 4 * x2 * math.log(4 / 3) / (2 * x1**2 + 4 * x2**2)
    assert alpha == pytest.approx(want)
    assert aged == 6
    # resampling the two steps gives 0 (step 1 twice), alpha, or log(4/3) / x2 (step 2 twice)
    assert 0.0 <= lo <= alpha <= hi <= math.log(4 / 3) / x2 + 1e-12


def test_no_aged_pair_gives_no_estimate():
    # fresh rows only, and one lone aged row per bin: nothing to fit
    rows = [(np.array([0, 0, 1]), np.zeros(3)), (np.array([5]), np.zeros(1))]
    alpha, lo, hi, aged = model.estimate_alpha(rows, np.random.default_rng(0), 10)
    assert math.isnan(alpha) and math.isnan(lo) and math.isnan(hi)
    assert aged == 2


def rho(delta: float) -> float:  # a hand-made correlation: 0.99 at one step, falling with the gap
    return 0.99 * math.exp(-delta / 200.0)


def test_an_identified_alpha_goes_to_the_design_models_pick():
    args = dict(B=64, G=8, mu=6.84, budget=300.0, rho=rho)
    res = design(args["B"], args["G"], args["mu"], args["budget"], rho, 0.05, 0.03, 0.07,
                 model="paper_gap", n_alpha=5)  # fmt: skip
    got, identified, reason, gain = model.pick_design(
        (64, 64), **args, alpha=0.05, lo=0.03, hi=0.07, model="paper_gap", R_min=8,
        N_max=10**9,
    )  # fmt: skip
    assert identified and got == res.pick and reason.startswith("identified")
    # on-policy (N = R = B) scores J / J_on-policy = 1, so the gain is 1 - J(pick)
    assert gain == pytest.approx(1 - res.table[res.pick][res.alphas.index(0.05)])


def test_an_unidentified_alpha_holds_inside_the_region_else_goes_to_its_nearest():
    # The embedded default's measured rho (the adaptive controller's default input) and the
    # offline alpha interval [-0.087, 0.120]: paper_gap cannot tell several designs apart.
    measured = model.load_rho(str(NOISE))
    args = dict(B=64, G=8, mu=6.84, budget=300.0, rho=measured, alpha=0.032, lo=-0.087,
                hi=0.12, model="paper_gap", R_min=8, N_max=10**9)  # fmt: skip
    res = design(64, 8, 6.84, 300.0, measured, 0.032, -0.087, 0.12, model="paper_gap", n_alpha=5)
    assert not res.identified and len(res.region) > 1
    inside = res.region[0]
    got, identified, reason, gain = model.pick_design(inside, **args)
    assert (got, identified, gain) == (inside, False, 0.0) and "hold" in reason
    # a design outside the region moves to the member nearest in log R, then log N
    outside = (64, 64) if (64, 64) not in res.region else (128, 64)
    got, _, reason, _ = model.pick_design(outside, **args)
    nearest = min(res.region, key=lambda d: (abs(math.log(d[1] / outside[1])),
                                            abs(math.log(d[0] / outside[0]))))  # fmt: skip
    assert got == nearest and "nearest" in reason


def test_with_r_fixed_only_the_designs_at_the_current_r_compete():
    # schedule=async: R emerges from W, T and mu, so the pick keeps R = 16 (N alone moves)
    # while the free search at the same alpha picks another R.
    args = dict(B=64, G=8, mu=6.84, budget=300.0, rho=rho, alpha=0.05, lo=0.03, hi=0.07,
                model="paper_gap", R_min=8, N_max=10**9)  # fmt: skip
    free, *_ = model.pick_design((64, 16), **args)
    fixed, identified, _, gain = model.pick_design((64, 16), **args, fixed_R=True)
    assert free[1] != 16
    assert fixed[1] == 16 and fixed[0] != 64 and identified and gain > 0
    at_r = [d for d in candidates(64, 8, 6.84, 300.0) if d[1] == 16]
    res = design(64, 8, 6.84, 300.0, rho, 0.05, 0.03, 0.07, model="paper_gap", n_alpha=5,
                 designs=at_r)  # fmt: skip
    assert fixed == res.pick
