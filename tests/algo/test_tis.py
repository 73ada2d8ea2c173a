"""Hand-pinned numbers for truncated importance sampling (TIS) in the GRPO loss.

Two forms (replay_exp/algo/grpo.py, deviation 8). ``tis_form="truncated_is"`` (the default, the
peers'): the weight w = min(pi_old / mu, c) times the clipped surrogate of u = pi_theta / pi_old
with pi_old = sg(pi_theta), so u = 1 in value and a token's gradient is w A grad log pi (TRL
``vllm_importance_sampling_mode=token_truncate``; verl ``rollout_correction.rollout_is=token``).
``tis_form="ratio_reweight"`` (the form shipped before): w times the clipped surrogate of
r = pi_theta / mu, the ratio twice (gradient min(r, c) r A where the clip does not bind).
"""

from __future__ import annotations

import math

import pytest
import torch

from replay_exp.algo import grpo_loss, tis_weight

LN = math.log


def _one_token_batch(ratios, advs):
    """B rows, C=1: logp = log(ratio), behaviour logp = 0, so exp(logp - behaviour) = ratio."""
    logp_BxC = torch.tensor(ratios).log().unsqueeze(1).requires_grad_(True)
    return logp_BxC, torch.zeros_like(logp_BxC), torch.tensor(advs), torch.ones(len(ratios), 1) > 0


def test_the_issue_example_truncated_is_against_ratio_reweight():
    # 1 token, r = pi_theta / mu = 0.5, A = +1, c = 2.
    # truncated_is: w = min(0.5, 2) = 0.5, u = exp(logp - sg(logp)) = 1 (clip 0.8..1.2 does not
    #   bind), objective w * u * A = 0.5 -> loss -0.5; d loss / d logp = -w * u * A = -0.5.
    #   TRL's token_truncate: coef_1 = exp(logp - old) = 1, loss -(1 * 1) * 0.5 = -0.5, grad -0.5.
    # ratio_reweight: w = 0.5 times min(r A, clip(r) A) = min(0.5, 0.8) = 0.5 -> loss -0.25;
    #   grad -w * r * A = -0.25 (the ratio counted twice).
    for form, expected in (("truncated_is", -0.5), ("ratio_reweight", -0.25)):
        logp, beh, adv, mask = _one_token_batch([0.5], [1.0])
        loss, stats = grpo_loss(logp, beh, adv, mask, tis_cap=2.0, tis_form=form)
        loss.backward()
        assert loss.item() == pytest.approx(expected, abs=1e-7), form
        assert logp.grad.item() == pytest.approx(expected, abs=1e-7), form
        assert stats["tis_weight_mean"] == pytest.approx(0.5) and stats["ratio_mean"] == 0.5


