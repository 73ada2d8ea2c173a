"""Hand-pinned numbers for GMPO (replay_exp/algo/gmpo.py; Zhao et al. 2025, arXiv 2507.20673).

The paper's objective, as verl's geo_mean loss, TRL's GMPOTrainer and the authors' code compute
it in log space: per row, c_t = min(log r_t, eps_high) where A >= 0, max(log r_t, -eps_low)
where A < 0; s = exp(mean_t c_t); the row term s * A on each valid token. A clipped token's c_t
is a constant; every other token of row i gets d(row term)/d logp_t = s_i A_i / n_i, so with
the row weights a_i of ``_row_weights`` (the loss is -sum_i a_i n_i s_i A_i) a token's gradient
is -a_i s_i A_i, and 0 where clipped. Padding holds garbage (nan, +-inf, 1e4).
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
from replay_exp.algo.gmpo import gmpo_loss
from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.config.errors import ConfigError
from replay_exp.config.schemas import GmpoConfig

E = math.exp
NAN, INF = math.nan, math.inf

# eps_low 0.2, eps_high 0.4 (distinct, so the sides show). Per row, c_t and s = exp(mean c):
#   row 0, A = +1: log r [0.6, -0.5, 0.2] -> c [0.4 (clipped above), -0.5 (A > 0: no lower
#     clip), 0.2]; mean 0.1 / 3 = 0.033333, s = e^0.033333 = 1.033895; term 1.033895
#   row 1, A = -1: log r [-0.5, 0.3] -> c [-0.2 (clipped below), 0.3 (A < 0: no upper clip)];
#     mean 0.05, s = e^0.05 = 1.051271; term -1.051271
#   row 2, A = +0.5: log r [-0.3] -> c -0.3, s = e^-0.3 = 0.740818; term 0.370409
#   row 3, A = 0: log r [5.0, 3.0] -> clipped above like A > 0 (the authors' sgn for A >= 0):
#     c [0.4, 0.4], s = e^0.4 = 1.491825; term 0
# Row terms T = s A [1.033895, -1.051271, 0.370409, 0], lengths n [3, 2, 1, 2]:
#   seq_mean: -(sum T) / 4 rows = -0.353033 / 4 = -0.088258
#   token_mean: -(sum n T) / 8 = -(3.101685 - 2.102542 + 0.370409) / 8 = -1.369552 / 8
#     = -0.171194; seq_sum_norm (B * norm_len = 16): -0.085597
GMPO_LOGP = [[-0.4, -1.5, -0.8], [-1.5, -0.7, NAN], [-1.3, INF, -INF], [0.0, -1.0, 1e4]]
GMPO_BEH = [[-1.0, -1.0, -1.0], [-1.0, -1.0, 1e4], [-1.0, NAN, NAN], [-5.0, -4.0, -INF]]
GMPO_ADV = [1.0, -1.0, 0.5, 0.0]
MASK_3212 = torch.tensor(
    [[True, True, True], [True, True, False], [True, False, False], [True, True, False]]
)
GMPO_UNCLIPPED = torch.tensor(
    [[False, True, True], [False, True, False], [True, False, False], [True, True, False]]
)
GMPO_SA = [E(0.1 / 3), -E(0.05), 0.5 * E(-0.3), 0.0]  # s_i A_i
GMPO_LOSS = {"token_mean": -0.171194, "seq_mean": -0.088258, "seq_sum_norm": -0.085597}


@pytest.mark.parametrize(("agg", "norm_len"), AGG_CASES)
def test_gmpo_hand_value_and_gradient(agg, norm_len):
    logp = torch.tensor(GMPO_LOGP, requires_grad=True)
    loss, stats = gmpo_loss(
        logp, torch.tensor(GMPO_BEH), torch.tensor(GMPO_ADV), MASK_3212,
        eps_low=0.2, eps_high=0.4, agg=agg, norm_len=norm_len,
    )  # fmt: skip
    assert loss.item() == pytest.approx(GMPO_LOSS[agg], abs=1e-6)
    assert stats["pg_loss"] == pytest.approx(GMPO_LOSS[agg], abs=1e-6)
    loss.backward()
    expected = -_row_weights(MASK_3212, agg, norm_len) * torch.tensor(GMPO_SA).unsqueeze(1)
    _assert_grad(logp.grad, (expected * GMPO_UNCLIPPED).tolist())
    assert logp.grad[0, 0] == 0 and logp.grad[1, 0] == 0  # the clipped tokens: exactly zero
    assert torch.equal(logp.grad[~MASK_3212], torch.zeros(4))  # padding, although nan / inf
    if agg == "token_mean":  # -s A / 8 on the unclipped tokens
        _assert_grad(logp.grad, [[0.0, -0.129237, -0.129237], [0.0, 0.131409, 0.0],
                                 [-0.046301, 0.0, 0.0], [0.0, 0.0, 0.0]])  # fmt: skip
    if agg == "seq_mean":  # -s A / (n_i * 4)
        _assert_grad(logp.grad, [[0.0, -0.086158, -0.086158], [0.0, 0.131409, 0.0],
                                 [-0.092602, 0.0, 0.0], [0.0, 0.0, 0.0]])  # fmt: skip
    # clip_frac: row 0 t0 (A > 0, log r 0.6 > 0.4) and row 1 t0 (A < 0, -0.5 < -0.2), 2 of 8;
    # row 3 (A = 0) is clipped in value but has no gradient to zero: not counted
    assert stats["clip_frac"] == pytest.approx(2 / 8)
    assert stats["clip_frac_high"] == pytest.approx(1 / 8)
    assert stats["clip_frac_low"] == pytest.approx(1 / 8)
    # s over the 4 rows [1.033895, 1.051271, 0.740818, 1.491825]: mean 4.317809 / 4 = 1.079452
    assert stats["seq_ratio_mean"] == pytest.approx(1.079452, abs=1e-6)
    assert stats["seq_ratio_min"] == pytest.approx(E(-0.3), abs=1e-6)
    assert stats["seq_ratio_max"] == pytest.approx(E(0.4), abs=1e-6)
    assert stats["ratio_max"] == pytest.approx(E(5.0), rel=1e-6)  # the unclipped r
    assert all(math.isfinite(v) for v in stats.values())


def test_one_token_each_sign():
    # 1 token = its own geometric mean, so GMPO is PPO's clip in log space on it:
    # A = +1, log r = 0.5 > 0.4: c = 0.4, s = e^0.4 = 1.491825, loss -1.491825, grad 0;
    # A = +1, log r = 0.3: s = e^0.3 = 1.349859, loss -1.349859, grad -1.349859;
    # A = -1, log r = -0.5 < -0.4: c = -0.4, s = e^-0.4 = 0.670320, loss +0.670320, grad 0;
    # A = -1, log r = 0.5 (A < 0 is not clipped above): s = 1.648721, loss +1.648721,
    #   grad +1.648721 (the unbounded side, as PPO's)
    cases = [(0.5, 1.0, -E(0.4), 0.0), (0.3, 1.0, -E(0.3), -E(0.3)),
             (-0.5, -1.0, E(-0.4), 0.0), (0.5, -1.0, E(0.5), E(0.5))]  # fmt: skip
    for log_r, adv, value, grad in cases:
        logp = torch.tensor([[log_r]], requires_grad=True)
        loss, _ = gmpo_loss(logp, torch.zeros(1, 1), torch.tensor([adv]), torch.ones(1, 1) > 0)
        loss.backward()
        assert loss.item() == pytest.approx(value, abs=1e-6), (log_r, adv)
        assert logp.grad.item() == pytest.approx(grad, abs=1e-6), (log_r, adv)


def test_geometric_mean_damps_an_outlier_token_that_grpo_would_not():
    # 1 row, A = +1, log r [-2, 0, 0] (a token the policy has made e^-2 less likely; A > 0 has no
    # lower clip): GMPO s = e^(-2/3) = 0.513417, every token pushed by s / 3 (token_mean over 3:
    # grad -0.513417 / 3 = -0.171139 each); GRPO pushes each by its own r / 3:
    # [-e^-2 / 3, -1/3, -1/3] = [-0.045112, -0.333333, -0.333333]
    logp = torch.tensor([[-2.0, 0.0, 0.0]])
    beh, adv, mask = torch.zeros(1, 3), torch.ones(1), torch.ones(1, 3) > 0
    _, g_grad, _ = _run(gmpo_loss, logp, beh, adv, mask)
    _, r_grad, _ = _run(grpo_loss, logp, beh, adv, mask)
    _assert_grad(g_grad, [[-E(-2 / 3) / 3] * 3])
    _assert_grad(r_grad, [[-E(-2) / 3, -1 / 3, -1 / 3]])


@pytest.mark.parametrize("eps", [0.4, 0.1])
def test_the_papers_ratio_space_formula_with_its_symmetric_range(eps):
    # The paper: ( prod_t min(r^sgn, clip(r^sgn, e^-eps, e^eps))^sgn )^(1/n) A per sequence, the
    # mean over sequences (seq_mean), computed here directly in ratio space on the stale batch
    logp, beh, adv, mask = _stale_batch()
    loss, _ = gmpo_loss(logp, beh, adv, mask, eps_low=eps, eps_high=eps, agg="seq_mean")
    terms = []
    for i in range(4):
        n = int(mask[i].sum())
        if n == 0:
            continue
        sgn = 1.0 if adv[i] >= 0 else -1.0
        prod = 1.0
        for t in range(n):
            w = math.exp(float(logp[i, t] - beh[i, t])) ** sgn
            prod *= min(w, min(max(w, math.exp(-eps)), math.exp(eps))) ** sgn
        terms.append(prod ** (1 / n) * float(adv[i]))
    assert loss.item() == pytest.approx(-sum(terms) / len(terms), abs=1e-6)


# ================================================================ on-policy reduction


@pytest.mark.parametrize(("agg", "norm_len"), AGG_CASES)
def test_on_policy_gmpo_equals_grpo(agg, norm_len):
    # every r = 1: c = 0 inside any range, s = 1: the row term A_i on each token, as GRPO's
    # r A = A; d(row term)/d logp_t = A_i / n_i, summed over the n_i tokens' terms -> A_i, as GRPO
    logp, beh, adv, mask = _fresh_batch()
    kw = {"agg": agg, "norm_len": norm_len}
    m_loss, m_grad, m_stats = _run(gmpo_loss, logp, beh, adv, mask, **kw)
    g_loss, g_grad, _ = _run(grpo_loss, logp, beh, adv, mask, **kw)
    torch.testing.assert_close(m_loss, g_loss)
    torch.testing.assert_close(m_grad, g_grad)
    torch.testing.assert_close(m_grad, -_row_weights(mask, agg, norm_len) * adv.unsqueeze(1) * mask)
    assert m_stats["clip_frac"] == 0.0 and m_stats["seq_ratio_mean"] == 1.0


# ================================================================ micro-batches, KL


@pytest.mark.parametrize("agg", AGG_MODES)
def test_micro_batches_add_up(agg):
    # the row term needs only its own row: chunks [0:1], [1:3], [3:4] with the whole batch's
    # denom sum to the whole batch, loss and gradient (eps 0.1: some tokens are clipped)
    logp, beh, adv, mask = _stale_batch()
    norm_len = 3 if agg == "seq_sum_norm" else None
    kw = {"eps_low": 0.1, "eps_high": 0.1, "agg": agg, "norm_len": norm_len,
          "denom": agg_denominator(mask, agg, norm_len)}  # fmt: skip
    whole, whole_pg, whole_grad = _loss_and_grad(gmpo_loss, logp, beh, adv, mask, [(0, 4)], **kw)
    parts, parts_pg, parts_grad = _loss_and_grad(gmpo_loss, logp, beh, adv, mask, SPLITS, **kw)
    torch.testing.assert_close(parts, whole)
    assert parts_pg == pytest.approx(whole_pg, abs=1e-6)
    torch.testing.assert_close(parts_grad, whole_grad)
    assert torch.isfinite(whole_grad).all() and whole_grad.abs().sum() > 0
    _, stats = gmpo_loss(logp, beh, adv, mask, **kw)
    assert stats["clip_frac"] > 0


def test_argument_guards():
    # (the k3 KL term and its ref_logp guard: test_corrections.py, parametrized over the losses)
    logp, beh, adv, mask = _stale_batch()
    with pytest.raises(ValueError, match="clip eps must be >= 0"):
        gmpo_loss(logp, beh, adv, mask, eps_low=-0.1)


# ================================================================ registered: YAML, checks


def test_algo_gmpo_is_registered_with_the_papers_range():
    cfg, _ = resolve(compose(["algo=gmpo"]))
    a = cfg.algo
    assert (a.name, a.eps_low, a.eps_high, a.loss_agg) == ("gmpo", 0.4, 0.4, "seq_mean")
    assert LOSSES["gmpo"].schema is GmpoConfig and a.mask == "none"
    resolve(compose(["algo=gmpo", "algo.mask=geometric", "algo.loss_agg=token_mean"]))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # checks.py's rule, written for 1 - eps_low in ratio space, also bounds the log-space
        # eps_low of GMPO: its lower clip stays above e^-1
        (["algo.eps_low=1.0"], "algo.eps_low=1.0 must be in [0, 1)"),
        (["algo.eps_high=-0.1"], "algo.eps_high=-0.1 must be >= 0"),
        (["algo.loss_agg=mean"], "algo.loss_agg=mean is unknown; choose one of "
                                 "['seq_mean', 'seq_sum_norm', 'token_mean']"),
    ],
)  # fmt: skip
def test_bad_gmpo_config_is_refused_in_one_line(overrides, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        resolve(compose(["algo=gmpo", *overrides, f"output_root={tmp_path / 'runs'}"]))
    assert str(err.value) == message
