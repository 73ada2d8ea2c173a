"""Hand-pinned numbers for decoupled PPO in grpo_loss (``prox_logp_BxC``) and
``loglinear_proximal``."""

from __future__ import annotations

import math

import pytest
import torch

from replay_exp.algo import grpo_loss, loglinear_proximal

E = math.exp
NAN, INF = math.nan, math.inf

# eps 0.2 / 0.2. u = exp(logp - prox) is clipped; w = sg(exp(prox - behaviour)) weighs; the
# plain ratio r = exp(logp - behaviour) = w * u.
#   row 0, A = +1:
#     t0: logp -1.0, prox -1.1, beh -1.5: u = e^0.1 = 1.105171 (inside), w = e^0.4 = 1.491825,
#         r = e^0.5 = 1.648721 (plain GRPO would clip it). term w * u = e^0.5 = 1.648721,
#         d/d logp = w * u * A = 1.648721
#     t1: logp -1.0, prox -1.3, beh -1.1: u = e^0.3 = 1.349859 > 1.2 with A > 0 -> clipped:
#         term w * 1.2 = e^-0.2 * 1.2 = 0.982477, zero gradient (plain r = e^0.1 is not clipped)
#   row 1, A = -1:
#     t0: logp -2.0, prox -1.8, beh -1.6: u = e^-0.2 = 0.818731 (inside), w = e^-0.2;
#         term -w * u = -e^-0.4 = -0.670320, d/d logp = -0.670320
#     t1: padding (garbage in logp, prox and behaviour)
# token_mean over N = 3: sum = 1.648721 + 0.982477 - 0.670320 = 1.960878 -> loss -0.653626
#   grad = -[1.648721, 0 | -0.670320] / 3 = [-0.549574, 0 | 0.223440]
LOGP = [[-1.0, -1.0], [-2.0, NAN]]
PROX = [[-1.1, -1.3], [-1.8, INF]]
BEH = [[-1.5, -1.1], [-1.6, -INF]]
ADV = torch.tensor([1.0, -1.0])
MASK = torch.tensor([[True, True], [True, False]])

CASES = [
    # tis_cap, tis_level, loss, grad, w mean / min / max, capped frac
    (None, "token", -0.653626, [[-0.549574, 0.0], [0.223440, 0.0]],
     # w [1.491825, 0.818731 | 0.818731] -> mean 3.129287/3 = 1.043096
     (E(0.4) + 2 * E(-0.2)) / 3, E(-0.2), E(0.4), 0.0),
    # cap 1.2: w0 = min(1.491825, 1.2) = 1.2 -> t0 term 1.2 * e^0.1 = 1.326205;
    # sum = 1.326205 + 0.982477 - 0.670320 = 1.638362 -> loss -0.546121; grad t0 -1.326205/3
    (1.2, "token", -0.546121, [[-0.442068, 0.0], [0.223440, 0.0]],
     (1.2 + 2 * E(-0.2)) / 3, E(-0.2), 1.2, 1 / 3),
    # sequence: w = exp(sum of the row's prox - beh): row 0 exp(0.4 - 0.2) = e^0.2 = 1.221403
    # on both tokens, row 1 e^-0.2 (the padding is not summed). Terms: t0 e^0.2 * e^0.1 =
    # e^0.3 = 1.349859, t1 e^0.2 * 1.2 = 1.465683 (clipped), row 1 -e^-0.4.
    # sum = 2.145222 -> loss -0.715074; grad [-1.349859/3, 0 | 0.223440]
    (None, "sequence", -0.715074, [[-0.449953, 0.0], [0.223440, 0.0]],
     (2 * E(0.2) + E(-0.2)) / 3, E(-0.2), E(0.2), 0.0),
    # sequence, cap 1.1: row 0 w = min(1.221403, 1.1) = 1.1 -> terms 1.1 e^0.1 = 1.215688,
    # 1.1 * 1.2 = 1.32; sum = 1.865368 -> loss -0.621789; 2 of 3 tokens capped
    (1.1, "sequence", -0.621789, [[-1.1 * E(0.1) / 3, 0.0], [0.223440, 0.0]],
     (2.2 + E(-0.2)) / 3, E(-0.2), 1.1, 2 / 3),
]  # fmt: skip


@pytest.mark.parametrize(("cap", "level", "loss_val", "grad", "w_mean", "w_min", "w_max", "capped"),
                         CASES)  # fmt: skip
