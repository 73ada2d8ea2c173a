"""Hand-pinned numbers for DPPO-Binary-TV (replay_exp/algo/dppo.py; Qi et al. 2026, arXiv
2602.04879), prime-rl's default loss (src/prime_rl/trainer/rl/loss.py, default_loss_fn).

Per token, d = pi - mu (probabilities), r = pi / mu: dropped if A > 0 and d > delta_high or
A < 0 and d < -delta_low, else the term r A (gradient r A); plus kl_tau * (log r)^2 over every
valid token (gradient 2 kl_tau log r). Conventions as in test_corrections.py: gradients
d(loss)/d(logp) of a leaf logp, row weights a_i of ``_row_weights``; padding holds garbage.
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
    _row_weights,
    _run,
    _stale_batch,
)

from replay_exp.algo import AGG_MODES, LOSSES, agg_denominator, grpo_loss
from replay_exp.algo.dppo import dppo_loss
from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.config.errors import ConfigError
from replay_exp.config.schemas import DppoConfig

L = math.log
NAN, INF = math.nan, math.inf

# delta_low 0.1, delta_high 0.2 (distinct, so the sides show). Probabilities pi | mu, d, r:
#   row 0, A = +1:
#     t0 0.9 | 0.6: d = +0.3 > 0.2 -> dropped (rose past the region, the direction A pushes)
#     t1 0.5 | 0.4: d = +0.1 -> kept, r = 1.25, term 1.25
#     t2 0.02 | 0.004: d = +0.016 -> kept, r = 5, term 5 (a rare token: PPO's clip at 1.2 would
#       zero it; its probability barely moved)
#   row 1, A = -1:
#     t0 0.3 | 0.5: d = -0.2 < -0.1 -> dropped (fell past the region)
#     t1 0.7 | 0.5: d = +0.2 -> kept (A < 0 and it rose: the wrong direction is never dropped),
#       r = 1.4, term -1.4
#   row 2, A = +0.5: 0.2 | 0.8: d = -0.6 -> kept (A > 0, it fell), r = 0.25, term 0.125
#   row 3, A = 0: 0.2 | 0.8: term 0; prime-rl's is_masked would count it (d < -0.1, its A <= 0
#     branch), our clip_frac does not (no gradient to zero)
# d term / d logp = r A on the kept tokens: [0, 1.25, 5 | 0, -1.4 | 0.125 | 0]; sum of terms
# 6.25 - 1.4 + 0.125 = 4.975
#   token_mean (N = 7, the dropped tokens count): loss -4.975 / 7 = -0.710714
#   seq_mean: row means [6.25 / 3, -1.4 / 2, 0.125, 0] = [2.083333, -0.7, 0.125, 0] -> sum
#     1.508333, loss -1.508333 / 4 = -0.377083
#   seq_sum_norm (B * norm_len = 16): -4.975 / 16 = -0.310938
P = [[0.9, 0.5, 0.02], [0.3, 0.7, 0.5], [0.2, 0.5, 0.5], [0.2, 0.5, 0.5]]
MU = [[0.6, 0.4, 0.004], [0.5, 0.5, 0.5], [0.8, 0.5, 0.5], [0.8, 0.5, 0.5]]
MASK_3211 = torch.tensor(
    [[True, True, True], [True, True, False], [True, False, False], [True, False, False]]
)
DPPO_ADV = [1.0, -1.0, 0.5, 0.0]
DPPO_RA = [[0.0, 1.25, 5.0], [0.0, -1.4, 0.0], [0.125, 0.0, 0.0], [0.0, 0.0, 0.0]]
DPPO_LOSS = {"token_mean": -0.710714, "seq_mean": -0.377083, "seq_sum_norm": -0.310938}


def _hand_batch():
    """log pi and log mu of the table, garbage on padding."""
    logp = torch.where(MASK_3211, torch.log(torch.tensor(P)), torch.tensor([NAN, INF, -INF]))
    beh = torch.where(MASK_3211, torch.log(torch.tensor(MU)), torch.full((4, 3), 1e4))
    return logp, beh, torch.tensor(DPPO_ADV), MASK_3211


@pytest.mark.parametrize(("agg", "norm_len"), AGG_CASES)
def test_dppo_hand_value_and_gradient(agg, norm_len):
    logp, beh, adv, mask = _hand_batch()
    leaf = logp.clone().requires_grad_(True)
    loss, stats = dppo_loss(leaf, beh, adv, mask, delta_low=0.1, delta_high=0.2, agg=agg,
                            norm_len=norm_len)  # fmt: skip
    assert loss.item() == pytest.approx(DPPO_LOSS[agg], abs=1e-6)
    assert stats["pg_loss"] == pytest.approx(DPPO_LOSS[agg], abs=1e-6)
    loss.backward()
    expected = -_row_weights(mask, agg, norm_len) * torch.tensor(DPPO_RA)
    _assert_grad(leaf.grad, (expected * mask).tolist())
    assert leaf.grad[0, 0] == 0 and leaf.grad[1, 0] == 0  # dropped: exactly zero
    assert torch.equal(leaf.grad[~mask], torch.zeros(5))  # padding, although nan / inf
    if agg == "token_mean":  # -r A / 7
        _assert_grad(leaf.grad, [[0.0, -0.178571, -0.714286], [0.0, 0.2, 0.0],
                                 [-0.017857, 0.0, 0.0], [0.0, 0.0, 0.0]])  # fmt: skip
    # clip_frac: row 0 t0 (high) and row 1 t0 (low), 2 of 7 (row 3, A = 0, not counted)
    assert stats["clip_frac"] == pytest.approx(2 / 7)
    assert stats["clip_frac_high"] == pytest.approx(1 / 7)
    assert stats["clip_frac_low"] == pytest.approx(1 / 7)
    # |d| [0.3, 0.1, 0.016, 0.2, 0.2, 0.6, 0.6]: mean 2.016 / 7 = 0.288, max 0.6
    assert stats["tv_mean"] == pytest.approx(0.288, abs=1e-6)
    assert stats["tv_max"] == pytest.approx(0.6, abs=1e-6)
    # r [1.5, 1.25, 5, 0.6, 1.4, 0.25, 0.25]: mean 10.25 / 7 = 1.464286
    assert stats["ratio_mean"] == pytest.approx(1.464286, abs=1e-6)
    assert "dppo_kl" not in stats
    assert all(math.isfinite(v) for v in stats.values())


def test_the_squared_log_ratio_term_is_prime_rls_kl_tau():
    # prime-rl: loss = sum_t (-keep r A + kl_tau (log r)^2) / N over every loss token, dropped
    # ones included. (log r)^2 = [ln 1.5, ln 1.25, ln 5 | ln 0.6, ln 1.4 | ln 0.25 | ln 0.25]^2
    # = [0.164402, 0.049793, 2.590290 | 0.260943, 0.113214 | 1.921812 | 1.921812], sum 7.022266
    # kl_tau = 0.01, token_mean: dppo_kl = 7.022266 / 7 = 1.003181, loss -0.710714 + 0.010032
    # = -0.700682; the gradient gains 2 kl_tau log r / 7 on every valid token:
    # row 0 t0 (dropped): 0 + 0.02 * 0.405465 / 7 = 0.001158
    logp, beh, adv, mask = _hand_batch()
    leaf = logp.clone().requires_grad_(True)
    loss, stats = dppo_loss(leaf, beh, adv, mask, delta_low=0.1, delta_high=0.2, kl_tau=0.01)
    assert loss.item() == pytest.approx(-0.700682, abs=1e-6)
    assert stats["pg_loss"] == pytest.approx(-0.710714, abs=1e-6)
    assert stats["dppo_kl"] == pytest.approx(1.003181, abs=1e-6)
    loss.backward()
    log_r = torch.where(mask, torch.log(torch.tensor(P) / torch.tensor(MU)), torch.zeros(4, 3))
    expected = (-torch.tensor(DPPO_RA) + 0.02 * log_r) / 7
    _assert_grad(leaf.grad, (expected * mask).tolist())
    assert leaf.grad[0, 0].item() == pytest.approx(0.001158, abs=1e-6)


# ================================================================ one token each side


@pytest.mark.parametrize(
    ("p", "mu", "adv", "dropped"),
    [
        (0.5, 0.25, 1.0, True),  # A > 0, d = +0.25 > 0.2
        (0.4, 0.25, 1.0, False),  # A > 0, d = +0.15: inside
        (0.05, 0.5, 1.0, False),  # A > 0, d = -0.45: fell, never dropped
        (0.1, 0.25, -1.0, False),  # A < 0, d = -0.15: inside
        (0.04, 0.25, -1.0, True),  # A < 0, d = -0.21 < -0.2
        (0.9, 0.25, -1.0, False),  # A < 0, d = +0.65: rose, never dropped
    ],
)
def test_one_token_binary_mask(p, mu, adv, dropped):
    # delta 0.2 / 0.2 (prime-rl's defaults). kept: loss -r A, grad -r A; dropped: both 0
    logp, beh = torch.tensor([[L(p)]]), torch.tensor([[L(mu)]])
    loss, grad, stats = _run(dppo_loss, logp, beh, torch.tensor([adv]), torch.ones(1, 1) > 0)
    r = p / mu
    assert loss.item() == pytest.approx(0.0 if dropped else -r * adv, abs=1e-6)
    assert grad.item() == pytest.approx(0.0 if dropped else -r * adv, abs=1e-6)
    assert stats["clip_frac"] == (1.0 if dropped else 0.0)


def test_a_token_exactly_at_the_bound_is_kept():
    # strict inequalities, as prime-rl (d > dppo_mask_high) and verl ((p - mu) <= high is valid):
    # delta set to the token's own float32 d keeps it; the next float32 below drops it
    logp, beh, adv = torch.tensor([[L(0.7)]]), torch.tensor([[L(0.4)]]), torch.tensor([1.0])
    d = (torch.exp(logp) - torch.exp(beh)).item()  # 0.3 up to float32 rounding
    below = torch.nextafter(torch.tensor(d), torch.tensor(0.0)).item()
    _, _, at = _run(dppo_loss, logp, beh, adv, torch.ones(1, 1) > 0, delta_high=d)
    _, _, past = _run(dppo_loss, logp, beh, adv, torch.ones(1, 1) > 0, delta_high=below)
    assert at["clip_frac"] == 0.0 and past["clip_frac"] == 1.0
    neg = torch.tensor([-1.0])  # A < 0 and pi - mu = -d exactly at -delta_low: kept
    _, _, at = _run(dppo_loss, beh, logp, neg, torch.ones(1, 1) > 0, delta_low=d)
    _, _, past = _run(dppo_loss, beh, logp, neg, torch.ones(1, 1) > 0, delta_low=below)
    assert at["clip_frac"] == 0.0 and past["clip_frac"] == 1.0


# ================================================================ on-policy reduction


@pytest.mark.parametrize("kl_tau", [0.0, 1e-3])
@pytest.mark.parametrize(("agg", "norm_len"), AGG_CASES)
def test_on_policy_dppo_equals_grpo(agg, norm_len, kl_tau):
    # every r = 1: d = 0, nothing dropped, term r A = A and gradient A (GRPO's), (log r)^2 = 0
    # with gradient 2 kl_tau log r = 0
    logp, beh, adv, mask = _fresh_batch()
    kw = {"agg": agg, "norm_len": norm_len}
    d_loss, d_grad, d_stats = _run(dppo_loss, logp, beh, adv, mask, kl_tau=kl_tau, **kw)
    g_loss, g_grad, _ = _run(grpo_loss, logp, beh, adv, mask, **kw)
    torch.testing.assert_close(d_loss, g_loss)
    torch.testing.assert_close(d_grad, g_grad)
    torch.testing.assert_close(d_grad, -_row_weights(mask, agg, norm_len) * adv.unsqueeze(1) * mask)
    assert d_stats["clip_frac"] == 0.0 and d_stats["tv_max"] == 0.0


# ================================================================ micro-batches, guards, KL


@pytest.mark.parametrize("agg", AGG_MODES)
def test_micro_batches_add_up(agg):
    # chunks [0:1], [1:3], [3:4] given the whole batch's denom: losses and gradients sum to the
    # whole batch's, the (log r)^2 term included (delta 0.05: some tokens are dropped)
    logp, beh, adv, mask = _stale_batch()
    norm_len = 3 if agg == "seq_sum_norm" else None
    kw = {"delta_low": 0.05, "delta_high": 0.05, "kl_tau": 0.01, "agg": agg,
          "norm_len": norm_len, "denom": agg_denominator(mask, agg, norm_len)}  # fmt: skip
    whole, whole_pg, whole_grad = _loss_and_grad(dppo_loss, logp, beh, adv, mask, [(0, 4)], **kw)
    parts, parts_pg, parts_grad = _loss_and_grad(dppo_loss, logp, beh, adv, mask, SPLITS, **kw)
    torch.testing.assert_close(parts, whole)
    assert parts_pg == pytest.approx(whole_pg, abs=1e-6)
    torch.testing.assert_close(parts_grad, whole_grad)
    assert torch.isfinite(whole_grad).all() and whole_grad.abs().sum() > 0
    _, stats = dppo_loss(logp, beh, adv, mask, **kw)
    assert stats["clip_frac"] > 0


def test_a_zero_advantage_with_an_overflowed_ratio_stays_zero():
    # log r = 100 overflows r to inf in float32; A = 0: the term is left out, not 0 * inf = nan
    logp = torch.tensor([[0.0]], requires_grad=True)
    loss, _ = dppo_loss(logp, torch.tensor([[-100.0]]), torch.zeros(1), torch.ones(1, 1) > 0)
    loss.backward()
    assert loss.item() == 0.0 and logp.grad.item() == 0.0


def test_argument_guards():
    # (the k3 KL term and its ref_logp guard: test_corrections.py, parametrized over the losses)
    logp, beh, adv, mask = _stale_batch()
    with pytest.raises(ValueError, match="0 < delta <= 1"):
        dppo_loss(logp, beh, adv, mask, delta_low=0.0)
    with pytest.raises(ValueError, match="kl_tau"):
        dppo_loss(logp, beh, adv, mask, kl_tau=-1.0)


# ================================================================ registered: YAML, checks


def test_algo_dppo_is_registered_with_prime_rls_thresholds():
    cfg, _ = resolve(compose(["algo=dppo"]))
    a = cfg.algo
    assert (a.name, a.dppo_delta_low, a.dppo_delta_high, a.dppo_kl_tau, a.loss_agg) == (
        "dppo", 0.2, 0.2, 0.0, "token_mean")  # fmt: skip
    assert LOSSES["dppo"].schema is DppoConfig and a.mask == "none"
    resolve(compose(["algo=dppo", "algo.dppo_kl_tau=1e-3", "algo.mask=icepop"]))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo.dppo_delta_low=0"],
         "algo.dppo_delta_low=0.0 must be in (0, 1] (a bound on pi - mu)"),
        (["algo.dppo_delta_high=1.5"],
         "algo.dppo_delta_high=1.5 must be in (0, 1] (a bound on pi - mu)"),
        (["algo.dppo_kl_tau=-1"], "algo.dppo_kl_tau=-1.0 must be finite and >= 0 (0 = off)"),
        (["algo.dppo_kl_tau=inf"], "algo.dppo_kl_tau=inf must be finite and >= 0 (0 = off)"),
    ],
)  # fmt: skip
def test_bad_dppo_config_is_refused_in_one_line(overrides, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        resolve(compose(["algo=dppo", *overrides, f"output_root={tmp_path / 'runs'}"]))
    assert str(err.value) == message
