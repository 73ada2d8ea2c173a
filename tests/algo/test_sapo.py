"""Hand-pinned numbers for SAPO (replay_exp/algo/sapo.py; Gao et al. 2025, arXiv 2511.20347).

The paper's gate, as verl's compute_policy_loss_sapo, TRL's loss_type="sapo" and AReaL's
sapo_loss_fn compute it: per token f = (4 / tau) sigmoid(tau (r - 1)) with tau = tau_pos where
A > 0, else tau_neg, and the term f * A. Its derivative in logp is w A, w = 4 s (1 - s) r with
s = sigmoid(tau (r - 1)): w = 1 at r = 1. Conventions as in test_corrections.py: log r = logp -
behaviour, gradients d(loss)/d(logp) of a leaf logp, the loss -sum_i a_i sum_t f_t with the row
weights a_i of ``_row_weights``; padding holds garbage (nan, +-inf, 1e4).
"""

from __future__ import annotations

import math

import pytest
import torch
from test_corrections import (
    AGG_CASES,
    SPLITS,
    _assert_grad,
    _fresh_batch,
    _loss_and_grad,
    _ref_aggregate,
    _row_weights,
    _run,
    _stale_batch,
)

from replay_exp.algo import (
    AGG_MODES,
    LOSSES,
    LossInputs,
    agg_denominator,
    grpo_loss,
    loss_knobs,
)
from replay_exp.algo.sapo import sapo_loss
from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.config.errors import ConfigError
from replay_exp.config.schemas import SapoConfig

E = math.exp
NAN, INF = math.nan, math.inf


def _one(log_r, adv, **kw):
    """One token (behaviour 0, so logp = log r): the loss, d loss / d logp and the stats."""
    logp = torch.tensor([[log_r]], requires_grad=True)
    loss, stats = sapo_loss(logp, torch.zeros(1, 1), torch.tensor([adv]), torch.ones(1, 1) > 0,
                            **kw)  # fmt: skip
    loss.backward()
    return loss.item(), logp.grad.item(), stats


# ================================================================ one token, each sign


def test_positive_advantage_token_keeps_a_decayed_gradient_past_the_clip():
    # 1 token, r = e^0.5 = 1.648721, A = +1, tau_pos = 1:
    #   s = sigmoid(1 * (1.648721 - 1)) = sigmoid(0.648721) = 0.656722
    #   f = 4 / tau * s = 2.626889 -> loss = -f A = -2.626889
    #   grad = -4 s (1 - s) r A = -4 * 0.656722 * 0.343278 * 1.648721 = -1.486739
    # (GRPO's clip at 1 + 0.2 would zero this token's gradient.)
    loss, grad, stats = _one(0.5, 1.0, tau_pos=1.0, tau_neg=1.05)
    assert loss == pytest.approx(-2.626889, abs=1e-6)
    assert grad == pytest.approx(-1.486739, abs=1e-6)
    assert stats["gate_mean"] == pytest.approx(2.626889, abs=1e-6)
    assert stats["gate_weight_mean"] == pytest.approx(1.486739, abs=1e-6)
    assert "clip_frac" not in stats  # no hard clip: the controller reads NaN


def test_positive_advantage_token_below_one_uses_tau_pos():
    # r = e^-0.5 = 0.606531, A = +1, tau_pos = 1: s = sigmoid(-0.393469) = 0.402882,
    # f = 4 * 0.402882 = 1.611530 -> loss -1.611530; grad = -4 * 0.402882 * 0.597118 * 0.606531
    # = -0.583648
    loss, grad, _ = _one(-0.5, 1.0, tau_pos=1.0, tau_neg=1.05)
    assert loss == pytest.approx(-1.611530, abs=1e-6)
    assert grad == pytest.approx(-0.583648, abs=1e-6)


