"""generation.sampler=cached_loop: the distribution it samples, greedy equal to transformers
generate, reproducible draws, behaviour log-probs equal to a teacher-forced forward."""

from __future__ import annotations

import pytest
import torch

from replay_exp.config.composition import compose
from replay_exp.models import build_char_tokenizer, build_tiny_model
from replay_exp.rollout import HFGenerator, SamplingParams
from replay_exp.rollout.collect import tokenize_prompts
from replay_exp.rollout.sampler import next_token


@pytest.fixture(scope="module")
def setup():
    cfg = compose(["model.hidden_size=32", "model.num_layers=2", "model.intermediate_size=64"])
    tok = build_char_tokenizer()
    return tok, build_tiny_model(cfg.model, tok, seed=3)


def test_next_token_samples_the_tempered_nucleus():
    # p = softmax([2, 1, 0, -1] / 0.5) = e^[4, 2, 0, -2] / sum = [0.8668, 0.1173, 0.0159, 0.0021].
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(20000, 1)
    probs = torch.softmax(logits[0] / 0.5, dim=-1)
    rng = torch.Generator().manual_seed(0)
    tok, logp = next_token(logits, SamplingParams(0.5, 1.0, 1), rng)
    freq = torch.bincount(tok, minlength=4) / len(tok)
    assert (freq - probs).abs().max() < 0.01
    assert torch.allclose(logp, probs.log()[tok])  # log-prob of the drawn token
    # top_p = 0.9: the nucleus is the first two tokens (0.8668 < 0.9 <= 0.9841), renormalised
    # to [0.8808, 0.1192]; the log-prob stays that of the untruncated distribution.
    tok, logp = next_token(logits, SamplingParams(0.5, 0.9, 1), rng)
    freq = torch.bincount(tok, minlength=4) / len(tok)
    assert freq[2:].sum() == 0 and abs(freq[0] - 0.8808) < 0.01
    assert torch.allclose(logp, probs.log()[tok])
    # Greedy: the argmax, its log-prob at temperature 1.
    tok, logp = next_token(logits[:2], SamplingParams(0.0, 1.0, 1), None)
    assert tok.tolist() == [0, 0]
    assert torch.allclose(logp, torch.log_softmax(logits[0], -1)[0].expand(2))


@pytest.mark.parametrize(
    "prompts", [["12+345=", "7+8=", "999+1=", "7+8="], ["7+8=", "999+1=", "12+345=", "5+5="]]
)  # a repeated prompt; all distinct, unsorted (the evaluation's case)
def test_greedy_equals_transformers_generate(setup, prompts):
    tok, model = setup
    ids, mask = tokenize_prompts(tok, prompts)
    params = SamplingParams(0.0, 1.0, 6)
    ours = HFGenerator(model, tok.pad_token_id, tok.eos_token_id, sampler="cached_loop")
    hf = HFGenerator(model, tok.pad_token_id, tok.eos_token_id, sampler="generate")
    a, b = ours.generate(ids, mask, params, seed=0), hf.generate(ids, mask, params, seed=0)
    assert torch.equal(a.completion_ids_BxC, b.completion_ids_BxC)
    assert torch.equal(a.completion_mask_BxC, b.completion_mask_BxC)
    assert torch.allclose(a.behaviour_logp_BxC, b.behaviour_logp_BxC, atol=1e-5)


@pytest.mark.parametrize("sampler", ["cached_loop", "generate"])
def test_samplers_are_reproducible(setup, sampler):
    tok, model = setup
    ids, mask = tokenize_prompts(tok, [p for p in ["12+345=", "7+8="] for _ in range(6)])
    params = SamplingParams(1.0, 0.95, 6)
    whole = HFGenerator(model, tok.pad_token_id, tok.eos_token_id, sampler=sampler)
    g1, g2 = whole.generate(ids, mask, params, seed=5), whole.generate(ids, mask, params, seed=5)
    assert torch.equal(g1.completion_ids_BxC, g2.completion_ids_BxC)
    g3 = whole.generate(ids, mask, params, seed=6)
    assert not torch.equal(g1.completion_ids_BxC, g3.completion_ids_BxC)


def test_unknown_sampler_is_refused(setup):
    tok, model = setup
    with pytest.raises(ValueError, match="generation.sampler='beam' is unknown"):
        HFGenerator(model, tok.pad_token_id, tok.eos_token_id, sampler="beam")


def test_same_seed_same_draws_as_transformers_generate(setup):
    """Both draw with torch.multinomial from the same probabilities and a generator seeded
    alike, so at T=1, top_p=1 they sample the very same tokens: the cached loop changes the
    cost of a rollout, not the rollout."""
    tok, model = setup
    ids, mask = tokenize_prompts(tok, [p for p in ["12+345=", "7+8=", "999+1="] for _ in range(8)])
    params = SamplingParams(1.0, 1.0, 6)
    ours = HFGenerator(model, tok.pad_token_id, tok.eos_token_id, sampler="cached_loop")
    hf = HFGenerator(model, tok.pad_token_id, tok.eos_token_id, sampler="generate")
    a, b = ours.generate(ids, mask, params, seed=4), hf.generate(ids, mask, params, seed=4)
    assert torch.equal(a.completion_ids_BxC, b.completion_ids_BxC)
    assert torch.allclose(a.behaviour_logp_BxC, b.behaviour_logp_BxC, atol=1e-5)
