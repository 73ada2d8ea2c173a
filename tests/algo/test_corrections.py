"""Hand-pinned numbers for the stale-data correction losses: CISPO, GSPO, TOPR, M2PO.

Every hand example has 3 rows of uneven length whose padding holds garbage (nan, +-inf, 1e4)
in logp, behaviour and ref; it must reach neither the loss, the gradient, nor the stats.
Conventions: ``log r = logp - behaviour``; the gradients are d(loss)/d(logp) of a leaf logp, and
for a per-token term ``f_t`` aggregated with the row weight ``a_i`` (``_row_weights``:
token_mean 1/N, seq_mean 1/(n_i * rows), seq_sum_norm 1/(B * norm_len)) the loss is
``-sum_i a_i sum_t f_t``.
"""

from __future__ import annotations

import math

import pytest
import torch

from replay_exp.algo import (
    AGG_MODES,
    agg_denominator,
    cispo_loss,
    grpo_loss,
    gspo_loss,
    kl_k3,
    m2po_keep,
    m2po_loss,
    topr_loss,
)
from replay_exp.algo.dppo import dppo_loss
from replay_exp.algo.gmpo import gmpo_loss
from replay_exp.algo.sapo import sapo_loss

E = math.exp
NAN, INF = math.nan, math.inf
AGG_CASES = [("token_mean", None), ("seq_mean", None), ("seq_sum_norm", 4)]


def _row_weights(mask_BxC, agg, norm_len=None):
    """What aggregate multiplies row i's SUM of per-token terms by, written out by hand:
    token_mean 1/N (N valid tokens), seq_mean 1/(n_i * number of non-empty rows),
    seq_sum_norm 1/(B * norm_len). Returned as a (B, 1) column."""
    n = [int(row.sum()) for row in mask_BxC]
    if agg == "token_mean":
        w = [1.0 / sum(n)] * len(n)
    elif agg == "seq_mean":
        rows = sum(1 for k in n if k > 0)
        w = [1.0 / (k * rows) if k else 0.0 for k in n]
    else:
        w = [1.0 / (len(n) * norm_len)] * len(n)
    return torch.tensor(w).unsqueeze(1)


def _ref_aggregate(x_BxC, mask_BxC, agg, norm_len=None):
    """Aggregation written out as sum_i a_i sum_t x_it (x must be finite on valid tokens)."""
    zero = torch.zeros((), dtype=torch.float32)
    return (torch.where(mask_BxC, x_BxC, zero) * _row_weights(mask_BxC, agg, norm_len)).sum()


def _assert_grad(grad, expected):
    torch.testing.assert_close(grad, torch.tensor(expected), atol=1e-6, rtol=1e-5)
    assert torch.isfinite(grad).all()


# ================================================================ CISPO
# eps_low 0.5, eps_high 0.28: weight w = sg(clip(r, 0.5, 1.28)); term w * A * logp.
#   row 0, A = +2: logp [-0.5, -1.0, -2.0], behaviour [-0.6, -1.5, -1.9]
#     log r [0.1, 0.5, -0.1] -> r [1.105171, 1.648721 (> 1.28: w = 1.28), 0.904837]
#     terms 1.105171*2*(-0.5) = -1.105171, 1.28*2*(-1) = -2.56, 0.904837*2*(-2) = -3.619350
#   row 1, A = -1: logp [-0.2, -3.0, PAD], behaviour [-0.2, -2.0, PAD]
#     log r [0, -1] -> r [1, 0.367879 (< 0.5: w = 0.5)]; terms 1*(-1)*(-0.2) = 0.2, 0.5*3 = 1.5
#   row 2, A = 0.5: logp [-0.7, PAD, PAD], behaviour [-0.4, ...]
#     log r -0.3 -> r = w = 0.740818; term 0.740818*0.5*(-0.7) = -0.259286
#   sum = -1.105171 - 2.56 - 3.619350 + 0.2 + 1.5 - 0.259286 = -5.843807
# d term / d logp = w * A (w is a constant): [2.210342, 2.56, 1.809675 | -1, -0.5 | 0.370409];
# unlike PPO's clip, the clipped tokens (row 0 t1, row 1 t1) keep a gradient.
CISPO_LOGP = [[-0.5, -1.0, -2.0], [-0.2, -3.0, NAN], [-0.7, -INF, 1e4]]
CISPO_BEH = [[-0.6, -1.5, -1.9], [-0.2, -2.0, 1e4], [-0.4, NAN, -INF]]
CISPO_ADV = [2.0, -1.0, 0.5]
MASK_332 = torch.tensor([[True, True, True], [True, True, False], [True, False, False]])
CISPO_W = [[E(0.1), 1.28, E(-0.1)], [1.0, 0.5, 0.0], [E(-0.3), 0.0, 0.0]]
CISPO_LOSS = {
    "token_mean": 5.843807 / 6,  # 0.973968
    # row means [-7.284521/3, 1.7/2, -0.259286] = [-2.428174, 0.85, -0.259286], / 3 rows
    # -> -(-1.837460)/3 = 0.612487
    "seq_mean": 0.612487,
    "seq_sum_norm": 5.843807 / 12,  # B * norm_len = 3 * 4
}