def test_decoupled_hand_value_and_gradient(cap, level, loss_val, grad, w_mean, w_min, w_max,
                                           capped):  # fmt: skip
    logp = torch.tensor(LOGP, requires_grad=True)
    loss, stats = grpo_loss(logp, torch.tensor(BEH), ADV, MASK, prox_logp_BxC=torch.tensor(PROX),
                            tis_cap=cap, tis_level=level)  # fmt: skip
    assert loss.item() == pytest.approx(loss_val, abs=1e-6)
    assert stats["pg_loss"] == pytest.approx(loss_val, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor(grad))
    assert logp.grad[0, 1] == 0 and logp.grad[1, 1] == 0
    # the clip reads u: t1 (u = 1.35, A > 0) is clipped, t0 (u = 1.105) is not
    assert stats["clip_frac"] == pytest.approx(1 / 3)
    assert stats["clip_frac_high"] == pytest.approx(1 / 3)
    assert stats["clip_frac_low"] == 0.0
    # ratio stats stay those of pi / mu: (e^0.5 + e^0.1 + e^-0.4) / 3 = 1.141404
    assert stats["ratio_mean"] == pytest.approx(1.141404, abs=1e-6)
    assert stats["ratio_max"] == pytest.approx(E(0.5), abs=1e-6)
    assert stats["tis_weight_mean"] == pytest.approx(w_mean, abs=1e-6)
    assert stats["tis_weight_min"] == pytest.approx(w_min, abs=1e-6)
    assert stats["tis_weight_max"] == pytest.approx(w_max, abs=1e-6)
    assert stats["tis_capped_frac"] == pytest.approx(capped)
    assert all(math.isfinite(v) for v in stats.values())


def test_plain_grpo_clips_the_other_tokens_of_the_same_batch():
    # Without prox the clip reads r: t0 (r = e^0.5 > 1.2, A > 0) and row 1 t0 (r = e^-0.4 =
    # 0.670320 < 0.8, A < 0) are clipped, t1 (r = e^0.1) is not:
    # terms [1.2, e^0.1 = 1.105171 | -0.8] -> loss -1.505171/3 = -0.501724; grad [0, -e^0.1/3 | 0]
    logp = torch.tensor(LOGP, requires_grad=True)
    loss, stats = grpo_loss(logp, torch.tensor(BEH), ADV, MASK)
    assert loss.item() == pytest.approx(-(1.2 + E(0.1) - 0.8) / 3, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -E(0.1) / 3], [0.0, 0.0]]))
    assert stats["clip_frac_high"] == pytest.approx(1 / 3)
    assert stats["clip_frac_low"] == pytest.approx(1 / 3)
    assert "tis_weight_mean" not in stats


def _run(prox, logp, beh, adv, mask, **kw):
    leaf = logp.clone().requires_grad_(True)
    ref = torch.full_like(logp, -1.0)
    loss, stats = grpo_loss(leaf, beh, adv, mask, prox_logp_BxC=prox, kl_coef=0.1,
                            ref_logp_BxC=ref, **kw)  # fmt: skip
    loss.backward()
    return loss.detach(), leaf.grad, stats


STALE_LOGP = torch.tensor([[-0.4, -1.6, -2.2], [-0.9, NAN, INF]])
STALE_BEH = torch.tensor([[-0.7, -1.1, -2.3], [-1.0, -INF, 1e4]])
STALE_MASK = torch.tensor([[True, True, True], [True, False, False]])
STALE_ADV = torch.tensor([0.7, -1.3])


@pytest.mark.parametrize(("agg", "norm_len"), [("token_mean", None), ("seq_mean", None),
                                               ("seq_sum_norm", 3)])  # fmt: skip
def test_prox_equal_to_behaviour_is_exactly_plain_grpo(agg, norm_len):
    # w = exp(0) = 1 and u = r: bitwise the loss and gradient without prox; the stats too,
    # plus tis_* (weight 1, nothing capped)
    args = (STALE_LOGP, STALE_BEH, STALE_ADV, STALE_MASK)
    kw = {"agg": agg, "norm_len": norm_len}
    plain = _run(None, *args, **kw)
    for level in ("token", "sequence"):
        dec = _run(STALE_BEH.clone(), *args, tis_level=level, **kw)
        assert torch.equal(dec[0], plain[0]) and torch.equal(dec[1], plain[1])
        assert {k: v for k, v in dec[2].items() if not k.startswith("tis_")} == plain[2]
        assert dec[2]["tis_weight_mean"] == 1.0 and dec[2]["tis_capped_frac"] == 0.0
    # a cap >= 1 truncates nothing (it caps pi_prox / mu = 1 here, not pi_theta / mu)
    dec = _run(STALE_BEH.clone(), *args, tis_cap=2.0, **kw)
    assert torch.equal(dec[0], plain[0]) and torch.equal(dec[1], plain[1])


def test_prox_equal_to_logp_gives_the_unclipped_importance_weighted_gradient():
    # algo.proximal=recompute with one optimiser step per batch: prox = logp.detach(), so
    # u = 1 (inside the clip, which never binds) and the gradient is w * A * grad logp with
    # w = pi / mu = r: on the hand batch w = [e^0.5, e^0.1 | e^-0.4] = [1.648721, 1.105171 |
    # 0.670320] and A = [1, 1 | -1]:
    #   loss = -(1.648721 + 1.105171 - 0.670320)/3 = -0.694524
    #   grad = -w A / 3 = [-0.549574, -0.368390 | 0.223440]
    # (plain GRPO clips t0 and row 1 instead: test_plain_grpo_clips_the_other_tokens_...)
    logp = torch.tensor(LOGP, requires_grad=True)
    loss, stats = grpo_loss(logp, torch.tensor(BEH), ADV, MASK, prox_logp_BxC=logp.detach())
    assert loss.item() == pytest.approx(-0.694524, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.549574, -0.368390], [0.223440, 0.0]]))
    assert stats["clip_frac"] == 0.0
    assert stats["tis_weight_mean"] == pytest.approx(stats["ratio_mean"], abs=1e-6)
    # with eps 0 the bound is exactly u = 1 and still does not bind
    logp.grad = None
    loss, _ = grpo_loss(logp, torch.tensor(BEH), ADV, MASK, prox_logp_BxC=logp.detach(),
                        eps_low=0.0, eps_high=0.0)  # fmt: skip
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.549574, -0.368390], [0.223440, 0.0]]))


