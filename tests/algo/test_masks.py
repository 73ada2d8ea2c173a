"""Hand-pinned keep masks: correction_keep (none / icepop / seq_mis / geometric / opsm) and
M2PO's second-moment budget m2po_keep."""

from __future__ import annotations

import math

import pytest
import torch

from replay_exp.algo import MASKS, correction_keep, m2po_keep

NAN, INF = math.nan, math.inf
T, F = True, False

# ---------------------------------------------------------------- correction_keep

# log r = logp - behaviour per valid token (binary fractions, so exact in float32; behaviour
# -2 on valid tokens, garbage on padding), L = row sum, n = valid tokens, mean = L / n:
#   row  log r                  A     L       n  mean
#   0    [0.75, 0.25, -0.25]    +1    0.75    3  0.25
#   1    [1.0, -0.5, PAD]       -1    0.5     2  0.25
#   2    [0.5, 0.5, PAD]        +1    1.0     2  0.5
#   3    [-0.5, -0.125, PAD]    -1   -0.625   2  -0.3125
#   4    [-0.5, 0.0, PAD]       -1   -0.5     2  -0.25
#   5    [-0.75, PAD, PAD]      +2   -0.75    1  -0.75
#   6    [PAD, PAD, PAD]        -1    (empty)
LOG_R = [[0.75, 0.25, -0.25], [1.0, -0.5, 0], [0.5, 0.5, 0], [-0.5, -0.125, 0],
         [-0.5, 0.0, 0], [-0.75, 0, 0], [0, 0, 0]]  # fmt: skip
MASK = torch.tensor([[T, T, T], [T, T, F], [T, T, F], [T, T, F], [T, T, F], [T, F, F],
                     [F, F, F]])  # fmt: skip
ADV = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 2.0, -1.0])
# Bounds whose logs are the binary fractions -0.5 and 0.75 (ratios at the bound are kept).
LOW, HIGH = math.exp(-0.5), math.exp(0.75)


def _batch():
    beh = torch.full((7, 3), -2.0)
    logp = beh + torch.tensor(LOG_R)
    garbage = torch.tensor([NAN, INF, -INF, 1e4, -1e4, NAN, INF, NAN, -INF, 1e4, 1e4, NAN,
                            -INF, INF])  # fmt: skip
    pad = ~MASK
    logp[pad] = garbage[: int(pad.sum())]
    beh[pad] = garbage.flip(0)[: int(pad.sum())]
    return logp, beh


EXPECTED = {
    "none": MASK.tolist(),
    # token: -0.5 <= log r <= 0.75. row 0 t0 = 0.75 and row 1 t1 / rows 3-4 t0 = -0.5 sit on
    # the bounds (kept); row 1 t0 = 1.0 and row 5 t0 = -0.75 are outside.
    "icepop": [[T, T, T], [F, T, F], [T, T, F], [T, T, F], [T, T, F], [F, F, F], [F, F, F]],
    # row: -0.5 <= L <= 0.75: row 0 (0.75, bound) and row 4 (-0.5, bound) kept, row 1 (0.5)
    # kept although its token 1.0 is outside, row 2 (1.0) dropped although each of its tokens
    # is inside, row 3 (-0.625) and row 5 (-0.75) dropped.
    "seq_mis": [[T, T, T], [T, T, F], [F, F, F], [F, F, F], [T, T, F], [F, F, F], [F, F, F]],
    # row: exp(mean) in [0.7, 1.3]: e^0.25 = 1.284025 (rows 0, 1) kept, e^0.5 = 1.648721
    # (row 2) dropped, e^-0.3125 = 0.731616 (row 3) and e^-0.25 = 0.778801 (row 4) kept,
    # e^-0.75 = 0.472367 (row 5) dropped.
    "geometric": [[T, T, T], [T, T, F], [F, F, F], [T, T, F], [T, T, F], [F, F, F], [F, F, F]],
    # drop iff A < 0 and -mean > 0.25: row 3 (A = -1, 0.3125) only. Row 4 sits on the bound
    # (-mean = 0.25, kept); row 1 (A < 0) moved towards pi (-mean = -0.25); row 5 has
    # -mean = 0.75 but A > 0.
    "opsm": [[T, T, T], [T, T, F], [T, T, F], [F, F, F], [T, T, F], [T, F, F], [F, F, F]],
}
PARAMS = {"low": LOW, "high": HIGH, "geo_delta": 0.3, "opsm_delta": 0.25}


@pytest.mark.parametrize("kind", MASKS)
def test_correction_keep_hand_batch(kind):
    logp, beh = _batch()
    keep = correction_keep(logp, beh, ADV, MASK, kind, **PARAMS)
    assert keep.dtype == torch.bool and keep.shape == (7, 3)
    assert keep.tolist() == EXPECTED[kind]
    assert not (keep & ~MASK).any()  # padding is never kept


def test_expected_masks_differ_between_kinds():
    # the hand batch tells every kind apart (a kind mixed up with another would fail above)
    seen = [tuple(map(tuple, v)) for v in EXPECTED.values()]
    assert len(set(seen)) == len(MASKS)


