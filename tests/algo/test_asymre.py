"""Hand-pinned numbers for the AsymRE loss: (r - (V_hat + dV)) * log pi, no importance ratio."""

from __future__ import annotations

import math

import pytest
import torch

from replay_exp.algo import asymre_loss, group_advantages, token_logprobs

# Three rollouts, dV = -0.1 (effective baseline V_hat - 0.1):
#   row 0: r=1 in a group with rewards [1,0,0,0] -> V_hat = 0.25, coef = 1 - 0.15 = +0.85
#   row 1: r=0 in the same group                 -> V_hat = 0.25, coef = 0 - 0.15 = -0.15
#   row 2: r=0 in an all-zero group              -> V_hat = 0,    coef = 0 + 0.1  = +0.10
# (an all-equal group, which GRPO ignores, still gets coef -dV = 0.1).
REWARD = torch.tensor([1.0, 0.0, 0.0])
BASELINE = torch.tensor([0.25, 0.25, 0.0])
COEF = [0.85, -0.15, 0.10]
# logp: row 0 [ln .5, ln .25], row 1 [ln .5, padding], row 2 [ln .8, ln .5]
LN = math.log
MASK = torch.tensor([[True, True], [True, False], [True, True]])


def _logp(garbage: float = math.nan) -> torch.Tensor:
    return torch.tensor(
        [[LN(0.5), LN(0.25)], [LN(0.5), garbage], [LN(0.8), LN(0.5)]], requires_grad=True
    )


# objective = coef * logp:
#   row 0: 0.85 * [-0.6931472, -1.3862944] = [-0.5891751, -1.1783502]
#   row 1: -0.15 * -0.6931472 = +0.1039721
#   row 2: 0.10 * [-0.2231436, -0.6931472] = [-0.0223144, -0.0693147]
# token_mean:   sum = -1.7551823 over 5 tokens -> loss = +0.3510365;
#               d loss / d logp = -coef / 5 = [[-0.17, -0.17], [0.03, 0], [-0.02, -0.02]]
# seq_mean:     row means [-0.8837627, 0.1039721, -0.0458145], mean = -0.2752017 -> loss 0.2752017;
#               grad = -coef / (3 * len_row) = [[-0.85/6]*2, [0.05, 0], [-0.1/6]*2]
# seq_sum_norm: norm_len 4 -> loss = 1.7551823 / 12 = 0.1462652; grad = -coef / 12
AGG_CASES = [
    ("token_mean", None, 0.3510365, [[-0.17, -0.17], [0.03, 0.0], [-0.02, -0.02]]),
    (
        "seq_mean",
        None,
        0.2752017,
        [[-0.85 / 6, -0.85 / 6], [0.05, 0.0], [-0.1 / 6, -0.1 / 6]],
    ),
    (
        "seq_sum_norm",
        4,
        0.1462652,
        [[-0.85 / 12, -0.85 / 12], [0.15 / 12, 0.0], [-0.1 / 12, -0.1 / 12]],
    ),
]


@pytest.mark.parametrize(("agg", "norm_len", "expected", "grad"), AGG_CASES)
def test_asymre_loss_both_signs_and_grad(agg, norm_len, expected, grad):
    logp = _logp()
    loss, stats = asymre_loss(logp, REWARD, BASELINE, MASK, dv=-0.1, agg=agg, norm_len=norm_len)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats["pg_loss"] == pytest.approx(expected, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor(grad))
    # direction: descent RAISES log pi of rows with coef > 0 (rows 0, 2), LOWERS row 1's
    assert (logp.grad[0] < 0).all() and logp.grad[1, 0] > 0 and (logp.grad[2] < 0).all()
    assert logp.grad[1, 1] == 0.0  # padding gets exactly nothing
    # coef_mean = (0.85 - 0.15 + 0.1) / 3 = 0.2666667; 2 of 3 rollouts pushed up
    assert stats["coef_mean"] == pytest.approx(0.8 / 3, abs=1e-6)
    assert stats["coef_pos_frac"] == pytest.approx(2 / 3)
    assert "ratio_mean" not in stats and "clip_frac" not in stats


@pytest.mark.parametrize("garbage", [-math.inf, math.inf, math.nan, 0.0])
def test_asymre_padding_garbage_does_not_leak(garbage):
    logp = _logp(garbage)
    beh = torch.tensor([[0.0, 0.0], [0.0, -garbage], [0.0, 0.0]])
    loss, stats = asymre_loss(logp, REWARD, BASELINE, MASK, behaviour_logp_BxC=beh)
    assert loss.item() == pytest.approx(0.3510365, abs=1e-6)
    assert all(math.isfinite(v) for v in stats.values())
    loss.backward()
    assert torch.isfinite(logp.grad).all() and logp.grad[1, 1] == 0.0


