"""Hand-pinned numbers for the GRPO loss, aggregation modes and token log-probs."""

from __future__ import annotations

import math

import pytest
import torch

from replay_exp.algo import agg_denominator, aggregate, grpo_loss, masked_mean, token_logprobs

EPS = 1e-6


def _one_token_batch(ratios, advs):
    """B rows, C=1: logp = log(ratio), behaviour logp = 0, so exp(logp - behaviour) = ratio."""
    logp_BxC = torch.tensor(ratios).log().unsqueeze(1).requires_grad_(True)
    behaviour_BxC = torch.zeros_like(logp_BxC)
    mask_BxC = torch.ones(len(ratios), 1, dtype=torch.bool)
    return logp_BxC, behaviour_BxC, torch.tensor(advs), mask_BxC


# ---------------------------------------------------------------- token_logprobs


def test_token_logprobs_temperature_2():
    # logits [0, ln2, ln4], T=2 -> scaled [0, ln2/2, ln2] -> exp = [1, sqrt2, 2], Z = 3 + sqrt2
    # logp(id 2) = ln2 - ln(4.41421356) = 0.69314718 - 1.48482969 = -0.79168251
    # (at T=1 it would be ln4 - ln7 = -0.5596).
    # p = [0.22654092, 0.32037724, 0.45308184]; H = -sum p ln p
    #   = 0.22654092*1.48482969 + 0.32037724*1.13825610 + 0.45308184*0.79168251
    #   = 0.33637468 + 0.36467135 + 0.35869697 = 1.05974300
    logits = torch.tensor([[[0.0, math.log(2), math.log(4)]]])
    logp, ent = token_logprobs(logits, torch.tensor([[2]]), temperature=2.0)
    assert logp.shape == ent.shape == (1, 1)
    assert logp.item() == pytest.approx(-0.79168251, abs=1e-6)
    assert ent.item() == pytest.approx(1.05974300, abs=1e-6)


def test_token_logprobs_uniform_entropy_is_log_v():
    # all logits equal, V=8: p = 1/8 -> logp = -ln8 = -2.0794415, H = ln8, any temperature
    logits = torch.full((2, 3, 8), 5.0)
    ids = torch.tensor([[0, 3, 7], [1, 2, 5]])
    for t in (1.0, 0.7):
        logp, ent = token_logprobs(logits, ids, temperature=t)
        torch.testing.assert_close(logp, torch.full((2, 3), -math.log(8)))
        torch.testing.assert_close(ent, torch.full((2, 3), math.log(8)))


def test_token_logprobs_gradient_and_bf16_and_masked_vocab():
    # d logp(id)/d z_j = 1[j=id] - p_j; for the uniform V=4 at T=1 and id=1:
    # [-0.25, 0.75, -0.25, -0.25]. A -inf logit (p=0) must not give a nan entropy:
    # logits [0,0,-inf] -> H = ln2 = 0.6931472.
    logits = torch.zeros(1, 1, 4, requires_grad=True)
    logp, _ = token_logprobs(logits, torch.tensor([[1]]))
    logp.sum().backward()
    torch.testing.assert_close(logits.grad, torch.tensor([[[-0.25, 0.75, -0.25, -0.25]]]))
    _, ent = token_logprobs(torch.tensor([[[0.0, 0.0, -math.inf]]]), torch.tensor([[0]]))
    assert ent.item() == pytest.approx(math.log(2), abs=1e-6)
    logp16, _ = token_logprobs(torch.zeros(1, 1, 4, dtype=torch.bfloat16), torch.tensor([[1]]))
    assert logp16.dtype == torch.float32
    assert logp16.item() == pytest.approx(-math.log(4), abs=1e-6)


# ---------------------------------------------------------------- masked_mean / aggregate

# loss [[1,2,3],[4,G,G]], G = garbage on padding (must never be read)
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, math.nan, math.inf]])
MASK = torch.tensor([[True, True, True], [True, False, False]])