@pytest.mark.parametrize(("agg", "norm_len"), AGG_CASES)
def test_cispo_hand_value_and_gradient(agg, norm_len):
    logp = torch.tensor(CISPO_LOGP, requires_grad=True)
    loss, stats = cispo_loss(
        logp, torch.tensor(CISPO_BEH), torch.tensor(CISPO_ADV), MASK_332,
        eps_low=0.5, eps_high=0.28, agg=agg, norm_len=norm_len,
    )  # fmt: skip
    assert loss.item() == pytest.approx(CISPO_LOSS[agg], abs=1e-6)
    assert stats["pg_loss"] == pytest.approx(CISPO_LOSS[agg], abs=1e-6)
    loss.backward()
    # grad = -a_i * w * A; token_mean: -[2.210342, 2.56, 1.809675 | -1, -0.5 | 0.370409] / 6
    expected = -_row_weights(MASK_332, agg, norm_len) * torch.tensor(CISPO_W)
    expected = expected * torch.tensor(CISPO_ADV).unsqueeze(1)
    _assert_grad(logp.grad, expected.tolist())
    assert logp.grad[1, 2] == 0 and logp.grad[2, 1] == 0 and logp.grad[2, 2] == 0
    if agg == "token_mean":
        _assert_grad(logp.grad, [[-0.368390, -0.426667, -0.301612], [1 / 6, 0.5 / 6, 0.0],
                                 [-0.061735, 0.0, 0.0]])  # fmt: skip
    # stats: row 0 t1 clipped high, row 1 t1 clipped low -> clip_frac 2/6
    # weight_mean = (1.105171 + 1.28 + 0.904837 + 1 + 0.5 + 0.740818) / 6 = 5.530826/6
    # ratio_mean (unclipped) = (1.105171 + 1.648721 + 0.904837 + 1 + 0.367879 + 0.740818) / 6
    assert stats["clip_frac"] == pytest.approx(2 / 6)
    assert stats["clip_frac_low"] == pytest.approx(1 / 6)
    assert stats["clip_frac_high"] == pytest.approx(1 / 6)
    assert stats["weight_mean"] == pytest.approx(0.921804, abs=1e-6)
    assert stats["ratio_mean"] == pytest.approx(0.961238, abs=1e-6)
    assert stats["ratio_min"] == pytest.approx(E(-1), abs=1e-6)
    assert stats["ratio_max"] == pytest.approx(E(0.5), abs=1e-6)
    assert all(math.isfinite(v) for v in stats.values())


def test_cispo_default_bounds_never_clip_low():
    # defaults eps_low = 1 (lower bound 0), eps_high = 0.28: r = e^-1 = 0.367879 keeps its
    # weight, r = e^0.5 is cut to 1.28. One token per row, A = 1, logp = log r (behaviour 0):
    # loss = -(0.367879*(-1) + 1.28*0.5)/2 = -(0.272121)/2 = -0.136061; grad = -[0.367879, 1.28]/2
    logp = torch.tensor([[-1.0], [0.5]], requires_grad=True)
    loss, stats = cispo_loss(logp, torch.zeros(2, 1), torch.ones(2), torch.ones(2, 1) > 0)
    assert loss.item() == pytest.approx(-0.136061, abs=1e-6)
    assert stats["clip_frac_low"] == 0.0 and stats["clip_frac_high"] == 0.5
    loss.backward()
    _assert_grad(logp.grad, [[-E(-1) / 2], [-0.64]])


