"""Per-update diagnostics (replay_exp.algo.diagnostics): every statistic on a batch small
enough to compute by hand, padding that holds garbage, and the on-policy case."""

from __future__ import annotations

import math

import pytest
import torch

from replay_exp.algo.diagnostics import LAG_BUCKETS, update_diagnostics

L = math.log


def _batch(pad: float = 0.0):
    """Two rows of two tokens (plus one padding column holding ``pad``).

    Row 0: lag 0, ratio r = 1 on both tokens, A = +1.
    Row 1: lag 5, r = 1.5 and 0.5, A = -1.
    After the update: token (0, 0) gains log 1.1, token (1, 1) gains log 0.9.
    """
    behaviour = torch.tensor([[-1.0, -2.0, pad], [-0.5, -1.5, pad]])
    before = behaviour + torch.tensor([[0.0, 0.0, pad], [L(1.5), L(0.5), pad]])
    after = before + torch.tensor([[L(1.1), 0.0, pad], [0.0, L(0.9), pad]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    return before, after, behaviour, mask, torch.tensor([1.0, -1.0]), torch.tensor([0, 5])


def test_hand_computed_statistics():
    d = update_diagnostics(*_batch())
    # k3(log r) = r - 1 - log r: r = 1.5 -> 0.0945349, r = 0.5 -> 0.1931472.
    k3_15, k3_05 = 0.5 - L(1.5), -0.5 - L(0.5)
    # Whole batch, 4 tokens: the clip zeroes only (1, 1) (r < 0.8 with A < 0); (1, 0) is outside
    # the range but A < 0 keeps its gradient.
    assert d["clip_frac"] == pytest.approx(1 / 4)
    assert d["outside_clip"] == pytest.approx(2 / 4)
    assert d["ratio_dev"] == pytest.approx((0.5 + 0.5) / 4)
    assert d["kl"] == pytest.approx((k3_15 + k3_05) / 4)
    # Buckets: row 0 is lag 0, row 1 lag 5 (bucket 4-15); the others are empty (NaN).
    assert d["lag0/token_frac"] == 0.5 and d["lag4-15/token_frac"] == 0.5
    assert d["lag0/kl"] == 0 and d["lag0/clip_frac"] == 0 and d["lag0/ratio_dev"] == 0
    assert d["lag4-15/clip_frac"] == pytest.approx(0.5)
    assert d["lag4-15/outside_clip"] == pytest.approx(1.0)
    assert d["lag4-15/ratio_dev"] == pytest.approx(0.5)
    assert d["lag4-15/kl"] == pytest.approx((k3_15 + k3_05) / 2)
    for name in ("lag1-3", "lag16+"):
        assert d[f"{name}/token_frac"] == 0
        assert math.isnan(d[f"{name}/kl"]) and math.isnan(d[f"{name}/clip_frac"])
    # Sequence weights prod r: 1 and 1.5 * 0.5 = 0.75 -> ESS 1.75^2 / (1 + 0.5625) = 1.96 of 2.
    assert d["ess_frac"] == pytest.approx(1.96 / 2)
    # update_kl: k3(log 1.1) = 0.0046898 on a token of weight r = 1, k3(log 0.9) = 0.0053605 on a
    # token of weight 0.5; the weights sum to 1 + 1 + 1.5 + 0.5 = 4.
    k3_11, k3_09 = 0.1 - L(1.1), -0.1 - L(0.9)
    assert d["update_kl"] == pytest.approx((1.0 * k3_11 + 0.5 * k3_09) / 4)


def test_padding_is_never_read():
    clean = update_diagnostics(*_batch(0.0))
    for garbage in (float("nan"), float("inf"), -1e30):
        dirty = update_diagnostics(*_batch(garbage))
        assert dirty.keys() == clean.keys()
        for k, v in clean.items():
            assert (math.isnan(v) and math.isnan(dirty[k])) or dirty[k] == pytest.approx(v), k


def test_on_policy_batch():
    """Fresh rollouts: every ratio is 1 and every weight equal; the update still moves."""
    torch.manual_seed(0)
    behaviour = -torch.rand(4, 3)
    after = behaviour + 0.1 * torch.randn(4, 3)
    mask = torch.ones(4, 3, dtype=torch.bool)
    d = update_diagnostics(
        behaviour, after, behaviour, mask, torch.tensor([1.0, -1, 1, -1]), torch.zeros(4)
    )
    assert d["kl"] == 0 and d["clip_frac"] == 0 and d["ratio_dev"] == 0
    assert d["ess_frac"] == pytest.approx(1.0)
    assert d["lag0/token_frac"] == 1.0
    u = after - behaviour
    assert d["update_kl"] == pytest.approx(float((torch.expm1(u) - u).mean()))
    assert d["update_kl"] > 0


def test_bucket_edges():
    """Lags 0, 1, 3, 4, 15, 16, 40 fall in 0 | 1-3 | 1-3 | 4-15 | 4-15 | 16+ | 16+."""
    lags = torch.tensor([0, 1, 3, 4, 15, 16, 40])
    z = torch.zeros(7, 1)
    d = update_diagnostics(z, z, z, torch.ones(7, 1, dtype=torch.bool), torch.ones(7), lags)
    fracs = [d[f"{name}/token_frac"] for name, _, _ in LAG_BUCKETS]
    assert fracs == pytest.approx([1 / 7, 2 / 7, 2 / 7, 2 / 7])


def test_ess_of_one_dominant_rollout():
    """Log weights 0 and -50: one rollout carries the batch, ESS = 1 of 2 (no overflow)."""
    before = torch.tensor([[0.0], [-50.0]])
    d = update_diagnostics(
        before, before, torch.zeros(2, 1), torch.ones(2, 1, dtype=torch.bool),
        torch.ones(2), torch.tensor([1, 1]),
    )  # fmt: skip
    assert d["ess_frac"] == pytest.approx(0.5)