def test_prox_gets_no_gradient_and_shape_is_checked():
    logp = torch.tensor(LOGP, requires_grad=True)
    prox = torch.tensor(PROX, requires_grad=True)
    loss, _ = grpo_loss(logp, torch.tensor(BEH), ADV, MASK, prox_logp_BxC=prox)
    loss.backward()
    assert prox.grad is None
    with pytest.raises(ValueError, match="prox_logp"):
        grpo_loss(logp, torch.tensor(BEH), ADV, MASK, prox_logp_BxC=torch.zeros(2, 3))


# ---------------------------------------------------------------- loglinear_proximal


def test_loglinear_lag_zero_is_behaviour_exactly():
    logp = torch.tensor([[-0.3, -1.7], [-2.9, -0.01]], requires_grad=True)
    beh = torch.tensor([[-0.5, -1.2], [-2.0, -0.3]])
    out = loglinear_proximal(logp, beh, torch.zeros(2))
    assert torch.equal(out, beh)
    assert not out.requires_grad


def test_loglinear_hand_example():
    # logp - beh per row: row 0 [0.4, -1.0], row 1 [0.4, -1.0], row 2 [0.4, -1.0], row 3 same
    # lag [1, 3, -2 (clamped to 0), 9] -> alpha = L/(L+1) = [0.5, 0.75, 0, 0.9]
    #   row 0: beh [-1.4, -1.0] + 0.5 * [0.4, -1.0] = [-1.2, -1.5]
    #   row 1: + 0.75 * [0.4, -1.0] = [-1.1, -1.75]
    #   row 2: beh itself
    #   row 3: + 0.9 * [0.4, -1.0] = [-1.04, -1.9]
    beh = torch.tensor([[-1.4, -1.0]] * 4)
    logp = (beh + torch.tensor([0.4, -1.0])).requires_grad_(True)
    out = loglinear_proximal(logp, beh, torch.tensor([1, 3, -2, 9]))
    expected = torch.tensor([[-1.2, -1.5], [-1.1, -1.75], [-1.4, -1.0], [-1.04, -1.9]])
    torch.testing.assert_close(out, expected)
    assert not out.requires_grad and out.dtype == torch.float32


def test_loglinear_proximal_in_the_loss_splits_the_ratio():
    # one token, log r = 0.4, lag 1: prox = mu + 0.2, so u = pi/prox = r^(1/2) = e^0.2 =
    # 1.221403 and w = prox/mu = r^(1/2) = e^0.2. A = -1: u > 1.2 but A < 0, the clip does not
    # bind: term -w u = -e^0.4 = -1.491825 -> loss 1.491825, grad +1.491825.
    logp = torch.tensor([[-0.6]], requires_grad=True)
    beh = torch.tensor([[-1.0]])
    prox = loglinear_proximal(logp, beh, torch.tensor([1]))
    loss, stats = grpo_loss(logp, beh, torch.tensor([-1.0]), torch.ones(1, 1) > 0,
                            prox_logp_BxC=prox)  # fmt: skip
    assert stats["tis_weight_mean"] == pytest.approx(E(0.2), abs=1e-6)
    assert loss.item() == pytest.approx(E(0.4), abs=1e-6)
    loss.backward()
    assert logp.grad.item() == pytest.approx(E(0.4), abs=1e-6)


def test_loglinear_garbage_padding_stays_out_of_the_loss():
    # loglinear_proximal does not mask: inf - inf on padding gives nan there; grpo_loss
    # replaces the proximal's padding like every other input's
    logp = torch.tensor([[-0.5, INF]], requires_grad=True)
    beh = torch.tensor([[-0.7, INF]])
    prox = loglinear_proximal(logp, beh, torch.tensor([2]))
    mask = torch.tensor([[True, False]])
    loss, stats = grpo_loss(logp, beh, torch.ones(1), mask, prox_logp_BxC=prox)
    # log r = 0.2, alpha 2/3: u = e^(0.2/3) = 1.068939 (inside), w = e^(0.4/3): term e^0.2
    assert loss.item() == pytest.approx(-E(0.2), abs=1e-6)
    loss.backward()
    assert torch.isfinite(logp.grad).all() and logp.grad[0, 1] == 0
    assert all(math.isfinite(v) for v in stats.values())