# ================================================================ GSPO
# eps 0.2 / 0.2; s_i = exp(L_i / n_i); every valid token of row i has the term
# min(s_i A_i, clip(s_i, 0.8, 1.2) A_i); where the clip does not bind,
# d(row sum)/d logp_t = n_i * A_i * s_i / n_i = A_i s_i for EVERY token of the row.
#   row 0, A = +1: log r [0.3, 0.1] -> L = 0.4, n = 2, s = e^0.2 = 1.221403 > 1.2 -> clipped:
#     term 1.2 (x2 tokens), zero gradient
#   row 1, A = -1: log r [0.2, -0.5, 0.0] -> L = -0.3, n = 3, s = e^-0.1 = 0.904837 (inside):
#     term -0.904837 (x3), d(row sum)/d logp_t = -0.904837
#   row 2, A = +2: log r [-0.4] -> s = e^-0.4 = 0.670320 < 0.8 but A > 0, the clip does not
#     bind: min(1.340640, 1.6) = 1.340640; d/d logp = 2 * 0.670320 = 1.340640
# token_mean: sum = 2*1.2 - 3*0.904837 + 1.340640 = 1.026128 -> loss -1.026128/6 = -0.171021
#   grad [0, 0 | 0.904837/6 = 0.150806 (x3) | -1.340640/6 = -0.223440]
# seq_mean: row means [1.2, -0.904837, 1.340640] -> loss -(1.635803)/3 = -0.545268
#   grad [0, 0 | 0.904837/(3*3) = 0.100537 (x3) | -1.340640/(1*3) = -0.446880]
GSPO_LOGP = [[-0.7, -1.9, NAN], [-1.0, -1.5, -0.3], [-1.4, INF, 1e4]]
GSPO_BEH = [[-1.0, -2.0, -INF], [-1.2, -1.0, -0.3], [-1.0, NAN, NAN]]
GSPO_ADV = [1.0, -1.0, 2.0]
MASK_232 = torch.tensor([[True, True, False], [True, True, True], [True, False, False]])
# d(row sum)/d logp_t, per row: [0 (clipped), A s = -e^-0.1, A s = 2 e^-0.4]
GSPO_DROW = [0.0, -E(-0.1), 2 * E(-0.4)]
GSPO_LOSS = {"token_mean": -0.171021, "seq_mean": -0.545268, "seq_sum_norm": -1.026128 / 12}


@pytest.mark.parametrize(("agg", "norm_len"), AGG_CASES)
def test_gspo_hand_value_and_gradient(agg, norm_len):
    logp = torch.tensor(GSPO_LOGP, requires_grad=True)
    loss, stats = gspo_loss(
        logp, torch.tensor(GSPO_BEH), torch.tensor(GSPO_ADV), MASK_232,
        eps_low=0.2, eps_high=0.2, agg=agg, norm_len=norm_len,
    )  # fmt: skip
    assert loss.item() == pytest.approx(GSPO_LOSS[agg], abs=1e-6)
    loss.backward()
    expected = -_row_weights(MASK_232, agg, norm_len) * torch.tensor(GSPO_DROW).unsqueeze(1)
    _assert_grad(logp.grad, (expected * MASK_232).tolist())
    assert torch.equal(logp.grad[0], torch.zeros(3))  # the clipped row: exactly zero
    if agg == "token_mean":
        _assert_grad(logp.grad, [[0.0] * 3, [0.150806] * 3, [-0.223440, 0.0, 0.0]])
    if agg == "seq_mean":
        _assert_grad(logp.grad, [[0.0] * 3, [0.100537] * 3, [-0.446880, 0.0, 0.0]])
    # clip_frac counts tokens: row 0's 2 of 6; seq ratios [1.221403, 0.904837, 0.670320]
    # -> mean 2.796560/3 = 0.932187
    assert stats["clip_frac"] == pytest.approx(2 / 6)
    assert stats["seq_ratio_mean"] == pytest.approx(0.932187, abs=1e-6)
    assert stats["seq_ratio_min"] == pytest.approx(E(-0.4), abs=1e-6)
    assert stats["seq_ratio_max"] == pytest.approx(E(0.2), abs=1e-6)
    assert all(math.isfinite(v) for v in stats.values())


def test_gspo_seq_ratio_stats_skip_empty_rows():
    # row 1 is all padding (its s would be exp(0/1) = 1): the stats are over row 0 only,
    # s = exp((0.5 + 0.1)/2) = e^0.3 = 1.349859
    logp = torch.tensor([[0.5, 0.1], [NAN, NAN]])
    mask = torch.tensor([[True, True], [False, False]])
    _, stats = gspo_loss(logp, torch.zeros(2, 2), torch.tensor([1.0, 1.0]), mask)
    assert stats["seq_ratio_mean"] == pytest.approx(E(0.3), abs=1e-6)
    assert stats["seq_ratio_min"] == pytest.approx(E(0.3), abs=1e-6)
    assert stats["seq_ratio_max"] == pytest.approx(E(0.3), abs=1e-6)


