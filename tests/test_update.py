"""Micro-batching in the update: the same gradients and stats as the full batch; chunked and
gradient-checkpointed log-probs equal the plain ones. A real (tiny) transformers model."""

from __future__ import annotations

import copy

import pytest
import torch

from replay_exp.config.composition import compose
from replay_exp.config.schemas import build_node
from replay_exp.models import build_char_tokenizer, build_tiny_model
from replay_exp.models.shared_prefix import supports_prefix_sharing
from replay_exp.rollout.synthetic import rollout_batch
from replay_exp.types import RolloutBatch
from replay_exp.update import policy_logprobs, policy_update, row_chunks

NORM_LEN = 12
# Completion lengths, rows in groups of [3 | 3 | 2] prompts. Row 1 is empty. Micro-batches of 3
# hold 3, 34 and 15 valid tokens, of 4: 15 and 37, so a micro-batch divided by its own token
# count (or own row count, for seq_mean / seq_sum_norm) would get a very different gradient.
LENGTHS = [1, 0, 2, 12, 10, 12, 3, 12]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """A model this small runs fastest on one thread (with more, a busy CPU makes the many
    small micro-batch forwards 10-100x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model():
    cfg = compose(["model.hidden_size=32", "model.num_layers=2", "model.intermediate_size=64"])
    return build_tiny_model(cfg.model, build_char_tokenizer(), seed=0)


@pytest.fixture(scope="module")
def batch(model) -> RolloutBatch:
    tok = build_char_tokenizer()
    texts = ["12+345="] * 3 + ["7+8="] * 3 + ["999+1="] * 2  # prompts of different lengths
    enc = tok(texts, padding=True, return_tensors="pt")  # left-padded, with BOS
    ids, mask = enc["input_ids"], enc["attention_mask"].bool()
    B, C = len(texts), max(LENGTHS)
    gen = torch.Generator().manual_seed(0)
    comp_mask = torch.arange(C)[None, :] < torch.tensor(LENGTHS)[:, None]
    comp = torch.where(comp_mask, torch.randint(4, 14, (B, C), generator=gen), tok.pad_token_id)
    reward = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0])
    group = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])
    group_mean = torch.zeros(3).index_add(0, group, reward) / torch.bincount(group)
    rows = rollout_batch(
        ids, comp, prompt_mask_BxP=mask, completion_mask_BxC=comp_mask, reward=reward,
        advantage=reward - group_mean[group],  # unnormalised, so AsymRE can use it too
        group=group,
    )  # fmt: skip
    # Stale behaviour log-probs: the model's own plus noise, so ratios spread around 1, some
    # tokens clip and some sequence TIS weights truncate.
    with torch.no_grad():
        logp, _ = policy_logprobs(model, rows)
    noise = 0.3 * torch.randn(B, C, generator=gen)
    rows.behaviour_logp_BxC = torch.where(comp_mask, logp + noise, 0.0)
    return rows


def _algo(name: str = "grpo", **kw):
    """The node of ``algo=<name>``: its YAML's defaults (conf/algo/<name>.yaml), these shared
    knobs, then ``kw``; exactly the loss's schema keys (the update refuses any other)."""
    base = dict(eps_low=0.2, eps_high=0.2, kl_coef=0.0, loss_agg="token_mean",
                adv_normalize_std=False, grad_clip=None, micro_batch_size=None)  # fmt: skip
    return build_node("algo", name, name=name, **{**base, **kw})


def _grads_and_stats(model, batch, algo, ref_model=None):
    """One update with lr = 0: the accumulated gradient (flat) and the stats."""
    policy = copy.deepcopy(model)
    opt = torch.optim.SGD(policy.parameters(), lr=0.0)
    # version 3: every row (version 0) is 3 updates old, for algo.proximal=loglinear
    stats = policy_update(policy, opt, batch, algo, 1.0, NORM_LEN, ref_model, version=3)
    return torch.cat([p.grad.flatten() for p in policy.parameters()]), stats