def test_masked_mean():
    # all: (1+2+3+4)/4 = 2.5; per row: [6/3, 4/1] = [2, 4]; per column: [(1+4)/2, 2, 3]
    assert masked_mean(LOSS, MASK).item() == pytest.approx(2.5)
    torch.testing.assert_close(masked_mean(LOSS, MASK, dim=1), torch.tensor([2.0, 4.0]))
    torch.testing.assert_close(masked_mean(LOSS, MASK, dim=0), torch.tensor([2.5, 2.0, 3.0]))
    # an all-False row gives 0, not nan
    empty = torch.tensor([[True, True, True], [False, False, False]])
    torch.testing.assert_close(masked_mean(LOSS, empty, dim=1), torch.tensor([2.0, 0.0]))


@pytest.mark.parametrize(
    ("mode", "norm_len", "expected"),
    [
        ("token_mean", None, 2.5),  # (1+2+3+4) / 4 tokens
        ("seq_mean", None, 3.0),  # (6/3 + 4/1) / 2 sequences = (2 + 4) / 2
        ("seq_sum_norm", 4, 1.25),  # (1+2+3+4) / (B=2 * norm_len=4)
        ("seq_sum_norm", 5, 1.0),  # 10 / (2 * 5)
    ],
)
def test_aggregate_uneven_lengths(mode, norm_len, expected):
    out = aggregate(LOSS, MASK, mode, norm_len=norm_len)
    assert out.shape == ()
    assert out.item() == pytest.approx(expected)


def test_aggregate_empty_rows_and_empty_batch():
    # loss [[1,2],[G,G]], row 1 empty: token_mean 3/2 = 1.5; seq_mean leaves the empty row out
    # -> 1.5; seq_sum_norm counts all B rows: 3 / (2*2) = 0.75
    loss = torch.tensor([[1.0, 2.0], [math.nan, -math.inf]])
    mask = torch.tensor([[True, True], [False, False]])
    assert aggregate(loss, mask, "token_mean").item() == pytest.approx(1.5)
    assert aggregate(loss, mask, "seq_mean").item() == pytest.approx(1.5)
    assert aggregate(loss, mask, "seq_sum_norm", norm_len=2).item() == pytest.approx(0.75)
    none = torch.zeros_like(mask)
    for mode in ("token_mean", "seq_mean", "seq_sum_norm"):
        assert aggregate(loss, none, mode, norm_len=2).item() == 0.0


@pytest.mark.parametrize(
    ("mode", "denom", "row_parts"),
    [
        # LOSS / MASK above: 4 valid tokens, 2 sequences, B * norm_len = 2 * 4 = 8
        ("token_mean", 4.0, [6 / 4, 4 / 4]),  # row sums / 4: 1.5 + 1 = 2.5 (own: 2 + 4 = 6)
        ("seq_mean", 2.0, [2 / 2, 4 / 2]),  # row means / 2: 1 + 2 = 3 (own: 2 + 4 = 6)
        ("seq_sum_norm", 8.0, [6 / 8, 4 / 8]),  # row sums / 8: 0.75 + 0.5 = 1.25 (own: 2.5)
    ],
)
def test_aggregate_of_row_chunks_with_the_batch_denominator_adds_up(mode, denom, row_parts):
    # Each row aggregated alone but divided by the whole batch's normaliser is its share of
    # the batch value: the shares add up to test_aggregate_uneven_lengths' numbers.
    whole = agg_denominator(MASK, mode, norm_len=4)
    assert whole.item() == denom
    parts = [aggregate(LOSS[i : i + 1], MASK[i : i + 1], mode, 4, denom=whole) for i in (0, 1)]
    assert [x.item() for x in parts] == pytest.approx(row_parts)
    assert sum(parts).item() == pytest.approx(aggregate(LOSS, MASK, mode, 4).item())