# ================================================================ TOPR
# baseline b = 0.5, rewards [1, 0, 0] -> c = [+0.5, -0.5, -0.5]; per token coef * logp with
# coef = c if c > 0 else sg(clip(W, 0, 1)) * c, W = exp(L) (row's sum of log r).
#   row 0 (c > 0): logp [-0.5, -1.5], log r [-0.3, 0.1] (W = e^-0.2 = 0.818731 < 1 is NOT
#     applied to a positive row): coef 0.5
#     terms [-0.25, -0.75]
#   row 1 (c < 0): logp [-1.0, -2.0], log r [-0.2, -0.3] -> W = e^-0.5 = 0.606531 (< 1, tapered)
#     coef = -0.5 * 0.606531 = -0.303265; terms [0.303265, 0.606531]
#   row 2 (c < 0): logp [-3.0], log r 0.4 -> W = e^0.4 = 1.491825 -> clip to 1: coef -0.5;
#     term 1.5
# token_mean: sum = -1.0 + 0.909796 + 1.5 = 1.409796 -> loss -1.409796/5 = -0.281959
#   grad = -coef/5 = [-0.1, -0.1 | 0.060653, 0.060653 | 0.1]
# seq_mean: row means [-0.5, 0.454898, 1.5] -> loss -1.454898/3 = -0.484966
TOPR_LOGP = [[-0.5, -1.5, 1e4], [-1.0, -2.0, NAN], [-3.0, -INF, NAN]]
TOPR_BEH = [[-0.2, -1.6, NAN], [-0.8, -1.7, INF], [-3.4, 1e4, -INF]]
TOPR_REWARD = [1.0, 0.0, 0.0]
MASK_221 = torch.tensor([[True, True, False], [True, True, False], [True, False, False]])
TOPR_COEF = [0.5, -0.5 * E(-0.5), -0.5]
TOPR_LOSS = {"token_mean": -0.281959, "seq_mean": -0.484966, "seq_sum_norm": -1.409796 / 12}


@pytest.mark.parametrize(("agg", "norm_len"), AGG_CASES)
def test_topr_hand_value_and_gradient(agg, norm_len):
    logp = torch.tensor(TOPR_LOGP, requires_grad=True)
    loss, stats = topr_loss(
        logp, torch.tensor(TOPR_BEH), torch.tensor(TOPR_REWARD), MASK_221,
        baseline=0.5, agg=agg, norm_len=norm_len,
    )  # fmt: skip
    assert loss.item() == pytest.approx(TOPR_LOSS[agg], abs=1e-6)
    loss.backward()
    expected = -_row_weights(MASK_221, agg, norm_len) * torch.tensor(TOPR_COEF).unsqueeze(1)
    _assert_grad(logp.grad, (expected * MASK_221).tolist())
    if agg == "token_mean":
        _assert_grad(logp.grad, [[-0.1, -0.1, 0.0], [0.060653, 0.060653, 0.0], [0.1, 0.0, 0.0]])
    # pos_frac 1/3; taper over the negative rows [0.606531, 1] -> mean 0.803265; 1 of 2 tapered
    assert stats["pos_frac"] == pytest.approx(1 / 3)
    assert stats["taper_mean"] == pytest.approx(0.803265, abs=1e-6)
    assert stats["tapered_frac"] == pytest.approx(0.5)
    assert all(math.isfinite(v) for v in stats.values())


def test_topr_no_negative_rows_stats():
    # all rewards above the baseline: taper_mean is 1.0 (none), tapered_frac 0, pos_frac 1
    logp = torch.tensor([[-1.0], [-2.0]])
    _, stats = topr_loss(logp, logp - 1.0, torch.tensor([1.0, 1.0]), torch.ones(2, 1) > 0)
    assert stats["pos_frac"] == 1.0
    assert stats["taper_mean"] == 1.0 and stats["tapered_frac"] == 0.0