def test_none_keeps_exactly_the_mask():
    logp, beh = _batch()
    keep = correction_keep(logp, beh, ADV, MASK.to(torch.uint8), "none")
    assert keep.dtype == torch.bool and torch.equal(keep, MASK)
    mask = MASK.clone()
    keep = correction_keep(logp, beh, ADV, mask, "none")
    keep[0, 0] = False  # a copy, not the caller's mask
    assert mask[0, 0]


@pytest.mark.parametrize("kind", MASKS)
def test_rows_are_independent(kind):
    logp, beh = _batch()
    whole = correction_keep(logp, beh, ADV, MASK, kind, **PARAMS)
    for a, b in [(0, 2), (2, 5), (5, 7), (3, 4)]:
        part = correction_keep(logp[a:b], beh[a:b], ADV[a:b], MASK[a:b], kind, **PARAMS)
        assert torch.equal(part, whole[a:b])


@pytest.mark.parametrize("kind", MASKS)
def test_on_policy_keeps_every_valid_token_with_default_parameters(kind):
    g = torch.Generator().manual_seed(1)
    logp = -3.0 * torch.rand(5, 4, generator=g)
    mask = torch.rand(5, 4, generator=g) > 0.3
    adv = torch.tensor([-2.0, -0.5, 0.0, 0.5, 2.0])
    beh = torch.where(mask, logp, torch.full_like(logp, NAN))
    assert torch.equal(correction_keep(logp, beh, adv, mask, kind), mask)


def test_icepop_and_seq_mis_default_bounds_are_inclusive():
    # behaviour 0, logp = log r (float32): r = 0.5 and 5 (the defaults) kept, 0.499 and 5.01
    # not. One token per row, so token and sequence rules agree here.
    logp = torch.tensor([[math.log(0.5)], [math.log(5.0)], [math.log(0.499)], [math.log(5.01)]])
    mask = torch.ones(4, 1, dtype=torch.bool)
    adv = torch.ones(4)
    for kind in ("icepop", "seq_mis"):
        keep = correction_keep(logp, torch.zeros(4, 1), adv, mask, kind)
        assert keep.squeeze(1).tolist() == [T, T, F, F], kind


def test_geometric_uses_the_geometric_mean_ratio():
    # default delta 0.02: keep iff exp(mean log r) in [0.98, 1.02]
    #   row 0: log r [0.2, -0.2] -> exp(0) = 1, kept (the arithmetic mean of the ratios,
    #          cosh(0.2) = 1.020067, would be outside)
    #   row 1: log r 0.015 x4 -> e^0.015 = 1.015113 kept (W = e^0.06 = 1.061837 is not used)
    #   row 2: log r 0.03 -> 1.030455 dropped; row 3: -0.0205 -> 0.979709 dropped;
    #   row 4: -0.0195 -> 0.980689 kept
    log_r = torch.tensor([[0.2, -0.2, 0, 0], [0.015] * 4, [0.03, 0, 0, 0], [-0.0205, 0, 0, 0],
                          [-0.0195, 0, 0, 0]])  # fmt: skip
    mask = torch.tensor([[T, T, F, F], [T] * 4, [T, F, F, F], [T, F, F, F], [T, F, F, F]])
    keep = correction_keep(log_r - 1.0, torch.full((5, 4), -1.0), torch.ones(5), mask, "geometric")
    assert keep.any(dim=1).tolist() == [T, T, F, F, T]
    assert torch.equal(keep, mask & keep.any(dim=1, keepdim=True))  # whole rows
    # delta 0: only an exactly on-policy row (exp(0) = 1 = 1 - 0 = 1 + 0) survives
    on = torch.tensor([[0.0, 0.0], [2.0**-10, 0.0]])
    keep = correction_keep(on, torch.zeros(2, 2), torch.ones(2), torch.ones(2, 2) > 0,
                           "geometric", geo_delta=0.0)  # fmt: skip
    assert keep.tolist() == [[T, T], [F, F]]


def test_opsm_default_delta():
    # delta 1e-4: mean log r -1e-3 (-mean = 1e-3 > 1e-4) drops a row only when A < 0;
    # -5e-5 (5e-5 <= 1e-4) is kept; A = 0 is not negative.
    log_r = torch.tensor([[-1e-3], [-5e-5], [-1e-3], [-1e-3]])
    adv = torch.tensor([-1.0, -1.0, 1.0, 0.0])
    keep = correction_keep(log_r, torch.zeros(4, 1), adv, torch.ones(4, 1) > 0, "opsm")
    assert keep.squeeze(1).tolist() == [F, T, T, T]


def test_correction_keep_is_detached_and_validates_kind():
    logp = torch.tensor([[-1.0]], requires_grad=True)
    keep = correction_keep(logp, torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1) > 0, "icepop")
    assert not keep.requires_grad
    with pytest.raises(ValueError, match="'tis'.*icepop"):
        correction_keep(logp, torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1) > 0, "tis")


# ---------------------------------------------------------------- m2po_keep