def test_aggregate_bad_mode_and_missing_norm_len():
    with pytest.raises(ValueError, match=r"'tok_mean'.*token_mean.*seq_mean.*seq_sum_norm"):
        aggregate(LOSS, MASK, "tok_mean")
    with pytest.raises(ValueError, match="norm_len"):
        aggregate(LOSS, MASK, "seq_sum_norm")


# ---------------------------------------------------------------- grpo_loss: clipping

# eps_low = eps_high = 0.2, one token per row, loss = -objective (token_mean over 1 token)
CLIP_CASES = [
    # ratio, A, objective, d(loss)/d(logp)
    (1.1, 1.0, 1.1, -1.1),  # inside clip, A>0: min(1.1, 1.1) = 1.1; grad -ratio*A
    (0.9, -1.0, -0.9, 0.9),  # inside clip, A<0: min(-0.9, -0.9)
    (1.5, 1.0, 1.2, 0.0),  # above, A>0: min(1.5, 1.2) = 1.2 -> clipped, zero grad
    (0.5, -1.0, -0.8, 0.0),  # below, A<0: min(-0.5, -0.8) = -0.8 -> clipped, zero grad
    (1.5, -1.0, -1.5, 1.5),  # above, A<0: min(-1.5, -1.2) = -1.5 -> clip does NOT bind
    (0.5, 1.0, 0.5, -0.5),  # below, A>0: min(0.5, 0.8) = 0.5 -> clip does NOT bind
    (1.5, 2.0, 2.4, 0.0),  # above, A=2: min(3.0, 1.2*2 = 2.4) = 2.4 -> clipped
]


@pytest.mark.parametrize(("ratio", "adv", "objective", "grad"), CLIP_CASES)
def test_clip_single_token(ratio, adv, objective, grad):
    logp, beh, adv_B, mask = _one_token_batch([ratio], [adv])
    loss, stats = grpo_loss(logp, beh, adv_B, mask)
    assert loss.item() == pytest.approx(-objective, abs=1e-6)
    assert stats["pg_loss"] == pytest.approx(-objective, abs=1e-6)
    loss.backward()
    # chain rule: d(ratio*A)/d(logp) = ratio*A; on clipped tokens the gradient is EXACTLY zero
    if grad == 0.0:
        assert logp.grad.item() == 0.0
        assert stats["clip_frac"] == 1.0
    else:
        assert logp.grad.item() == pytest.approx(grad, abs=1e-6)
        assert stats["clip_frac"] == 0.0


def test_clip_batch_stats_and_grads():
    # ratios [1.1, 0.95, 1.5, 0.5, 1.5, 0.5], A [+1, -1, +1, -1, -1, +1]
    # objective [1.1, -0.95, 1.2 (clip), -0.8 (clip), -1.5, 0.5], sum = -0.45
    # loss = -(-0.45)/6 = 0.075
    # grad = -ratio*A/6 on unclipped: [-1.1/6, 0.95/6, 0, 0, 1.5/6, -0.5/6]
    # clip_frac = 2/6 (rows 2,3); low: row 3 (0.5<0.8, A<0) 1/6; high: row 2 (1.5>1.2, A>0) 1/6
    # ratio_mean = 6.05/6 = 1.0083333, min 0.5, max 1.5
    # approx_kl = mean((r-1) - ln r) = (0.0046898 + 0.0012933 + 2*0.0945349 + 2*0.1931472)/6
    #           = 0.5813473/6 = 0.0968912
    logp, beh, adv, mask = _one_token_batch([1.1, 0.95, 1.5, 0.5, 1.5, 0.5], [1, -1, 1, -1, -1, 1])
    loss, stats = grpo_loss(logp, beh, adv, mask)
    assert loss.item() == pytest.approx(0.075, abs=1e-6)
    loss.backward()
    expected = torch.tensor([-1.1, 0.95, 0.0, 0.0, 1.5, -0.5]) / 6
    torch.testing.assert_close(logp.grad.squeeze(1), expected)
    assert logp.grad[2].item() == 0.0 and logp.grad[3].item() == 0.0
    assert stats["clip_frac"] == pytest.approx(2 / 6)
    assert stats["clip_frac_low"] == pytest.approx(1 / 6)
    assert stats["clip_frac_high"] == pytest.approx(1 / 6)
    assert stats["ratio_mean"] == pytest.approx(6.05 / 6)
    assert stats["ratio_min"] == pytest.approx(0.5)
    assert stats["ratio_max"] == pytest.approx(1.5)
    assert stats["approx_kl"] == pytest.approx(0.0968912, abs=1e-6)
    assert "kl_ref" not in stats
    assert all(isinstance(v, float) for v in stats.values())