# ================================================================ M2PO
# threshold 0.12; log r exact binary fractions so every (log r)^2 and prefix mean is exact:
#   row 0, A = 1:  log r [0.5, -0.25]   -> m [0.25, 0.0625]
#   row 1, A = -2: log r [0.125, 1.0]   -> m [0.015625, 1.0]
#   row 2, A = 0.5: log r [-0.5]        -> m [0.25]
# sorted m [0.015625 (r1t0), 0.0625 (r0t1), 0.25 (r0t0), 0.25 (r2t0), 1.0 (r1t1)]
# cumsum [0.015625, 0.078125, 0.328125, 0.578125, 1.578125]
# prefix means [0.015625, 0.0390625, 0.109375, 0.14453125, 0.315625]: the 4th exceeds 0.12,
# so k = 3 are kept: r1t0, r0t1 and r0t0 (of the tied 0.25s the first in batch order);
# r2t0 and r1t1 are dropped (row 2 entirely).
# The kept tokens' unclipped term r * A: row 0 [e^0.5 = 1.648721, e^-0.25 = 0.778801],
#   row 1 t0 -2 * e^0.125 = -2.266297 (sum 0.161225); d/d logp = r * A (no clip: row 0 t0's
#   r = 1.65 would be clipped by PPO, here it keeps its gradient).
# token_mean (N = 5 valid tokens, dropped ones count): loss -0.161225/5 = -0.032245
#   grad -r A / 5 = [-0.329744, -0.155760 | 0.453259, 0 | 0]
# seq_mean: a dropped token leaves the row like padding, so row 1's mean is over its 1 kept
#   token and row 2 (nothing kept) contributes 0 but still counts among the 3 rows:
#   (1.213761 - 2.266297 + 0)/3 = -0.350845 -> loss 0.350845
M2PO_LOGP = [[-0.5, -1.25, NAN], [-1.875, -1.0, INF], [-1.5, -INF, 1e4]]
M2PO_BEH = [[-1.0, -1.0, 1e4], [-2.0, -2.0, NAN], [-1.0, NAN, -INF]]
M2PO_ADV = [1.0, -2.0, 0.5]
MASK_221_M = torch.tensor([[True, True, False], [True, True, False], [True, False, False]])
M2PO_KEEP = [[True, True, False], [True, False, False], [False, False, False]]
M2PO_LOSS = {"token_mean": -0.032245, "seq_mean": 0.350845, "seq_sum_norm": -0.161225 / 12}
M2PO_GRAD = {
    "token_mean": [[-0.329744, -0.155760, 0.0], [0.453259, 0.0, 0.0], [0.0, 0.0, 0.0]],
    # -r A / (n_kept_i * 3): row 0 /(2*3), row 1 /(1*3)
    "seq_mean": [[-E(0.5) / 6, -E(-0.25) / 6, 0.0], [2 * E(0.125) / 3, 0.0, 0.0], [0.0] * 3],
    "seq_sum_norm": [[-E(0.5) / 12, -E(-0.25) / 12, 0.0], [2 * E(0.125) / 12, 0.0, 0.0],
                     [0.0] * 3],
}  # fmt: skip


@pytest.mark.parametrize("pass_keep", [False, True])
@pytest.mark.parametrize(("agg", "norm_len"), AGG_CASES)
def test_m2po_hand_value_and_gradient(agg, norm_len, pass_keep):
    logp = torch.tensor(M2PO_LOGP, requires_grad=True)
    beh = torch.tensor(M2PO_BEH)
    keep = torch.tensor(M2PO_KEEP) if pass_keep else None
    loss, stats = m2po_loss(
        logp, beh, torch.tensor(M2PO_ADV), MASK_221_M, threshold=0.12, keep_BxC=keep,
        agg=agg, norm_len=norm_len,
    )  # fmt: skip
    assert loss.item() == pytest.approx(M2PO_LOSS[agg], abs=1e-6)
    loss.backward()
    _assert_grad(logp.grad, M2PO_GRAD[agg])
    # 2 of 5 valid tokens dropped; m2 of the kept = 0.328125/3 = 0.109375 (<= 0.12);
    # m2_all = 1.578125/5 = 0.315625
    assert stats["m2po_masked_frac"] == pytest.approx(2 / 5)
    assert stats["m2"] == pytest.approx(0.109375, abs=1e-7)
    assert stats["m2_all"] == pytest.approx(0.315625, abs=1e-7)
    assert all(math.isfinite(v) for v in stats.values())


def test_m2po_keep_of_the_hand_batch():
    logr = torch.tensor(M2PO_LOGP) - torch.tensor(M2PO_BEH)  # garbage on padding
    keep = m2po_keep(logr, MASK_221_M, 0.12)
    assert keep.tolist() == M2PO_KEEP


# ================================================================ micro-batch additivity


def _stale_batch():
    """4 rows of lengths [3, 1, 0, 2] (row 2 all padding), garbage on padding, ratios in
    roughly [0.6, 1.6] so some clip / taper / budget binds."""
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0]]) > 0
    logp = -2.0 * torch.rand(4, 3, generator=g)
    beh = logp + 0.5 * (torch.rand(4, 3, generator=g) - 0.5)
    logp = torch.where(mask, logp, torch.tensor([NAN, INF, -INF]).expand(4, 3))
    beh = torch.where(mask, beh, torch.full((4, 3), 1e4))
    adv = torch.tensor([1.5, -0.7, 0.3, -1.2])  # TOPR reads it as the reward (b = 0.5)
    return logp, beh, adv, mask


LOSSES = {
    "cispo": (cispo_loss, {"eps_low": 0.1, "eps_high": 0.1}),
    "gspo": (gspo_loss, {"eps_low": 0.1, "eps_high": 0.1}),
    "topr": (topr_loss, {"baseline": 0.5}),
}
SPLITS = [(0, 1), (1, 3), (3, 4)]