def test_negative_advantage_token_uses_the_sharper_tau_neg():
    # r = e^0.5 = 1.648721, A = -1, tau_neg = 1.05 (the paper's; tau_pos = 1 must not be used):
    #   x = 1.05 * 0.648721 = 0.681157, s = sigmoid(x) = 0.663997
    #   f = 4 / 1.05 * 0.663997 = 2.529512 -> loss = -f A = +2.529512
    #   grad = -4 s (1 - s) r A = +4 * 0.663997 * 0.336003 * 1.648721 = +1.471352
    loss, grad, _ = _one(0.5, -1.0, tau_pos=1.0, tau_neg=1.05)
    assert loss == pytest.approx(2.529512, abs=1e-6)
    assert grad == pytest.approx(1.471352, abs=1e-6)
    # r = e^-0.5 = 0.606531 (PPO's clip at 1 - 0.2 would zero it): x = 1.05 * (-0.393469) =
    # -0.413143, s = 0.398159, f = 3.809524 * 0.398159 = 1.516795 -> loss +1.516795,
    # grad = +4 * 0.398159 * 0.601841 * 0.606531 = +0.581368
    loss, grad, _ = _one(-0.5, -1.0, tau_pos=1.0, tau_neg=1.05)
    assert loss == pytest.approx(1.516795, abs=1e-6)
    assert grad == pytest.approx(0.581368, abs=1e-6)


def test_zero_advantage_takes_tau_neg_as_every_peer():
    # A = 0 is "not > 0": tau_neg (verl, TRL, AReaL). r = e^0.5, tau_neg = 2: the gate is
    # 4 / 2 * sigmoid(2 * 0.648721) = 2 * sigmoid(1.297443) = 2 * 0.785404 = 1.570809 (tau_pos
    # = 1 would give 2.626889); its term f * 0 is 0, and so is the gradient.
    loss, grad, stats = _one(0.5, 0.0, tau_pos=1.0, tau_neg=2.0)
    assert loss == 0.0 and grad == 0.0
    assert stats["gate_mean"] == pytest.approx(1.570809, abs=1e-6)


# ================================================================ a ragged batch

# tau_pos = 1, tau_neg = 2 (distinct, so the sign convention shows). Per token: r, s, f, w:
#   row 0, A = +1 (tau 1): log r [0.5, -0.5, 0.0]
#     r [1.648721, 0.606531, 1]; s [0.656722, 0.402882, 0.5]
#     f = 4 s [2.626889, 1.611530, 2.0]; w = 4 s (1 - s) r [1.486739, 0.583648, 1.0]
#   row 1, A = -1 (tau 2): log r [0.3, -0.2]
#     r [1.349859, 0.818731]; s = sigmoid(2 (r - 1)) = sigmoid([0.699718, -0.362538])
#     = [0.668125, 0.410345]; f = 2 s [1.336250, 0.820690]; w [1.197238, 0.792407]
#   row 2, A = +0.5 (tau 1): log r [-1.0] -> r 0.367879, s = sigmoid(-0.632121) = 0.347030,
#     f = 1.388119, w = 0.333446
# terms f A: [2.626889, 1.611530, 2.0 | -1.336250, -0.820690 | 0.694060], sum 4.775538
# token_mean: loss -4.775538 / 6 = -0.795923; seq_sum_norm (B * norm_len = 12): -0.397961
# seq_mean: row means [6.238419 / 3, -2.156940 / 2, 0.694060] = [2.079473, -1.078470, 0.694060]
#   -> loss -(1.695062) / 3 = -0.565021
SAPO_LOGP = [[-0.5, -1.0, -2.0], [-0.3, -2.0, NAN], [-1.2, -INF, 1e4]]
SAPO_BEH = [[-1.0, -0.5, -2.0], [-0.6, -1.8, INF], [-0.2, NAN, -INF]]
SAPO_ADV = [1.0, -1.0, 0.5]
MASK_321 = torch.tensor([[True, True, True], [True, True, False], [True, False, False]])
SAPO_W = [[1.486739, 0.583648, 1.0], [1.197238, 0.792407, 0.0], [0.333446, 0.0, 0.0]]
SAPO_LOSS = {"token_mean": -0.795923, "seq_mean": -0.565021, "seq_sum_norm": -0.397961}


