"""The design model (replay_exp/theory/design.py): its exact variance rate against the slow
reference and a hand-derived value, the budget arithmetic, and the search's answer when
alpha's interval does and does not contain 0."""

from __future__ import annotations

import pytest

from replay_exp.theory import design as dm
from replay_exp.theory.exact import rho_interpolated, variance_rate


def _rho(d):
    return 0.5


def test_exact_rate_by_hand_at_constant_rho():
    """x = 4, R = 8 (N = 32), y = 2, rho = 0.5, sigma flat: R V = (1 - 1/N) / y + 1/x +
    rho (1 - 1/x) = 0.484375 + 0.25 + 0.375 = 1.109375 (exact.py's closed form)."""
    assert dm.exact_rate(4, 2, 8, _rho, alpha=0.0) == pytest.approx(1.109375)


@pytest.mark.parametrize(("x", "R", "alpha"), [(4, 8, 0.0), (2.5, 8, 0.1), (40, 16, -0.05)])
def test_exact_rate_equals_the_slow_reference(x, R, alpha):
    rho = rho_interpolated([1, 4, 16], [0.9, 0.6, 0.3])
    slow = variance_rate(x, 64 / R, R, rho, sigma2=lambda a: (1 + a) ** (2 * alpha))
    assert dm.exact_rate(x, 64 / R, R, rho, alpha) == pytest.approx(slow, rel=1e-9)


def test_budget_arithmetic_by_hand():
    """B = 64, R = 16, mu = 6.84: a step is (64 + 109.44) / (64 x 7.84) = 0.345663 units, so
    3000 units are 8678 whole steps and 138,848 rollouts; on-policy's step is 1 unit."""
    assert dm.units_per_step(64, 16, 6.84) == pytest.approx(173.44 / 501.76)
    assert dm.budget_rollouts(64, 16, 6.84, 3000) == 8678 * 16
    assert dm.units_per_step(64, 64, 6.84) == pytest.approx(1.0)
    designs = dm.candidates(64, 8, 6.84, 3000)
    assert (64, 64) in designs and (8678 * 16, 16) in designs  # on-policy; never evict
    assert all(N >= 64 and R % 8 == 0 and 8 <= R <= 64 for N, R in designs)


def test_on_policy_is_one_and_the_search_admits_what_it_cannot_tell_apart():
    rho = rho_interpolated([1, 16, 256], [0.99, 0.6, 0.3])
    assert dm.relative_noise(64, 64, 64, 6.84, rho, 0.0) == {
        "exact": 1.0, "paper_gap": 1.0, "mean_gap": 0.0, "rho_gap": 1.0,
    }  # fmt: skip
    wide = dm.design(64, 8, 6.84, 3000, rho, 0.03, -0.09, 0.12, model="paper_gap")
    assert not wide.identified and len(wide.region) > 1 and wide.pick in wide.region

    # A negative alpha (noise shrinking with age) pushes the paper bound's horizon to the
    # largest buffer the budget allows; a clearly positive one to a finite horizon.
    def largest(R):
        return max(n for n, r in dm.candidates(64, 8, 6.84, 3000) if r == R)

    at_neg = dm.design(64, 8, 6.84, 3000, rho, -0.09, -0.09, -0.05, model="paper_gap")
    assert at_neg.identified and at_neg.pick[0] == largest(at_neg.pick[1])
    at_pos = dm.design(64, 8, 6.84, 3000, rho, 0.3, 0.25, 0.35, model="paper_gap")
    assert at_pos.identified and at_pos.pick[0] < largest(at_pos.pick[1])
    with pytest.raises(ValueError, match="not inside its interval"):
        dm.design(64, 8, 6.84, 3000, rho, 0.5, -0.1, 0.1)


def test_ranking_orders_by_predicted_noise():
    rho = rho_interpolated([1, 16, 256], [0.99, 0.6, 0.3])
    configs = [("on-policy", 64, 64), ("N=512, y=2", 512, 32), ("N=8192, y=4", 8192, 16)]
    ranked = dm.ranking(configs, 64, 6.84, rho, 0.0, "paper_gap")
    values = [v for _, v in ranked]
    assert values == sorted(values) and {lab for lab, _ in ranked} == {c[0] for c in configs}


def test_async_splits_by_hand():
    """B = 64, G = 8, mu = 6.84, 8 GPUs: R = 64 W / (6.84 T). W = 6, T = 2: 384 / 13.68 =
    28.07, scored at 4 groups (32); W = 5, T = 3: 320 / 20.52 = 15.59 -> 16; W = 3, T = 5: 5.61
    < G, not scored; W = 7, T = 1: 65.5 > B, left out (more than a batch a step)."""
    splits = {s.workers: s for s in dm.async_splits(64, 8, 6.84, 8)}
    assert sorted(splits) == [1, 2, 3, 4, 5, 6]
    rate = splits[6].R
    assert rate == pytest.approx(384 / 13.68) and splits[6].R_groups == 32
    assert splits[5].R_groups == 16 and splits[3].R_groups is None
    rows = dm.async_designs(64, 8, 6.84, 3000, 8)
    assert {(N, R) for s, N, R in rows if s.workers == 5} == {
        (N, R) for N, R in dm.candidates(64, 8, 6.84, 3000) if R == 16
    }
    assert not any(s.workers == 3 for s, _, _ in rows)