def _loss_and_grad(fn, logp, beh, adv, mask, rows_list, **kw):
    """Sum of the losses of the row chunks (each with the whole batch's denom) and the
    gradient the summed backward leaves in the full-batch leaf."""
    per_row = kw.pop("per_row", {})
    leaf = logp.clone().requires_grad_(True)
    total, pg = 0.0, 0.0
    for a, b in rows_list:
        extra = {k: v[a:b] for k, v in per_row.items()}
        loss, stats = fn(leaf[a:b], beh[a:b], adv[a:b], mask[a:b], **kw, **extra)
        loss.backward()
        total, pg = total + loss.detach(), pg + stats["pg_loss"]
    return total, pg, leaf.grad


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_micro_batches_add_up(name, agg):
    fn, kw = LOSSES[name]
    logp, beh, adv, mask = _stale_batch()
    norm_len = 3 if agg == "seq_sum_norm" else None
    denom = agg_denominator(mask, agg, norm_len)
    kw = {**kw, "agg": agg, "norm_len": norm_len, "denom": denom}
    whole, whole_pg, whole_grad = _loss_and_grad(fn, logp, beh, adv, mask, [(0, 4)], **kw)
    parts, parts_pg, parts_grad = _loss_and_grad(fn, logp, beh, adv, mask, SPLITS, **kw)
    torch.testing.assert_close(parts, whole)
    assert parts_pg == pytest.approx(whole_pg, abs=1e-6)
    torch.testing.assert_close(parts_grad, whole_grad)
    assert torch.isfinite(whole_grad).all() and whole_grad.abs().sum() > 0
    # without the whole batch's denom, every chunk normalises by its own: not additive
    # (3 chunks with their own token counts / row counts / B)
    kw.pop("denom")
    own, _, _ = _loss_and_grad(fn, logp, beh, adv, mask, SPLITS, **kw)
    assert not torch.allclose(own, whole)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_m2po_micro_batches_add_up_with_the_whole_batch_keep(agg):
    # the hand batch: the whole batch's keep (threshold 0.12) drops r1t1 and r2t0
    logp, beh = torch.tensor(M2PO_LOGP), torch.tensor(M2PO_BEH)
    adv, mask = torch.tensor(M2PO_ADV), MASK_221_M
    norm_len = 3 if agg == "seq_sum_norm" else None
    denom = agg_denominator(mask, agg, norm_len)
    keep = m2po_keep(logp - beh, mask, 0.12)
    assert keep.tolist() == M2PO_KEEP
    kw = {"threshold": 0.12, "agg": agg, "norm_len": norm_len, "denom": denom}
    whole, whole_pg, whole_grad = _loss_and_grad(m2po_loss, logp, beh, adv, mask, [(0, 3)], **kw)
    splits = [(0, 1), (1, 3)]
    parts, parts_pg, parts_grad = _loss_and_grad(
        m2po_loss, logp, beh, adv, mask, splits, per_row={"keep_BxC": keep}, **kw
    )
    torch.testing.assert_close(parts, whole)
    assert parts_pg == pytest.approx(whole_pg, abs=1e-6)
    torch.testing.assert_close(parts_grad, whole_grad)
    # The keep computed per micro-batch differs: row 0 alone has m [0.25, 0.0625], sorted
    # [0.0625, 0.25], prefix means [0.0625, 0.15625]: 0.15625 > 0.12 drops r0t0, which the whole
    # batch keeps (rows 1-2 alone: sorted [0.015625, 0.25, 1.0], prefix [0.015625, 0.1328125,
    # ...] keep only r1t0, as the whole batch does).
    alone = m2po_keep((logp - beh)[0:1], mask[0:1], 0.12)
    assert alone.tolist() == [[False, True, False]]
    assert m2po_keep((logp - beh)[1:3], mask[1:3], 0.12).tolist() == M2PO_KEEP[1:3]
    wrong, _, wrong_grad = _loss_and_grad(m2po_loss, logp, beh, adv, mask, splits, **kw)
    assert not torch.allclose(wrong, whole)
    assert wrong_grad[0, 0] == 0 and whole_grad[0, 0] != 0


# ================================================================ on-policy reductions


def _fresh_batch():
    """The stale batch's logp with behaviour == logp on valid tokens (every r = 1)."""
    logp, _, adv, mask = _stale_batch()
    beh = torch.where(mask, logp, torch.full_like(logp, -INF))
    return logp, beh, adv, mask


