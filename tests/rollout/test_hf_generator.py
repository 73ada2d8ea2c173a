"""The hf backend: masks, EOS handling, reproducible sampling, behaviour log-probs that match
the trainer's recomputation, and stale weights when not synced."""

from __future__ import annotations

import pytest
import torch

from replay_exp.config.composition import compose
from replay_exp.models import build_char_tokenizer, build_tiny_model
from replay_exp.rollout import HFGenerator, SamplingParams, completion_mask
from replay_exp.rollout.collect import generate_rollouts, tokenize_prompts
from replay_exp.tasks import make_task
from replay_exp.update import policy_logprobs


@pytest.fixture(scope="module")
def setup():
    cfg = compose(["model.hidden_size=32", "model.num_layers=1", "model.intermediate_size=64"])
    tok = build_char_tokenizer()
    return cfg, tok, build_tiny_model(cfg.model, tok, seed=0), make_task(cfg.task)


def test_completion_mask_stops_after_first_eos():
    ids = torch.tensor([[5, 2, 7, 2], [5, 6, 7, 8], [2, 0, 0, 0]])
    mask, finished = completion_mask(ids, eos_id=2)
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert finished.tolist() == [True, False, True]


def test_sampling_is_reproducible_and_logprobs_match_the_trainer(setup):
    cfg, tok, model, task = setup
    gen = HFGenerator(model, tok.pad_token_id, tok.eos_token_id, chunk_size=16)
    problems = task.eval_problems()[:12]
    params = SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=6)
    r1 = generate_rollouts(gen, tok, task, problems, 4, params, 11, 0, 0, 0)
    r2 = generate_rollouts(gen, tok, task, problems, 4, params, 11, 0, 0, 0)
    assert torch.equal(r1.completion_ids_BxC, r2.completion_ids_BxC)
    r3 = generate_rollouts(gen, tok, task, problems, 4, params, 12, 0, 0, 0)
    assert not torch.equal(r1.completion_ids_BxC, r3.completion_ids_BxC)
    assert r1.prompt_ids_BxP.shape[0] == 48 and r1.group_id_B.tolist()[:5] == [0, 0, 0, 0, 1]
    # Left-padded prompts, masks consistent with EOS, zeros on padding.
    assert not r1.prompt_mask_BxP[:, -1].logical_not().any()
    assert (r1.behaviour_logp_BxC[~r1.completion_mask_BxC] == 0).all()
    # The trainer's recomputation (full forward, same temperature) matches generation.
    with torch.no_grad():
        logp, _ = policy_logprobs(model, r1, temperature=0.7)
    m = r1.completion_mask_BxC
    assert torch.allclose(logp[m], r1.behaviour_logp_BxC[m], atol=1e-4)


def test_greedy_is_deterministic_without_seed_effect(setup):
    cfg, tok, model, task = setup
    gen = HFGenerator(model, tok.pad_token_id, tok.eos_token_id)
    ids, mask = tokenize_prompts(tok, [p.prompt for p in task.eval_problems()[:8]])
    g1 = gen.generate(ids, mask, SamplingParams(0.0, 1.0, 5), seed=1)
    g2 = gen.generate(ids, mask, SamplingParams(0.0, 1.0, 5), seed=2)
    assert torch.equal(g1.completion_ids_BxC, g2.completion_ids_BxC)


def test_private_copy_stays_stale_until_synced(setup):
    cfg, tok, model, task = setup
    policy = build_tiny_model(cfg.model, tok, seed=1)
    gen = HFGenerator(policy, tok.pad_token_id, tok.eos_token_id, share_weights=False)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.5)
    assert not torch.equal(next(gen.model.parameters()), next(policy.parameters()))
    gen.sync_weights(policy, version=3)
    assert torch.equal(next(gen.model.parameters()), next(policy.parameters()))
    assert gen.version == 3