def test_asymmetric_clip():
    # eps_low 0.2, eps_high 0.28, A=+1: ratio 1.25 < 1.28 not clipped (obj 1.25);
    # ratio 1.3 > 1.28 clipped (obj 1.28). token_mean loss = -(1.25 + 1.28)/2 = -1.265
    # with A=-1, ratio 0.75 < 0.8 clipped -> obj -0.8 (low bound still 1 - 0.2)
    logp, beh, adv, mask = _one_token_batch([1.25, 1.3, 0.75], [1, 1, -1])
    loss, stats = grpo_loss(logp, beh, adv, mask, eps_low=0.2, eps_high=0.28)
    # -(1.25 + 1.28 - 0.8)/3 = -1.73/3 = -0.5766667
    assert loss.item() == pytest.approx(-1.73 / 3, abs=1e-6)
    assert stats["clip_frac_high"] == pytest.approx(1 / 3)
    assert stats["clip_frac_low"] == pytest.approx(1 / 3)
    loss.backward()
    torch.testing.assert_close(logp.grad.squeeze(1), torch.tensor([-1.25 / 3, 0.0, 0.0]))


def test_zero_advantage_is_never_clipped():
    # A=0: objective 0 on both branches, no clip counted even far outside the range
    logp, beh, adv, mask = _one_token_batch([3.0, 0.1], [0.0, 0.0])
    loss, stats = grpo_loss(logp, beh, adv, mask)
    assert loss.item() == 0.0
    assert stats["clip_frac"] == 0.0


# ---------------------------------------------------------------- grpo_loss: aggregation, KL


@pytest.mark.parametrize(
    ("agg", "norm_len", "expected"),
    [
        # row 0: A=+1, 3 tokens at ratio 1 -> objective 1 each; row 1: A=-1, 1 token -> -1
        ("token_mean", None, -0.5),  # -(1+1+1-1)/4
        ("seq_mean", None, 0.0),  # -(3/3 + -1/1)/2
        ("seq_sum_norm", 4, -0.25),  # -(3-1)/(2*4)
    ],
)
def test_grpo_loss_aggregation_modes(agg, norm_len, expected):
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    loss, stats = grpo_loss(
        logp, logp.clone(), torch.tensor([1.0, -1.0]), mask, agg=agg, norm_len=norm_len
    )
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats["ratio_mean"] == 1.0 and stats["approx_kl"] == 0.0


def test_kl_term():
    # logp = [ln .5, ln .5], ref = [ln .25, ln .5], behaviour = logp (ratio 1), A = 0 -> pg 0
    # d = ref - logp = [ln .5, 0]; k3 = e^d - d - 1 = [0.5 + 0.6931472 - 1, 0] = [0.1931472, 0]
    # token_mean kl_ref = 0.0965736; loss = 0.1 * 0.0965736 = 0.00965736
    # d k3/d logp = 1 - e^d = [0.5, 0] -> grad = 0.1 * [0.5, 0] / 2 = [0.025, 0]
    logp = torch.tensor([[math.log(0.5), math.log(0.5)]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, stats = grpo_loss(
        logp, logp.detach().clone(), torch.zeros(1), mask, kl_coef=0.1, ref_logp_BxC=ref
    )
    assert loss.item() == pytest.approx(0.00965736, abs=1e-7)
    assert stats["kl_ref"] == pytest.approx(0.0965736, abs=1e-6)
    assert stats["pg_loss"] == 0.0
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.025, 0.0]]))