def _run(fn, logp, beh, adv, mask, **kw):
    leaf = logp.clone().requires_grad_(True)
    loss, stats = fn(leaf, beh, adv, mask, **kw)
    loss.backward()
    return loss.detach(), leaf.grad, stats


@pytest.mark.parametrize(("agg", "norm_len"), AGG_CASES)
def test_on_policy_cispo_has_grpo_gradient_and_value_a_logp(agg, norm_len):
    logp, beh, adv, mask = _fresh_batch()
    kw = {"agg": agg, "norm_len": norm_len}
    c_loss, c_grad, c_stats = _run(cispo_loss, logp, beh, adv, mask, **kw)
    g_loss, g_grad, _ = _run(grpo_loss, logp, beh, adv, mask, **kw)
    torch.testing.assert_close(c_grad, g_grad)
    # grad = -a_i A_i on valid tokens, written out
    expected = -_row_weights(mask, agg, norm_len) * adv.unsqueeze(1) * mask
    torch.testing.assert_close(c_grad, expected)
    # value: -aggregate(A * logp), not GRPO's -aggregate(A)
    torch.testing.assert_close(
        c_loss, -_ref_aggregate(adv.unsqueeze(1) * logp, mask, agg, norm_len)
    )
    torch.testing.assert_close(g_loss, -_ref_aggregate(adv.unsqueeze(1).expand(4, 3), mask, agg,
                                                      norm_len))  # fmt: skip
    assert c_stats["clip_frac"] == 0.0 and c_stats["weight_mean"] == 1.0


@pytest.mark.parametrize(("agg", "norm_len"), AGG_CASES)
def test_on_policy_gspo_equals_grpo(agg, norm_len):
    # s_i = exp(0 / n_i) = 1 inside even the paper's tiny clip range: term A_i per token, and
    # d(row sum)/d logp_t = A_i, as GRPO's d(r_t A_i)/d logp_t = A_i
    logp, beh, adv, mask = _fresh_batch()
    kw = {"agg": agg, "norm_len": norm_len}
    s_loss, s_grad, s_stats = _run(gspo_loss, logp, beh, adv, mask, **kw)
    g_loss, g_grad, _ = _run(grpo_loss, logp, beh, adv, mask, **kw)
    torch.testing.assert_close(s_loss, g_loss)
    torch.testing.assert_close(s_grad, g_grad)
    torch.testing.assert_close(s_grad, -_row_weights(mask, agg, norm_len) * adv.unsqueeze(1) * mask)
    assert s_stats["seq_ratio_mean"] == 1.0 and s_stats["clip_frac"] == 0.0


@pytest.mark.parametrize("threshold", [0.04, 0.0])
@pytest.mark.parametrize(("agg", "norm_len"), AGG_CASES)
def test_on_policy_m2po_keeps_everything_and_equals_grpo(agg, norm_len, threshold):
    # every (log r)^2 = 0 <= threshold: nothing dropped; term r A = A, gradient A
    logp, beh, adv, mask = _fresh_batch()
    kw = {"agg": agg, "norm_len": norm_len}
    m_loss, m_grad, m_stats = _run(m2po_loss, logp, beh, adv, mask, threshold=threshold, **kw)
    g_loss, g_grad, _ = _run(grpo_loss, logp, beh, adv, mask, **kw)
    assert torch.equal(m2po_keep(torch.zeros(4, 3), mask, threshold), mask)
    assert m_stats["m2po_masked_frac"] == 0.0 and m_stats["m2_all"] == 0.0
    torch.testing.assert_close(m_loss, g_loss)
    torch.testing.assert_close(m_grad, g_grad)


@pytest.mark.parametrize(("agg", "norm_len"), AGG_CASES)
def test_on_policy_topr_is_reinforce_with_r_minus_b(agg, norm_len):
    # every W = 1: coef = c for both signs -> loss -aggregate((R - b) logp), grad -a_i (R - b)
    logp, beh, reward, mask = _fresh_batch()
    c_Bx1 = (reward - 0.25).unsqueeze(1)  # [1.25, -0.95, 0.05, -1.45]
    t_loss, t_grad, t_stats = _run(topr_loss, logp, beh, reward, mask, baseline=0.25, agg=agg,
                                   norm_len=norm_len)  # fmt: skip
    torch.testing.assert_close(t_loss, -_ref_aggregate(c_Bx1 * logp, mask, agg, norm_len))
    torch.testing.assert_close(t_grad, -_row_weights(mask, agg, norm_len) * c_Bx1 * mask)
    # rows 1 and 3 negative, none tapered (W = 1, not < 1)
    assert t_stats["pos_frac"] == 0.5
    assert t_stats["taper_mean"] == 1.0 and t_stats["tapered_frac"] == 0.0


