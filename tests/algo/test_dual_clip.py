"""Hand-pinned numbers for dual-clip PPO (``algo.clip_ratio_c``; Ye et al. 2020, arXiv
1912.09729, eq. 5): for A < 0 the objective is max(min(u A, clip(u) A), c A), so a token (GSPO: a
sequence) with A < 0 contributes at most c |A| to the loss and no gradient once u > c. verl's
``compute_policy_loss_vanilla`` (``clip_ratio_c``, default 3) and AReaL's ``ppo_actor_loss_fn``
(``c_clip``) compute the same numbers; TRL's ``delta`` clamps the ratio at the same value
(grpo_trainer.py, two-sided clipping), which gives them too. eps 0.2 / 0.2 unless stated."""

from __future__ import annotations

import math

import pytest
import torch

from replay_exp.algo import grpo_loss, gspo_loss
from replay_exp.algo.gmpo import gmpo_loss

E2 = math.exp(2.0)  # 7.3890561


def _tokens(log_ratios, advs):
    """B rows of one token: logp = log r, behaviour 0."""
    logp = torch.tensor(log_ratios).unsqueeze(1).requires_grad_(True)
    return logp, torch.zeros_like(logp), torch.tensor(advs), torch.ones(len(advs), 1) > 0


def test_the_issue_example():
    # 1 token, A = -1, u = e^2, c = 3: min(u A, clip(u) A) = min(-7.389, -1.2) = -7.389;
    # dual: max(-7.389, 3 * -1) = -3 -> loss +3.0, the term is a constant -> grad 0 (verl +3.0).
    # Without it: loss 7.389 and d loss / d logp = -A u = 7.389.
    for c, loss_val, grad in ((3.0, 3.0, 0.0), (None, E2, E2)):
        logp, beh, adv, mask = _tokens([2.0], [-1.0])
        loss, stats = grpo_loss(logp, beh, adv, mask, clip_ratio_c=c)
        loss.backward()
        assert loss.item() == pytest.approx(loss_val, rel=1e-6)
        assert logp.grad.item() == pytest.approx(grad, rel=1e-6)
        assert ("dual_clip_frac" in stats) == (c is not None)


def test_a_batch_where_it_binds_once():
    # c = 3, token_mean over 4 tokens:
    #   u     A    min(uA, clip(u)A)           dual max(., 3A)   d loss / d logp
    #   e^2  -1    -7.389                      -3 (binds)         0
    #   2    -1    -2                          -2                 -(u A) / 4 = 0.5
    #   e^2  +1    1.2 (clip binds)            1.2 (A > 0)        0
    #   0.5  -1    min(-0.5, -0.8) = -0.8      -0.8               0 (the clip binds)
    # sum -4.6 -> loss 4.6 / 4 = 1.15; dual_clip_frac 1/4, clip_frac 2/4
    logp, beh, adv, mask = _tokens([2.0, math.log(2), 2.0, math.log(0.5)], [-1, -1, 1, -1.0])
    loss, stats = grpo_loss(logp, beh, adv, mask, clip_ratio_c=3.0)
    loss.backward()
    assert loss.item() == pytest.approx(1.15, abs=1e-6)
    torch.testing.assert_close(logp.grad.squeeze(1), torch.tensor([0.0, 0.5, 0.0, 0.0]))
    assert stats["dual_clip_frac"] == 0.25 and stats["clip_frac"] == 0.5


def test_decoupled_ppo_dual_clips_the_proximal_ratio_then_weights():
    # log mu = 0, log pi_prox = 1 (w = pi_prox / mu = e, untruncated), log pi = 3: u = e^2,
    # A = -1, c = 3: w * max(min(-e^2, -1.2), -3) = -3e -> loss 3e = 8.1548455, grad 0.
    logp, beh, adv, mask = _tokens([3.0], [-1.0])
    prox = torch.ones(1, 1)
    loss, stats = grpo_loss(logp, beh, adv, mask, clip_ratio_c=3.0, prox_logp_BxC=prox)
    loss.backward()
    assert loss.item() == pytest.approx(3 * math.e, rel=1e-6)
    assert logp.grad.item() == 0.0 and stats["dual_clip_frac"] == 1.0
    # truncated IS alone: u = pi / sg(pi) = 1 < c never binds; the loss is min(e^2, 2) * 1
    logp, beh, adv, mask = _tokens([2.0], [-1.0])
    loss, stats = grpo_loss(logp, beh, adv, mask, clip_ratio_c=3.0, tis_cap=2.0)
    assert loss.item() == pytest.approx(2.0) and stats["dual_clip_frac"] == 0.0


