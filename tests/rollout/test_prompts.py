"""Prompt encoding: chat template (no BOS twice), lengths as encoded, and the trainer's
recompute of behaviour log-probs (generation.behaviour_logp=trainer)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from replay_exp.models import build_char_tokenizer, build_tiny_model
from replay_exp.models.tiny import load_pretrained
from replay_exp.rollout import HFGenerator, SamplingParams
from replay_exp.rollout.collect import (
    generate_rollouts,
    prompt_lengths,
    tokenize_prompts,
    with_trainer_logp,
)
from replay_exp.tasks import Problem
from replay_exp.tasks.arithmetic import ArithmeticTask
from replay_exp.update import policy_logprobs


def test_chat_template_wraps_the_prompt(tiny_hub_dir):
    _, tok = load_pretrained(tiny_hub_dir)
    texts = ["What is 2+3?", "A longer question about 17 apples and 5 pears?"]
    ids, mask = tokenize_prompts(tok, texts, chat=True)
    first = tok.decode(ids[0][mask[0]])
    assert first == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    assert mask.sum(1).tolist() == prompt_lengths(tok, texts, chat=True)
    assert mask[0, 0].item() is False and mask[1].all()  # left padding
    plain, _ = tokenize_prompts(tok, texts[:1])
    assert tok.decode(plain[0]) == texts[0]


def test_a_template_that_writes_bos_gets_one_bos():
    tok = build_char_tokenizer()
    tok.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}=?{% endfor %}"
    ids, mask = tokenize_prompts(tok, ["1+2"], chat=True)
    assert ids[0].tolist().count(tok.bos_token_id) == 1 and ids[0, 0] == tok.bos_token_id
    assert tok.decode(ids[0], skip_special_tokens=True) == "1+2=?"
    plain, _ = tokenize_prompts(tok, ["1+2"])  # the tokenizer's own BOS without chat
    assert plain[0].tolist().count(tok.bos_token_id) == 1


def test_chat_without_a_template_is_a_clear_error():
    with pytest.raises(ValueError, match=r"model.chat_template=true, but the tokenizer"):
        tokenize_prompts(build_char_tokenizer(), ["1+2="], chat=True)


def test_trainer_recompute_replaces_and_measures_the_behaviour_logp():
    tok = build_char_tokenizer()
    mcfg = OmegaConf.create(
        dict(arch="llama", hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
             max_position_embeddings=32, tie_word_embeddings=True, dtype="float32")
    )  # fmt: skip
    policy = build_tiny_model(mcfg, tok, seed=0)
    task = ArithmeticTask(n_digits=1, n_eval=4, eval_fraction=0.2)
    gen = HFGenerator(policy, tok.pad_token_id, tok.eos_token_id)
    problems = [Problem("1+2=", "3"), Problem("4+4=", "8")]
    batch = generate_rollouts(
        gen, tok, task, problems, 4, SamplingParams(1.0, 1.0, 3), seed=0, step=0,
        first_uid=0, first_group=0,
    )  # fmt: skip
    new, stats = with_trainer_logp(policy, batch, 1.0, "behaviour", micro_batch_size=3)
    expected, _ = policy_logprobs(policy, batch)
    mask = batch.completion_mask_BxC
    assert torch.allclose(new.behaviour_logp_BxC[mask], expected[mask], atol=1e-6)
    assert (new.behaviour_logp_BxC[~mask] == 0).all()
    # The sampler's cached decode and the trainer's forward agree to float rounding.
    assert 0 <= stats["behaviour_logp_absdiff_mean"] <= stats["behaviour_logp_absdiff_max"] < 1e-4
    assert torch.equal(new.completion_ids_BxC, batch.completion_ids_BxC)
    assert torch.equal(new.engine_gap_BxC, batch.engine_gap_BxC)  # 0: nothing measured
    # store_trainer_logp: the engine's log-probs stay; the gap to the trainer's is stored.
    gapped, _ = with_trainer_logp(policy, batch, 1.0, "gap", micro_batch_size=3)
    assert torch.equal(gapped.behaviour_logp_BxC, batch.behaviour_logp_BxC)
    assert torch.allclose(
        gapped.engine_gap_BxC[mask], expected[mask] - batch.behaviour_logp_BxC[mask], atol=1e-6
    )
    assert (gapped.engine_gap_BxC[~mask] == 0).all()
    # The group's mean reward, the same for its G = 4 rows.
    for g in range(2):
        rows = slice(4 * g, 4 * g + 4)
        assert torch.allclose(batch.group_reward_B[rows], batch.reward_B[rows].mean().expand(4))