CASES = {
    **{f"{name}-{agg}": dict(name=name, loss_agg=agg)
       for name in ("grpo", "asymre") for agg in ("token_mean", "seq_mean", "seq_sum_norm")},
    "grpo-kl": dict(kl_coef=0.1),
    "asymre-kl-seq_mean": dict(name="asymre", kl_coef=0.1, loss_agg="seq_mean"),
    "grpo-tis-sequence": dict(tis_cap=1.0, tis_level="sequence"),
    "grpo-tis-geometric-reweight": dict(tis_cap=1.0, tis_level="geometric",
                                        tis_form="ratio_reweight"),
    "grpo-dualc": dict(clip_ratio_c=1.1),
    "gspo-dualc-seq_mean": dict(name="gspo", clip_ratio_c=1.05, loss_agg="seq_mean"),
    "grpo-tis-token-clip": dict(tis_cap=1.1, grad_clip=1e-3),
    # The stale-data corrections (docs/corrections.md): M2PO's budget is over the whole batch
    # (a no-grad forward of it first when micro-batched); the masks read their own rows.
    **{f"{name}-{agg}": dict(name=name, loss_agg=agg, eps_low=1.0 if name == "cispo" else 0.2)
       for name in ("cispo", "gspo", "topr", "m2po") for agg in ("token_mean", "seq_mean")},
    "grpo-icepop": dict(mask="icepop", mask_low=0.8, mask_high=1.25),
    # |log W| of the rows is at most 0.66: bounds +-log 1.25 drop some rows, not all
    "grpo-seq_mis": dict(mask="seq_mis", mask_low=0.8, mask_high=1.25),
    "grpo-geometric": dict(mask="geometric", mask_geo_delta=0.05),
    "grpo-opsm": dict(mask="opsm"),
    "cispo-icepop": dict(name="cispo", eps_low=1.0, mask="icepop", mask_low=0.8, mask_high=1.25),
    "gspo-seq_mis-seq_mean": dict(name="gspo", mask="seq_mis", mask_low=0.8, mask_high=1.25,
                                  loss_agg="seq_mean"),
    "grpo-recompute": dict(proximal="recompute"),
    "grpo-loglinear-tis": dict(proximal="loglinear", tis_cap=1.1),
    # SAPO, GMPO, DPPO (replay_exp/algo/sapo.py, gmpo.py, dppo.py): per token or per row, so
    # the micro-batches need only their own rows
    **{f"{name}-{agg}": dict(name=name, loss_agg=agg)
       for name in ("sapo", "gmpo", "dppo") for agg in ("token_mean", "seq_mean")},
    "gmpo-tight-seq_sum_norm": dict(name="gmpo", eps_low=0.05, eps_high=0.05,
                                    loss_agg="seq_sum_norm"),
    # the tiny model's probabilities are small, so |pi - mu| < 0.015: tight trust regions
    "dppo-tight-seq_sum_norm": dict(name="dppo", dppo_delta_low=0.005, dppo_delta_high=0.005,
                                    loss_agg="seq_sum_norm"),
    "dppo-kl_tau-icepop": dict(name="dppo", dppo_delta_low=0.002, dppo_delta_high=0.002,
                               dppo_kl_tau=1e-3, mask="icepop", mask_low=0.8, mask_high=1.25),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_micro_batches_give_the_full_batch_gradient_and_stats(model, batch, case):
    kw = CASES[case]
    ref = None
    if kw.get("kl_coef"):
        ref = copy.deepcopy(model)
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    full_g, full = _grads_and_stats(model, batch, _algo(**kw), ref)
    scale = full_g.abs().max()
    assert scale > 0 and full["tokens"] == sum(LENGTHS) and full["batch_size"] == 8
    for m in (1, 3, 4, 8):
        g, stats = _grads_and_stats(model, batch, _algo(**kw, micro_batch_size=m), ref)
        torch.testing.assert_close(g, full_g, rtol=1e-5, atol=1e-5 * scale)
        assert stats.keys() == full.keys()
        for key, value in full.items():
            if key == "extra_forwards":  # M2PO micro-batched pays one whole-batch forward
                assert value == int(kw.get("proximal") == "recompute")
                assert stats[key] == int(kw.get("proximal") == "recompute" or
                                         (kw.get("name") == "m2po" and m < 8))  # fmt: skip
                continue
            assert stats[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (m, key)
    if "tis" in case:
        assert 0 < full["tis_capped_frac"] < 1 and full["tis_weight_min"] < 1
    if "clip" in case:  # grad_clip binds: grad_norm is the pre-clip norm, the same in both
        assert full["grad_norm"] > 1e-3
    if "clip_ratio_c" in kw and kw.get("name", "grpo") == "grpo":
        assert 0 < full["dual_clip_frac"] < 1
    # (the clip of a proximal ratio, of pi / sg(pi) under truncated IS, or of a masked batch
    # may not bind)
    if kw.get("name", "grpo") == "grpo" and not (
        {"proximal", "mask"} & set(kw) or kw.get("tis_cap") and "tis_form" not in kw
    ):
        assert full["clip_frac"] > 0
    if kw.get("name") == "gmpo" or kw.get("dppo_delta_low", 0.2) < 0.2:  # their clip binds
        assert full["clip_frac"] > 0
    if "mask" in kw or kw.get("name") == "m2po":  # the case exercises a mask that drops some
        assert 0 < full["masked_frac"] < 1
    if kw.get("proximal") == "recompute":
        # One optimizer step per batch: pi_prox is the current policy at the forward, so the
        # clip never binds and the weight is pi / mu itself (docs/corrections.md).
        assert full["clip_frac"] == 0 and full["tis_capped_frac"] == 0
        assert full["tis_weight_mean"] == pytest.approx(full["ratio_mean"], rel=1e-6)
        assert full["extra_forwards"] == 1


def test_micro_batch_size_of_zero_is_rejected(model, batch):
    with pytest.raises(ValueError, match="micro_batch_size must be a positive"):
        _grads_and_stats(model, batch, _algo(micro_batch_size=0))


def test_row_chunks():
    assert row_chunks(7, 3) == [slice(0, 3), slice(3, 6), slice(6, 7)]
    assert row_chunks(7, None) == row_chunks(7, 7) == row_chunks(7, 10) == [slice(0, 7)]


@pytest.mark.parametrize("m", [1, 2, 3, 5])  # 2 and 5 split prompt groups across chunks
def test_chunked_logprobs_equal_unchunked(model, batch, m):
    mask = batch.completion_mask_BxC
    with torch.no_grad():
        logp, ent = policy_logprobs(model, batch, temperature=0.7)
        logp_m, ent_m = policy_logprobs(model, batch, temperature=0.7, micro_batch_size=m)
    assert logp_m.shape == ent_m.shape == mask.shape
    torch.testing.assert_close(logp_m[mask], logp[mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent_m[mask], ent[mask], rtol=1e-5, atol=1e-5)


def test_gradient_checkpointing_takes_the_full_forward_with_the_same_values(model, batch):
    ckpt = copy.deepcopy(model)
    ckpt.gradient_checkpointing_enable()
    plain = copy.deepcopy(model)
    ckpt.train(), plain.train()
    # Training under checkpointing drops the KV cache, so no shared-prompt forward; in eval
    # mode checkpointing is off and the cache works.
    assert supports_prefix_sharing(plain) and not supports_prefix_sharing(ckpt)
    assert supports_prefix_sharing(ckpt.eval()) and ckpt.train().is_gradient_checkpointing
    mask = batch.completion_mask_BxC
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(2))

    def logp_and_grads(m):
        logp, _ = policy_logprobs(m, batch)
        torch.where(mask, logp * weights, 0.0).sum().backward()
        return logp.detach()[mask], torch.cat([p.grad.flatten() for p in m.parameters()])

    logp_c, g_c = logp_and_grads(ckpt)
    logp_p, g_p = logp_and_grads(plain)
    torch.testing.assert_close(logp_c, logp_p, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g_c, g_p, rtol=1e-5, atol=1e-5 * g_p.abs().max())
    # ... and a micro-batched update of the checkpointed model has the plain full-batch gradient
    full_g, _ = _grads_and_stats(model, batch, _algo())
    ckpt_g, _ = _grads_and_stats(ckpt, batch, _algo(micro_batch_size=3))
    torch.testing.assert_close(ckpt_g, full_g, rtol=1e-5, atol=1e-5 * full_g.abs().max())
