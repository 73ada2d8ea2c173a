"""From problems to scored, advantage-stamped rollouts (one call in the training loop)."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from replay_exp.algo import group_advantages
from replay_exp.rollout.base import Generation, Generator, SamplingParams
from replay_exp.tasks import Problem, Task
from replay_exp.types import RolloutBatch


def tokenize_prompts(
    tokenizer: PreTrainedTokenizerBase, texts: list[str]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids (with BOS) and a bool mask."""
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"].bool()


def decode_completions(tokenizer: PreTrainedTokenizerBase, gen: Generation) -> list[str]:
    """Completion text before EOS (special tokens, pad and EOS, removed)."""
    return tokenizer.batch_decode(gen.completion_ids_BxC, skip_special_tokens=True)


def score(
    tokenizer: PreTrainedTokenizerBase, task: Task, problems: list[Problem], gen: Generation
) -> torch.Tensor:
    texts = decode_completions(tokenizer, gen)
    rewards = [
        task.reward(p, t, bool(f)) for p, t, f in zip(problems, texts, gen.finished_B, strict=True)
    ]
    return torch.tensor(rewards, dtype=torch.float32)


def generate_rollouts(
    generator: Generator,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    problems: list[Problem],
    group_size: int,
    params: SamplingParams,
    seed: int,
    step: int,
    first_uid: int,
    first_group: int,
    normalize_std: bool = True,
) -> RolloutBatch:
    """G samples for each problem (rows grouped contiguously), rewards, and advantages
    computed now and frozen with the rollouts."""
    repeated = [p for p in problems for _ in range(group_size)]
    ids_BxP, mask_BxP = tokenize_prompts(tokenizer, [p.prompt for p in problems])
    ids_BxP, mask_BxP = (t.repeat_interleave(group_size, dim=0) for t in (ids_BxP, mask_BxP))
    gen = generator.generate(ids_BxP, mask_BxP, params, seed)
    reward_B = score(tokenizer, task, repeated, gen)
    B = len(repeated)
    return RolloutBatch(
        prompt_ids_BxP=ids_BxP,
        prompt_mask_BxP=mask_BxP,
        completion_ids_BxC=gen.completion_ids_BxC,
        completion_mask_BxC=gen.completion_mask_BxC,
        behaviour_logp_BxC=gen.behaviour_logp_BxC,
        reward_B=reward_B,
        advantage_B=group_advantages(reward_B, group_size, normalize_std=normalize_std),
        version_B=torch.full((B,), gen.version, dtype=torch.long),
        created_step_B=torch.full((B,), step, dtype=torch.long),
        group_id_B=first_group + torch.arange(B) // group_size,
        uid_B=first_uid + torch.arange(B),
    )