def test_asymre_dv_zero_is_group_mean_reinforce():
    # dV = 0: coef = r - V_hat = [0.75, -0.25, 0]; the all-zero row now gets nothing.
    # token_mean grad = -coef / 5 = [[-0.15, -0.15], [0.05, 0], [0, 0]]
    logp = _logp()
    loss, stats = asymre_loss(logp, REWARD, BASELINE, MASK, dv=0.0)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.15, -0.15], [0.05, 0.0], [0.0, 0.0]]))
    assert stats["coef_pos_frac"] == pytest.approx(1 / 3)


def test_asymre_ignores_behaviour_logp():
    # Loss and gradient are bitwise the same without / with wildly different behaviour
    # log-probs (no importance ratio). The ratio stats are reported for monitoring only:
    # behaviour = logp - [ln2, -ln2, 0, 0, 0] -> ratios [2, 0.5, 1, 1, 1] on the valid tokens
    # ratio_mean = 5.5/5 = 1.1, min 0.5, max 2,
    # approx_kl = ((2 - 1 - ln2) + (0.5 - 1 + ln2) + 0 + 0 + 0) / 5 = 0.5 / 5 = 0.1
    grads, losses = [], []
    beh_fresh = _logp().detach()
    beh_stale = beh_fresh - torch.tensor([[LN(2), -LN(2)], [0.0, 0.0], [0.0, 0.0]])
    for beh in (None, beh_fresh, beh_stale):
        logp = _logp()
        loss, stats = asymre_loss(logp, REWARD, BASELINE, MASK, behaviour_logp_BxC=beh)
        loss.backward()
        losses.append(loss.detach())
        grads.append(logp.grad)
    assert torch.equal(losses[0], losses[1]) and torch.equal(losses[0], losses[2])
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[0], grads[2])
    assert stats["ratio_mean"] == pytest.approx(1.1, abs=1e-6)
    assert stats["ratio_min"] == pytest.approx(0.5, abs=1e-6)
    assert stats["ratio_max"] == pytest.approx(2.0, abs=1e-6)
    assert stats["approx_kl"] == pytest.approx(0.1, abs=1e-6)


def test_asymre_gradient_through_logits():
    # One token, V=2 uniform logits, id 0: logp = ln .5, coef = 1 - (0.25 - 0.1) = 0.85.
    # loss = -0.85 * ln .5 = 0.5891751; d logp / d z = onehot - p = [0.5, -0.5]
    # -> d loss / d z = -0.85 * [0.5, -0.5] = [-0.425, 0.425]: descent raises the sampled logit.
    z = torch.zeros(1, 1, 2, requires_grad=True)
    logp, _ = token_logprobs(z, torch.tensor([[0]]))
    loss, _ = asymre_loss(
        logp, torch.tensor([1.0]), torch.tensor([0.25]), torch.ones(1, 1, dtype=torch.bool)
    )
    assert loss.item() == pytest.approx(0.5891751, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(z.grad, torch.tensor([[[-0.425, 0.425]]]))


def test_asymre_kl_term_and_no_grad_to_constants():
    # logp = [ln .5, ln .5], ref = [ln .25, ln .5], r = V_hat = 0.5, dV = 0 -> coef 0, pg 0;
    # k3 as in test_grpo.test_kl_term: kl_ref = 0.0965736, loss = 0.1 * kl_ref = 0.00965736
    logp = torch.tensor([[LN(0.5), LN(0.5)]], requires_grad=True)
    ref = torch.tensor([[LN(0.25), LN(0.5)]])
    reward = torch.tensor([0.5], requires_grad=True)
    base = torch.tensor([0.5], requires_grad=True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, stats = asymre_loss(logp, reward, base, mask, dv=0.0, kl_coef=0.1, ref_logp_BxC=ref)
    assert loss.item() == pytest.approx(0.00965736, abs=1e-7)
    assert stats["kl_ref"] == pytest.approx(0.0965736, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.025, 0.0]]))
    assert reward.grad is None and base.grad is None
    with pytest.raises(ValueError, match="ref_logp"):
        asymre_loss(logp, reward, base, mask, kl_coef=0.1)


def test_asymre_shape_errors_and_empty_mask():
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="baseline_B"):
        asymre_loss(logp, torch.zeros(2), torch.zeros(3), mask)
    loss, stats = asymre_loss(logp, torch.ones(2), torch.zeros(2), mask)
    assert loss.item() == 0.0 and all(math.isfinite(v) for v in stats.values())


def test_baseline_recovered_from_unnormalised_advantage():
    # What the trainer does: V_hat = r - A with A from group_advantages(normalize_std=False).
    # G=4, rewards [1,0,0,0 | 1,1,1,1]: means 0.25 and 1 (dyadic) -> recovered exactly.
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    base = r - group_advantages(r, 4, normalize_std=False)
    assert torch.equal(base, torch.tensor([0.25] * 4 + [1.0] * 4))
    # G=3, rewards [1,0,0]: mean 1/3, recovered to one float32 rounding of A
    r3 = torch.tensor([1.0, 0.0, 0.0])
    base3 = r3 - group_advantages(r3, 3, normalize_std=False)
    torch.testing.assert_close(base3, torch.full((3,), 1 / 3), atol=1e-7, rtol=0)