# log r (garbage on padding):
#   row 0: [0.5, -0.25, PAD]  -> m = (log r)^2 = [0.25, 0.0625]
#   row 1: [0.125, 1.0, PAD]  -> m = [0.015625, 1.0]
#   row 2: [-0.5, PAD, PAD]   -> m = [0.25]
# n = 5; sorted ascending (stable): 0.015625 (r1t0), 0.0625 (r0t1), 0.25 (r0t0), 0.25 (r2t0),
# 1.0 (r1t1); cumsum [0.015625, 0.078125, 0.328125, 0.578125, 1.578125];
# prefix means cumsum_k / k = [0.015625, 0.0390625, 0.109375, 0.14453125, 0.315625].
# k = the number of prefix means before the first one above the threshold.
M2_LOG_R = torch.tensor([[0.5, -0.25, NAN], [0.125, 1.0, INF], [-0.5, -INF, 1e4]])
M2_MASK = torch.tensor([[T, T, F], [T, T, F], [T, F, F]])
M2_CASES = [
    # threshold, k, kept
    (0.32, 5, [[T, T, F], [T, T, F], [T, F, F]]),  # above the overall mean 0.315625: all
    (0.145, 4, [[T, T, F], [T, F, F], [T, F, F]]),  # 0.14453 <= 0.145 < 0.3156: drop 1.0
    # 0.1094 <= 0.12 < 0.1445: the two smallest and the FIRST of the tied 0.25s (r0t0)
    (0.12, 3, [[T, T, F], [T, F, F], [F, F, F]]),
    (0.109375, 3, [[T, T, F], [T, F, F], [F, F, F]]),  # exactly prefix_3: kept (<=)
    (0.1, 2, [[F, T, F], [T, F, F], [F, F, F]]),  # 0.0391 <= 0.1 < 0.1094
    (0.0390625, 2, [[F, T, F], [T, F, F], [F, F, F]]),  # exactly prefix_2
    (0.02, 1, [[F, F, F], [T, F, F], [F, F, F]]),
    (0.01, 0, [[F, F, F], [F, F, F], [F, F, F]]),  # below the smallest 0.015625: none
    (0.0, 0, [[F, F, F], [F, F, F], [F, F, F]]),
]


@pytest.mark.parametrize(("threshold", "k", "kept"), M2_CASES)
def test_m2po_keep_hand_example(threshold, k, kept):
    keep = m2po_keep(M2_LOG_R, M2_MASK, threshold)
    assert keep.dtype == torch.bool
    assert keep.tolist() == kept
    assert int(keep.sum()) == k
    if k:  # the kept tokens' mean (log r)^2 is within the budget
        assert M2_LOG_R[keep].square().mean().item() <= threshold


def test_m2po_keep_ties_drop_exactly_n_minus_k():
    # log r [[0.5, -0.5, 0], [0.5, -0.5, PAD]] -> m [0.25, 0.25, 0 | 0.25, 0.25], four ties.
    # sorted: 0 (r0t2), then the tied 0.25s in batch order r0t0, r0t1, r1t0, r1t1;
    # prefix means [0, 0.125, 0.166667, 0.1875, 0.2].
    log_r = torch.tensor([[0.5, -0.5, 0.0], [0.5, -0.5, NAN]])
    mask = torch.tensor([[T, T, T], [T, T, F]])
    # 0.17: 0.1875 is the first over -> k = 3: 0 and the first two ties; 2 of the 4 ties drop
    keep = m2po_keep(log_r, mask, 0.17)
    assert keep.tolist() == [[T, T, T], [F, F, F]]
    # 0.125 (exactly prefix_2): k = 2 -> 0 and one tie (r0t0); 3 ties drop
    keep = m2po_keep(log_r, mask, 0.125)
    assert keep.tolist() == [[T, F, T], [F, F, F]]
    # 0.2 = the overall mean: k = 5
    assert torch.equal(m2po_keep(log_r, mask, 0.2), mask)


def test_m2po_keep_is_a_batch_budget_not_a_row_rule():
    # the whole batch at 0.12 keeps r0t0 (see M2_CASES); row 0 alone has prefix means
    # [0.0625, 0.15625] and loses it
    assert m2po_keep(M2_LOG_R, M2_MASK, 0.12)[0].tolist() == [T, T, F]
    assert m2po_keep(M2_LOG_R[:1], M2_MASK[:1], 0.12).tolist() == [[F, T, F]]


def test_m2po_keep_empty_and_validation():
    assert not m2po_keep(torch.full((2, 3), NAN), torch.zeros(2, 3) > 0, 0.04).any()
    assert m2po_keep(torch.zeros(0, 3), torch.zeros(0, 3) > 0, 0.04).shape == (0, 3)
    lr = torch.tensor([[0.3]], requires_grad=True)
    assert not m2po_keep(lr, torch.ones(1, 1) > 0, 0.04).requires_grad
    with pytest.raises(ValueError, match="threshold"):
        m2po_keep(torch.zeros(1, 1), torch.ones(1, 1) > 0, -0.01)