@pytest.mark.parametrize(("agg", "norm_len"), AGG_CASES)
def test_sapo_hand_value_and_gradient(agg, norm_len):
    logp = torch.tensor(SAPO_LOGP, requires_grad=True)
    loss, stats = sapo_loss(
        logp, torch.tensor(SAPO_BEH), torch.tensor(SAPO_ADV), MASK_321,
        tau_pos=1.0, tau_neg=2.0, agg=agg, norm_len=norm_len,
    )  # fmt: skip
    assert loss.item() == pytest.approx(SAPO_LOSS[agg], abs=1e-6)
    assert stats["pg_loss"] == pytest.approx(SAPO_LOSS[agg], abs=1e-6)
    loss.backward()
    # grad = -a_i w A; padding exactly 0 although it held nan / inf
    expected = -_row_weights(MASK_321, agg, norm_len) * torch.tensor(SAPO_W)
    _assert_grad(logp.grad, (expected * torch.tensor(SAPO_ADV).unsqueeze(1)).tolist())
    assert logp.grad[1, 2] == 0 and logp.grad[2, 1] == 0 and logp.grad[2, 2] == 0
    if agg == "token_mean":  # -w A / 6
        _assert_grad(logp.grad, [[-0.247790, -0.097275, -1 / 6], [0.199540, 0.132068, 0.0],
                                 [-0.027787, 0.0, 0.0]])  # fmt: skip
    # gate_mean = (2.626889 + 1.611530 + 2 + 1.336250 + 0.820690 + 1.388119) / 6 = 1.630580
    # gate_weight_mean = (1.486739 + 0.583648 + 1 + 1.197238 + 0.792407 + 0.333446) / 6
    #   = 0.898913, its min 0.333446 (row 2); ratio_mean = 5.791721 / 6 = 0.965287
    assert stats["gate_mean"] == pytest.approx(1.630580, abs=1e-6)
    assert stats["gate_weight_mean"] == pytest.approx(0.898913, abs=1e-6)
    assert stats["gate_weight_min"] == pytest.approx(0.333446, abs=1e-6)
    assert stats["ratio_mean"] == pytest.approx(0.965287, abs=1e-6)
    assert stats["ratio_max"] == pytest.approx(E(0.5), abs=1e-6)
    assert all(math.isfinite(v) for v in stats.values())


# ================================================================ on-policy reduction


@pytest.mark.parametrize(("agg", "norm_len"), AGG_CASES)
def test_on_policy_sapo_has_grpo_gradient_and_value_2a_over_tau(agg, norm_len):
    # every r = 1: s = sigmoid(0) = 1/2, so f = 2 / tau and w = 4 * 1/2 * 1/2 * 1 = 1: the
    # gradient is GRPO's -a_i A_i; the value is -aggregate(2 A / tau), not GRPO's -aggregate(A)
    logp, beh, adv, mask = _fresh_batch()  # A = [1.5, -0.7, 0.3, -1.2]
    kw = {"agg": agg, "norm_len": norm_len}
    s_loss, s_grad, s_stats = _run(sapo_loss, logp, beh, adv, mask, tau_pos=1.0, tau_neg=1.05,
                                   **kw)  # fmt: skip
    _, g_grad, _ = _run(grpo_loss, logp, beh, adv, mask, **kw)
    torch.testing.assert_close(s_grad, g_grad)
    torch.testing.assert_close(s_grad, -_row_weights(mask, agg, norm_len) * adv.unsqueeze(1) * mask)
    # 2 / tau: 2 for the A > 0 rows, 2 / 1.05 = 1.904762 for the A < 0 rows
    two_over_tau = torch.tensor([2.0, 2 / 1.05, 2.0, 2 / 1.05]).unsqueeze(1)
    value = -_ref_aggregate((two_over_tau * adv.unsqueeze(1)).expand(4, 3), mask, agg, norm_len)
    torch.testing.assert_close(s_loss, value)
    assert s_stats["gate_weight_mean"] == pytest.approx(1.0)
    assert s_stats["gate_weight_min"] == pytest.approx(1.0)


# ================================================================ guards, KL, micro-batches


def test_an_overflowing_ratio_gives_a_zero_gradient_not_nan():
    # log r = 100 (behaviour -100): e^100 is inf in float32; log r is clamped at 20 first, where
    # the gate is saturated: f = 4 / tau exactly, w = 0. A = +1: loss -4; A = -1 (tau 1.05):
    # loss +4 / 1.05 = 3.809524
    for adv, value in ((1.0, -4.0), (-1.0, 4 / 1.05)):
        logp = torch.tensor([[0.0]], requires_grad=True)
        loss, stats = sapo_loss(logp, torch.tensor([[-100.0]]), torch.tensor([adv]),
                                torch.ones(1, 1) > 0)  # fmt: skip
        loss.backward()
        assert loss.item() == pytest.approx(value, abs=1e-6)
        assert logp.grad.item() == 0.0
        assert stats["gate_weight_min"] == 0.0