def test_kl_without_ref_raises():
    logp, beh, adv, mask = _one_token_batch([1.0], [1.0])
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(logp, beh, adv, mask, kl_coef=0.1)


# ---------------------------------------------------------------- grpo_loss: padding


@pytest.mark.parametrize("garbage", [-math.inf, math.inf, math.nan, 0.0, 50.0])
def test_padding_garbage_does_not_leak(garbage):
    # Same 6-row batch as test_clip_batch_stats_and_grads plus one padded column whose logp,
    # behaviour and ref logp are garbage. A +inf/50 logp there would be a ratio > 1.2 with A>0,
    # i.e. "clipped", if padding were read. Loss, stats and grads must equal the C=1 case.
    ratios = torch.tensor([1.1, 0.95, 1.5, 0.5, 1.5, 0.5])
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 1.0])
    pad = torch.full((6, 1), garbage)
    logp = torch.cat([ratios.log().unsqueeze(1), pad], dim=1).requires_grad_(True)
    beh = torch.cat([torch.zeros(6, 1), torch.full((6, 1), -garbage)], dim=1)
    ref = torch.cat([ratios.log().unsqueeze(1), pad], dim=1)
    mask = torch.tensor([[True, False]] * 6)
    for agg, norm_len in (("token_mean", None), ("seq_mean", None), ("seq_sum_norm", 1)):
        logp.grad = None
        loss, stats = grpo_loss(
            logp, beh, adv, mask, agg=agg, norm_len=norm_len, kl_coef=0.5, ref_logp_BxC=ref
        )
        # one token per row -> all three modes give 0.075 (ref = logp there -> k3 = 0)
        assert loss.item() == pytest.approx(0.075, abs=1e-6)
        assert stats["clip_frac"] == pytest.approx(2 / 6)
        assert stats["ratio_max"] == pytest.approx(1.5)
        assert stats["ratio_min"] == pytest.approx(0.5)
        assert stats["approx_kl"] == pytest.approx(0.0968912, abs=1e-6)
        assert stats["kl_ref"] == 0.0
        assert all(math.isfinite(v) for v in stats.values())
        loss.backward()
        assert torch.isfinite(logp.grad).all()
        assert torch.equal(logp.grad[:, 1], torch.zeros(6))
        expected = torch.tensor([-1.1, 0.95, 0.0, 0.0, 1.5, -0.5]) / 6
        torch.testing.assert_close(logp.grad[:, 0], expected)


def test_no_valid_tokens():
    # everything padded: loss 0, ratio stats 1.0, no nan
    logp = torch.full((2, 3), -math.inf, requires_grad=True)
    loss, stats = grpo_loss(logp, torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3, dtype=bool))
    assert loss.item() == 0.0
    assert stats["ratio_mean"] == stats["ratio_min"] == stats["ratio_max"] == 1.0
    assert all(math.isfinite(v) for v in stats.values())
    loss.backward()
    assert torch.equal(logp.grad, torch.zeros(2, 3))


def test_behaviour_and_advantage_get_no_gradient():
    logp = torch.tensor([[math.log(1.1)]], requires_grad=True)
    beh = torch.zeros(1, 1, requires_grad=True)
    adv = torch.ones(1, requires_grad=True)
    loss, _ = grpo_loss(logp, beh, adv, torch.ones(1, 1, dtype=torch.bool))
    loss.backward()
    assert beh.grad is None and adv.grad is None
    assert logp.grad.item() == pytest.approx(-1.1, abs=1e-6)
