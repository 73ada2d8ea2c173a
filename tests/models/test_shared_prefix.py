"""The shared-prompt forward equals the full forward, values and gradients."""

from __future__ import annotations

import pytest
import torch

from replay_exp.config.composition import compose
from replay_exp.models import build_char_tokenizer, build_tiny_model
from replay_exp.models.shared_prefix import completion_logits, positions, unique_prompts
from replay_exp.models.tiny import load_pretrained
from replay_exp.rollout.collect import tokenize_prompts


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "tiny_qwen3_hub_dir"])
def model_tok(request):
    if request.param == "tiny_qwen3_hub_dir":  # Qwen3-0.6B's shape: GQA, head_dim, untied head
        return load_pretrained(request.getfixturevalue(request.param))
    cfg = compose([f"model.arch={request.param}", "model.hidden_size=32", "model.num_layers=2",
                   "model.intermediate_size=64"])  # fmt: skip
    tok = build_char_tokenizer()
    return build_tiny_model(cfg.model, tok, seed=0), tok


def _batch(tok, G=3):
    # Different lengths (left padding differs), not in sorted order.
    prompts = ["12+345=", "7+8=", "999+1="]
    ids, mask = tokenize_prompts(tok, [p for p in prompts for _ in range(G)])
    gen = torch.Generator().manual_seed(0)
    comp = torch.randint(4, 14, (ids.shape[0], 5), generator=gen)
    comp_mask = torch.ones_like(comp, dtype=torch.bool)
    comp_mask[0, 3:] = False  # an early EOS: padding after it
    return ids, mask, comp, comp_mask


def _full_logits(model, ids, mask, comp, comp_mask):
    all_ids, all_mask = torch.cat([ids, comp], 1), torch.cat([mask, comp_mask], 1)
    out = model(input_ids=all_ids, attention_mask=all_mask.long(), position_ids=positions(all_mask))
    return out.logits[:, ids.shape[1] - 1 : -1]


def test_unique_prompts_maps_rows_back():
    ids = torch.tensor([[0, 5, 6], [7, 8, 9], [0, 5, 6]])
    mask = ids != 0
    u_ids, u_mask, inverse = unique_prompts(ids, mask)
    assert (
        len(u_ids) == 2 and torch.equal(u_ids[inverse], ids) and torch.equal(u_mask[inverse], mask)
    )


@pytest.mark.parametrize("G", [3, 1])  # groups of 3 rows; every prompt distinct
def test_values_and_gradients_match_the_full_forward(model_tok, G):
    model, tok = model_tok
    ids, mask, comp, comp_mask = _batch(tok, G)
    weights = torch.randn(comp.shape + (model.config.vocab_size,), generator=torch.Generator())

    def grads(fn):
        model.zero_grad()
        logits = fn(model, ids, mask, comp, comp_mask)
        (logits * weights * comp_mask[..., None]).sum().backward()
        return logits.detach(), [p.grad.clone() for p in model.parameters()]

    shared, g_shared = grads(completion_logits)
    full, g_full = grads(_full_logits)
    m = comp_mask
    assert torch.allclose(shared[m], full[m], atol=1e-5)
    for a, b in zip(g_shared, g_full, strict=True):
        # Float32 sums round relative to the size of what they add: an embedding gradient of
        # the 512-token Qwen3 reaches ~300, and is 1e-4 off (3.5e-7 of it).
        scale = max(1.0, float(b.abs().max()) / 10)
        assert torch.allclose(a, b, atol=1e-5 * scale, rtol=1e-4)