def test_gspo_dual_clips_the_sequence_ratio():
    # eps 3e-4 / 4e-4, c = 3, token_mean over 3 tokens.
    #   row 0: log r = [2, 2] -> s = e^2, A = -1: min(-7.389, -(1 - 3e-4)) = -7.389 -> dual -3,
    #          a constant for both tokens (grad 0)
    #   row 1: log r = [ln 2] -> s = 2, A = -1: min(-2, -0.9997) = -2 (dual does not bind)
    # sum -3 * 2 - 2 = -8 -> loss 8 / 3 = 2.6666667; grad of row 1's token: -(A s) / 3 = 2/3
    # Without it: row 0 gives -7.389 per token, loss (2 * 7.389 + 2) / 3 = 5.5927041, and
    # each row-0 token's grad -A * s * (1 / n) * n / 3 = e^2 / 3 = 2.4630187.
    logp = torch.tensor([[2.0, 2.0], [math.log(2), 9.0]], requires_grad=True)
    mask = torch.tensor([[True, True], [True, False]])
    cases = [(3.0, 8 / 3, [[0.0, 0.0], [2 / 3, 0.0]]),
             (None, (2 * E2 + 2) / 3, [[E2 / 3, E2 / 3], [2 / 3, 0.0]])]  # fmt: skip
    for c, loss_val, grad in cases:
        logp.grad = None
        loss, stats = gspo_loss(logp, torch.zeros(2, 2), torch.tensor([-1.0, -1.0]), mask,
                                clip_ratio_c=c)  # fmt: skip
        loss.backward()
        assert loss.item() == pytest.approx(loss_val, rel=1e-6)
        torch.testing.assert_close(logp.grad, torch.tensor(grad))
        assert stats.get("dual_clip_frac") == (pytest.approx(2 / 3) if c else None)  # row 0


def test_gmpo_dual_clips_the_geometric_mean():
    # One row, log r = [2, 2], A = -1, eps 0.4 / 0.4 (log space): A < 0 clips log r from below
    # only, so c_t = [2, 2] and s = exp(mean) = e^2; the term s A = -7.389 on both tokens.
    # seq_mean: loss = -(row mean) = e^2 = 7.389, each token's grad -A s / n = e^2 / 2 = 3.6945.
    # c = 3: max(-7.389, -3) = -3 -> loss 3, grad 0.
    for c, loss_val, grad in ((None, E2, E2 / 2), (3.0, 3.0, 0.0)):
        logp = torch.full((1, 2), 2.0, requires_grad=True)
        loss, stats = gmpo_loss(logp, torch.zeros(1, 2), torch.tensor([-1.0]),
                                torch.ones(1, 2, dtype=torch.bool), agg="seq_mean",
                                clip_ratio_c=c)  # fmt: skip
        loss.backward()
        assert loss.item() == pytest.approx(loss_val, rel=1e-6)
        torch.testing.assert_close(logp.grad, torch.full((1, 2), grad))
        assert stats.get("dual_clip_frac") == (1.0 if c else None)


def test_a_cap_that_never_binds_is_bitwise_no_dual_clip():
    # max(x, c A) with c A far below x returns x itself: the same bits as the default (None).
    g = torch.Generator().manual_seed(0)
    log_r = 0.3 * torch.randn(4, 5, generator=g)
    adv = torch.randn(4, generator=g)
    mask = torch.rand(4, 5, generator=g) > 0.2
    out = []
    for c in (None, 1e9):
        logp = log_r.clone().requires_grad_(True)
        loss, _ = grpo_loss(logp, torch.zeros(4, 5), adv, mask, clip_ratio_c=c)
        loss.backward()
        out.append((loss.detach(), logp.grad))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


def test_dual_clip_needs_c_above_one():
    logp, beh, adv, mask = _tokens([0.0], [1.0])
    with pytest.raises(ValueError, match="clip_ratio_c > 1, got 1.0"):
        grpo_loss(logp, beh, adv, mask, clip_ratio_c=1.0)