def test_truncated_is_token_level_below_and_above_cap():
    # The ratio_reweight batch below, cap 1.2, truncated_is: w = min(r, 1.2) =
    # [0.9, 1.1, 1.2, 0.5, 1.2], u = 1 everywhere, so the objective is w * A and nothing clips:
    #   w * A = [0.9, -1.1, -1.2, 0.5, 1.2], sum 0.3 -> token_mean loss -0.3 / 5 = -0.06
    #   grad -(w * A) / 5 = [-0.18, 0.22, 0.24, -0.1, -0.24]  (row 4, r = 1.5 > 1 + eps with
    #   A > 0, keeps its gradient: the staleness clip against mu is replaced by the weight)
    logp, beh, adv, mask = _one_token_batch([0.9, 1.1, 1.5, 0.5, 1.5], [1, -1, -1, 1, 1])
    loss, stats = grpo_loss(logp, beh, adv, mask, tis_cap=1.2, tis_level="token")
    assert loss.item() == pytest.approx(-0.06, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(logp.grad.squeeze(1), torch.tensor([-0.18, 0.22, 0.24, -0.1, -0.24]))
    assert stats["clip_frac"] == 0.0 and stats["tis_capped_frac"] == pytest.approx(2 / 5)
    assert stats["tis_weight_mean"] == pytest.approx(0.98, abs=1e-6)


def test_truncated_is_is_recompute_without_the_forward():
    # proximal=recompute hands the loss log pi_prox = the weights before this update = the
    # current forward's values: the same numbers, bitwise, as tis_cap alone.
    ratios = torch.tensor(SEQ_RATIOS)
    for level in ("token", "sequence", "geometric"):
        runs = []
        for prox in (False, True):
            logp = ratios.log().requires_grad_(True)
            loss, stats = grpo_loss(
                logp, torch.zeros(2, 3), torch.tensor(SEQ_ADV), SEQ_MASK, tis_cap=1.3,
                tis_level=level, prox_logp_BxC=logp.detach().clone() if prox else None,
            )  # fmt: skip
            loss.backward()
            runs.append((loss.detach(), logp.grad, stats))
        assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
        assert runs[0][2] == runs[1][2], level


def test_token_level_below_and_above_cap():
    # tis_form="ratio_reweight", cap c = 1.2, eps 0.2/0.2, one token per row:
    #   ratio  A   surrogate min(rA, clip(r)A)   w = min(r, 1.2)   w * surrogate   d/dlogp
    #   0.9   +1   0.9                           0.9               0.81            0.81
    #   1.1   -1   -1.1                          1.1               -1.21           -1.21
    #   1.5   -1   -1.5 (clip does not bind)     1.2 (capped)      -1.8            -1.8
    #   0.5   +1   0.5  (clip does not bind)     0.5               0.25            0.25
    #   1.5   +1   1.2  (clipped, zero grad)     1.2 (capped)      1.44            0
    # sum = -0.51 -> token_mean loss = 0.51 / 5 = 0.102
    # grad = -(w * r * A) / 5 on unclipped rows = [-0.162, 0.242, 0.36, -0.05, 0]
    #   (without TIS: -(r * A) / 5 = [-0.18, 0.22, 0.3, -0.1, 0])
    # tis_weight_mean = (0.9 + 1.1 + 1.2 + 0.5 + 1.2) / 5 = 0.98, min 0.5, max 1.2,
    # tis_capped_frac = 2/5 (rows 2, 4); clip_frac = 1/5 (row 4)
    logp, beh, adv, mask = _one_token_batch([0.9, 1.1, 1.5, 0.5, 1.5], [1, -1, -1, 1, 1])
    loss, stats = grpo_loss(
        logp, beh, adv, mask, tis_cap=1.2, tis_level="token", tis_form="ratio_reweight"
    )
    assert loss.item() == pytest.approx(0.102, abs=1e-6)
    assert stats["pg_loss"] == pytest.approx(0.102, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(
        logp.grad.squeeze(1), torch.tensor([-0.162, 0.242, 0.36, -0.05, 0.0])
    )
    assert logp.grad[4].item() == 0.0
    assert stats["tis_weight_mean"] == pytest.approx(0.98, abs=1e-6)
    assert stats["tis_weight_min"] == pytest.approx(0.5, abs=1e-6)
    assert stats["tis_weight_max"] == pytest.approx(1.2, abs=1e-6)
    assert stats["tis_capped_frac"] == pytest.approx(2 / 5)
    assert stats["clip_frac"] == pytest.approx(1 / 5)
    # ratio stats are the plain ratio's, untouched by the weight
    assert stats["ratio_max"] == pytest.approx(1.5, abs=1e-6)


# Two rows, C=3, behaviour logp = 0 so the token ratio is exp(logp):
#   row 0: ratios [2, 0.5, 1.5], A = -1 -> product 1.5
#          surrogate [min(-2, -1.2) = -2, min(-0.5, -0.8) = -0.8 (clipped), -1.5]
#   row 1: ratios [0.9, 0.5, PAD], A = +1 -> product 0.45; surrogate [0.9, 0.5]
SEQ_RATIOS = [[2.0, 0.5, 1.5], [0.9, 0.5, 1.0]]
SEQ_ADV = [-1.0, 1.0]
SEQ_MASK = torch.tensor([[True, True, True], [True, True, False]])
SEQ_CASES = [  # tis_form="ratio_reweight"
    # cap 1.0: w = [min(1.5, 1) = 1 (capped), 0.45]
    #   weighted [-2, -0.8, -1.5 | 0.405, 0.225], sum -3.67 -> loss 3.67 / 5 = 0.734
    #   grad -(w r A)/5: [2/5, 0 (clipped), 1.5/5 | -0.405/5, -0.225/5]
    #   = [0.4, 0, 0.3 | -0.081, -0.045]; weight over 5 tokens: mean (3 + 0.9)/5 = 0.78,
    #   min 0.45, max 1, capped 3/5
    (1.0, 0.734, [[0.4, 0.0, 0.3], [-0.081, -0.045, 0.0]], 0.78, 0.45, 1.0, 3 / 5),
    # cap 2.0: w = [1.5 (below cap), 0.45]
    #   weighted [-3, -1.2, -2.25 | 0.405, 0.225], sum -5.82 -> loss 1.164
    #   grad [3/5, 0, 2.25/5 | -0.081, -0.045] = [0.6, 0, 0.45 | -0.081, -0.045]
    #   weight mean (4.5 + 0.9)/5 = 1.08, min 0.45, max 1.5, capped 0
    (2.0, 1.164, [[0.6, 0.0, 0.45], [-0.081, -0.045, 0.0]], 1.08, 0.45, 1.5, 0.0),
]


@pytest.mark.parametrize("garbage", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(
    ("cap", "loss_val", "grad", "w_mean", "w_min", "w_max", "capped"), SEQ_CASES
)
def test_sequence_level_below_and_above_cap(
    cap, loss_val, grad, w_mean, w_min, w_max, capped, garbage
):
    ratios = torch.tensor(SEQ_RATIOS)
    logp = ratios.log()
    logp[1, 2] = garbage  # padding: must not enter the sequence's sum of log-ratios
    logp.requires_grad_(True)
    beh = torch.zeros(2, 3)
    beh[1, 2] = garbage
    loss, stats = grpo_loss(
        logp, beh, torch.tensor(SEQ_ADV), SEQ_MASK, tis_cap=cap, tis_level="sequence",
        tis_form="ratio_reweight",
    )  # fmt: skip
    assert loss.item() == pytest.approx(loss_val, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor(grad))
    assert logp.grad[0, 1].item() == 0.0 and logp.grad[1, 2].item() == 0.0
    assert stats["tis_weight_mean"] == pytest.approx(w_mean, abs=1e-6)
    assert stats["tis_weight_min"] == pytest.approx(w_min, abs=1e-6)
    assert stats["tis_weight_max"] == pytest.approx(w_max, abs=1e-6)
    assert stats["tis_capped_frac"] == pytest.approx(capped)
    assert all(math.isfinite(v) for v in stats.values())


# truncated_is on the same batch: the objective is w * A on every valid token (u = 1).
TRUNCATED_CASES = [
    # sequence, cap 1.0: w = [1 (1.5 capped), 0.45]; w A = [-1 x3 | 0.45 x2], sum -2.1
    #   -> loss 2.1 / 5 = 0.42; grad -(w A) / 5 = [0.2 x3 | -0.09 x2]
    ("sequence", 1.0, 0.42, [[0.2, 0.2, 0.2], [-0.09, -0.09, 0.0]], 3 / 5),
    # sequence, cap 2.0: w = [1.5, 0.45]; sum -4.5 + 0.9 = -3.6 -> loss 0.72; grad [0.3 x3 |
    #   -0.09 x2]
    ("sequence", 2.0, 0.72, [[0.3, 0.3, 0.3], [-0.09, -0.09, 0.0]], 0.0),
    # geometric, cap 2.0: w = [1.5^(1/3) = 1.1447142, 0.45^(1/2) = 0.6708204] (none capped);
    #   sum -3 * 1.1447142 + 2 * 0.6708204 = -2.0925019 -> loss 0.4185004;
    #   grad [1.1447142 / 5 = 0.2289428 x3 | -0.6708204 / 5 = -0.1341641 x2]
    ("geometric", 2.0, 0.4185004, [[0.2289428] * 3, [-0.1341641, -0.1341641, 0.0]], 0.0),
    # geometric, cap 1.0: w = [1 (capped), 0.6708204]; sum -3 + 1.3416408 = -1.6583592
    #   -> loss 0.3316718; grad [0.2 x3 | -0.1341641 x2]; capped 3/5
    ("geometric", 1.0, 0.3316718, [[0.2] * 3, [-0.1341641, -0.1341641, 0.0]], 3 / 5),
]


@pytest.mark.parametrize(("level", "cap", "loss_val", "grad", "capped"), TRUNCATED_CASES)
def test_truncated_is_sequence_and_geometric_levels(level, cap, loss_val, grad, capped):
    logp = torch.tensor(SEQ_RATIOS).log()
    logp[1, 2] = math.nan  # padding
    logp.requires_grad_(True)
    loss, stats = grpo_loss(
        logp, torch.zeros(2, 3), torch.tensor(SEQ_ADV), SEQ_MASK, tis_cap=cap, tis_level=level
    )
    assert loss.item() == pytest.approx(loss_val, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor(grad))
    assert stats["tis_capped_frac"] == pytest.approx(capped) and stats["clip_frac"] == 0.0


def test_token_level_on_the_same_batch_differs_from_sequence_level():
    # ratio_reweight, cap 1.0, token level: w = [min(2,1)=1, 0.5, 1 | 0.9, 0.5]
    #   weighted [-2, -0.4, -1.5 | 0.81, 0.25], sum -2.84 -> loss 2.84 / 5 = 0.568
    logp = torch.tensor(SEQ_RATIOS).log().requires_grad_(True)
    loss, stats = grpo_loss(
        logp, torch.zeros(2, 3), torch.tensor(SEQ_ADV), SEQ_MASK, tis_cap=1.0, tis_level="token",
        tis_form="ratio_reweight",
    )  # fmt: skip
    assert loss.item() == pytest.approx(0.568, abs=1e-6)
    assert stats["tis_capped_frac"] == pytest.approx(2 / 5)  # ratios 2 and 1.5


def test_sequence_weight_overflow_gives_the_cap():
    # 50 tokens of log-ratio 2 (ratio 7.389 each, A = +1): the sequence's exp(100)
    # overflows float32 to inf; the weight is exactly the cap 2.
    # ratio_reweight: every token clipped at 1.2 -> objective 1.2 * 2, loss -2.4, zero gradient.
    # truncated_is: u = 1 -> objective 2 per token, loss -2, gradient -2 / 50 = -0.04 each.
    for form, value, grad in (("ratio_reweight", -2.4, 0.0), ("truncated_is", -2.0, -0.04)):
        logp = torch.full((1, 50), 2.0, requires_grad=True)
        mask = torch.ones(1, 50, dtype=torch.bool)
        loss, stats = grpo_loss(
            logp, torch.zeros(1, 50), torch.ones(1), mask, tis_cap=2.0, tis_level="sequence",
            tis_form=form,
        )  # fmt: skip
        assert loss.item() == pytest.approx(value, abs=1e-5)
        assert stats["tis_weight_max"] == 2.0 and stats["tis_capped_frac"] == 1.0
        loss.backward()
        torch.testing.assert_close(logp.grad, torch.full((1, 50), grad))


def _run(ratios_BxC, adv, mask, **kw):
    logp = ratios_BxC.log().requires_grad_(True)
    loss, stats = grpo_loss(logp, torch.zeros_like(logp), adv, mask, kl_coef=0.1,
                            ref_logp_BxC=torch.full_like(logp, -1.0), **kw)  # fmt: skip
    loss.backward()
    return loss.detach(), logp.grad, stats


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean", "seq_sum_norm"])
def test_tis_off_and_on_policy_tis_are_bitwise_plain_grpo(agg):
    # tis_cap=None is the plain loss: bitwise the same loss, grads and stats as not passing it.
    # On-policy rollouts (every ratio exactly 1) give weight exp(0) = 1 at both levels, and
    # 1 * x == x exactly, so with a cap >= 1 TIS on is then bitwise plain GRPO too (plus the
    # tis_* stats).
    mask = torch.tensor([[True, True, True], [True, False, False]])
    adv = torch.tensor([0.7, -1.3])
    norm_len = 3 if agg == "seq_sum_norm" else None
    stale = torch.tensor([[1.3, 0.6, 1.1], [0.9, 1.0, 1.0]])
    plain = _run(stale, adv, mask, agg=agg, norm_len=norm_len)
    off = _run(stale, adv, mask, agg=agg, norm_len=norm_len, tis_cap=None, tis_level="sequence")
    assert torch.equal(plain[0], off[0]) and torch.equal(plain[1], off[1])
    assert plain[2] == off[2]
    fresh = torch.ones(2, 3)
    plain = _run(fresh, adv, mask, agg=agg, norm_len=norm_len)
    for level in ("token", "sequence", "geometric"):
        for form in ("truncated_is", "ratio_reweight"):
            on = _run(fresh, adv, mask, agg=agg, norm_len=norm_len, tis_cap=1.5, tis_level=level,
                      tis_form=form)  # fmt: skip
            assert torch.equal(plain[0], on[0]) and torch.equal(plain[1], on[1])
            assert {k: v for k, v in on[2].items() if not k.startswith("tis_")} == plain[2]
            assert on[2]["tis_weight_mean"] == 1.0 and on[2]["tis_capped_frac"] == 0.0


def test_tis_validation():
    logp, beh, adv, mask = _one_token_batch([1.0], [1.0])
    with pytest.raises(ValueError, match="cap must be > 0"):
        grpo_loss(logp, beh, adv, mask, tis_cap=0.0)
    with pytest.raises(ValueError, match="'seq'.*token.*sequence"):
        grpo_loss(logp, beh, adv, mask, tis_cap=1.0, tis_level="seq")
    with pytest.raises(ValueError, match="cap must be > 0"):
        tis_weight(torch.zeros(1, 1), mask, -1.0, "token")
    with pytest.raises(ValueError, match="'double'.*truncated_is.*ratio_reweight"):
        grpo_loss(logp, beh, adv, mask, tis_cap=1.0, tis_form="double")


def test_tis_weight_is_detached_and_reports_truncation():
    # log-ratios [ln 3, ln .5 | ln 2, PAD]; cap 2.5
    # token:    w = [2.5 (3 truncated), 0.5 | 2, .]
    # sequence: row 0 exp(ln 1.5) = 1.5, row 1 = 2 -> w = [1.5, 1.5 | 2, 2], none truncated
    lr = torch.tensor([[LN(3), LN(0.5)], [LN(2), 123.0]], requires_grad=True)
    mask = torch.tensor([[True, True], [True, False]])
    w, trunc = tis_weight(lr, mask, 2.5, "token")
    assert not w.requires_grad
    torch.testing.assert_close(w[mask], torch.tensor([2.5, 0.5, 2.0]))
    assert trunc[mask].tolist() == [True, False, False]
    w, trunc = tis_weight(lr, mask, 2.5, "sequence")
    torch.testing.assert_close(w, torch.tensor([[1.5, 1.5], [2.0, 2.0]]))
    assert not trunc.any()
    # geometric: row 0 exp((ln 3 + ln 0.5) / 2) = sqrt(1.5) = 1.2247449, row 1 exp(ln 2 / 1) = 2
    w, trunc = tis_weight(lr, mask, 2.5, "geometric")
    torch.testing.assert_close(w[mask], torch.tensor([1.2247449, 1.2247449, 2.0]))
    assert not trunc.any()