# ================================================================ KL penalty


KL_CASES = {
    "grpo": (grpo_loss, {}),
    "cispo": (cispo_loss, {}),
    "gspo": (gspo_loss, {"eps_low": 0.05, "eps_high": 0.05}),
    "topr": (topr_loss, {}),
    "m2po": (m2po_loss, {"threshold": 1e6}),  # keeps every token
    "sapo": (sapo_loss, {}),
    "gmpo": (gmpo_loss, {}),
    "dppo": (dppo_loss, {}),
}


@pytest.mark.parametrize(("agg", "norm_len"), AGG_CASES)
@pytest.mark.parametrize("name", sorted(KL_CASES))
def test_kl_penalty_is_grpos_k3_term(name, agg, norm_len):
    # ref = logp except on row 0 t0 where ref = logp - ln 2: d = ref - logp = -ln 2 there,
    # k3 = e^d - d - 1 = 0.5 + 0.693147 - 1 = 0.193147, 0 elsewhere;
    # d k3 / d logp = 1 - e^d = 0.5 there. So kl_ref = a_0 * 0.193147 and the loss gains
    # 0.1 * a_0 * 0.193147 and row 0 t0's gradient 0.1 * a_0 * 0.5 (token_mean: a_0 = 1/6).
    fn, kw = KL_CASES[name]
    logp, beh, adv, mask = _stale_batch()
    ref = torch.where(mask, logp, torch.full_like(logp, NAN))
    ref[0, 0] = logp[0, 0] - math.log(2)
    kw = {**kw, "agg": agg, "norm_len": norm_len}
    base_loss, base_grad, _ = _run(fn, logp, beh, adv, mask, **kw)
    kl_loss, kl_grad, stats = _run(fn, logp, beh, adv, mask, kl_coef=0.1, ref_logp_BxC=ref, **kw)
    a0 = _row_weights(mask, agg, norm_len)[0, 0].item()
    k3 = 0.5 + math.log(2) - 1
    assert stats["kl_ref"] == pytest.approx(a0 * k3, abs=1e-6)
    assert stats["kl_ref"] == pytest.approx(kl_k3(logp, ref, mask, agg, norm_len).item(), abs=1e-7)
    torch.testing.assert_close(kl_loss - base_loss, torch.tensor(0.1 * a0 * k3))
    assert stats["pg_loss"] == pytest.approx(base_loss.item(), abs=1e-6)
    bump = torch.zeros(4, 3)
    bump[0, 0] = 0.1 * a0 * 0.5
    torch.testing.assert_close(kl_grad - base_grad, bump)
    assert torch.isfinite(kl_grad).all()


def test_m2po_kl_penalty_leaves_with_the_dropped_tokens():
    # As for every mask (the loss sees mask & keep), a token M2PO drops also leaves the KL
    # term, while the normaliser stays the whole batch's. Hand batch, threshold 0.12, ref =
    # logp - ln 2 on every valid token (k3 = 0.193147 each): the 3 kept tokens of 5 give
    # kl_ref = 3 * 0.193147 / 5 = 0.115888 (token_mean).
    logp = torch.tensor(M2PO_LOGP)
    ref = torch.where(MASK_221_M, logp - math.log(2), torch.full_like(logp, NAN))
    _, stats = m2po_loss(logp, torch.tensor(M2PO_BEH), torch.tensor(M2PO_ADV), MASK_221_M,
                         threshold=0.12, kl_coef=0.1, ref_logp_BxC=ref)  # fmt: skip
    assert stats["kl_ref"] == pytest.approx(3 * (0.5 + math.log(2) - 1) / 5, abs=1e-6)


def test_kl_without_ref_raises_for_every_loss():
    logp, beh, adv, mask = _stale_batch()
    for fn in (cispo_loss, gspo_loss, topr_loss, m2po_loss, sapo_loss, gmpo_loss, dppo_loss):
        with pytest.raises(ValueError, match="ref_logp"):
            fn(logp, beh, adv, mask, kl_coef=0.1)


def test_behaviour_reward_and_advantage_get_no_gradient():
    for fn in (cispo_loss, gspo_loss, topr_loss, m2po_loss, sapo_loss, gmpo_loss, dppo_loss):
        logp = torch.tensor([[-0.9, -1.2]], requires_grad=True)
        beh = torch.tensor([[-1.0, -1.0]], requires_grad=True)
        adv = torch.tensor([1.0], requires_grad=True)
        loss, _ = fn(logp, beh, adv, torch.ones(1, 2) > 0)
        loss.backward()
        assert beh.grad is None and adv.grad is None
        assert logp.grad is not None and logp.grad.abs().sum() > 0