# The k3 KL term (every aggregation, its gradient) and its ref_logp guard: test_corrections.py's
# KL tests, parametrized over every loss.


@pytest.mark.parametrize("agg", AGG_MODES)
def test_micro_batches_add_up(agg):
    # 4 rows [3, 1, 0, 2 tokens], row 2 all padding; chunks [0:1], [1:3], [3:4], each given the
    # whole batch's denom: the losses and the gradients sum to the whole batch's
    logp, beh, adv, mask = _stale_batch()
    norm_len = 3 if agg == "seq_sum_norm" else None
    kw = {"tau_pos": 1.0, "tau_neg": 1.05, "agg": agg, "norm_len": norm_len,
          "denom": agg_denominator(mask, agg, norm_len)}  # fmt: skip
    whole, whole_pg, whole_grad = _loss_and_grad(sapo_loss, logp, beh, adv, mask, [(0, 4)], **kw)
    parts, parts_pg, parts_grad = _loss_and_grad(sapo_loss, logp, beh, adv, mask, SPLITS, **kw)
    torch.testing.assert_close(parts, whole)
    assert parts_pg == pytest.approx(whole_pg, abs=1e-6)
    torch.testing.assert_close(parts_grad, whole_grad)
    assert torch.isfinite(whole_grad).all() and whole_grad.abs().sum() > 0
    assert torch.equal(whole_grad[~mask], torch.zeros(int((~mask).sum())))


def test_behaviour_and_advantage_get_no_gradient():
    logp = torch.tensor([[-0.9, -1.2]], requires_grad=True)
    beh = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    adv = torch.tensor([1.0], requires_grad=True)
    loss, _ = sapo_loss(logp, beh, adv, torch.ones(1, 2) > 0)
    loss.backward()
    assert beh.grad is None and adv.grad is None and logp.grad.abs().sum() > 0


# ================================================================ registered: YAML, checks


def test_algo_sapo_is_registered_with_the_papers_defaults():
    cfg, _ = resolve(compose(["algo=sapo"]))
    a = cfg.algo
    assert (a.name, a.sapo_tau_pos, a.sapo_tau_neg, a.loss_agg) == ("sapo", 1.0, 1.05, "seq_mean")
    assert a.mask == "none"  # a MaskedAlgoConfig: the stale-data masks apply
    spec = LOSSES["sapo"]
    assert spec.schema is SapoConfig and spec.batch_keep is None and not spec.weight_clip
    # the registered call is the pure loss with the YAML's knobs
    logp, beh, adv, mask = _stale_batch()
    denom = agg_denominator(mask, "seq_mean")
    x = LossInputs(logp, beh, adv, adv, mask, None, None, "seq_mean", 3, 0.0, None, denom)
    loss, _ = spec.loss(x, loss_knobs(a))
    direct, _ = sapo_loss(logp, beh, adv, mask, tau_pos=1.0, tau_neg=1.05, agg="seq_mean",
                          denom=denom)  # fmt: skip
    torch.testing.assert_close(loss, direct)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo.sapo_tau_pos=0"], "algo.sapo_tau_pos=0.0 must be a finite temperature > 0"),
        (["algo.sapo_tau_neg=-1"], "algo.sapo_tau_neg=-1.0 must be a finite temperature > 0"),
        (["algo.sapo_tau_neg=inf"], "algo.sapo_tau_neg=inf must be a finite temperature > 0"),
    ],
)
def test_bad_temperatures_are_refused_in_one_line(overrides, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        resolve(compose(["algo=sapo", *overrides, f"output_root={tmp_path / 'runs'}"]))
    assert str(err.value) == message
    with pytest.raises(ValueError, match="tau"):
        sapo_loss(*_stale_batch(), tau_pos=0.0)


def test_sapo_composes_with_a_stale_data_mask():
    cfg, _ = resolve(compose(["algo=sapo", "algo.mask=icepop", "algo.loss_agg=token_mean"]))
    assert cfg.algo.mask == "icepop" and cfg.algo.loss_agg == "token_mean"
