"""From problems to scored, advantage-stamped rollouts (one call in the training loop)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from replay_exp.algo import group_advantages
from replay_exp.models.forward import policy_logprobs
from replay_exp.rollout.base import Generation, Generator, SamplingParams
from replay_exp.tasks import Problem, Task
from replay_exp.types import RolloutBatch


def chat_prompts(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[str]:
    """Each text as the user turn of the tokenizer's chat template, with the generation prompt
    (the assistant's turn opened)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"model.chat_template=true, but the tokenizer ({type(tokenizer).__name__}, "
            f"{tokenizer.name_or_path}) has no chat template; set model.chat_template=false"
        )
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True
        )
        for t in texts
    ]


def _encode(tokenizer: PreTrainedTokenizerBase, texts: list[str], chat: bool, **kwargs):
    # A chat template writes its own special tokens (BOS included, if any): add none twice.
    if chat:
        return tokenizer(chat_prompts(tokenizer, texts), add_special_tokens=False, **kwargs)
    return tokenizer(texts, **kwargs)


def tokenize_prompts(
    tokenizer: PreTrainedTokenizerBase, texts: list[str], chat: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and a bool mask: the tokenizer's special tokens (BOS, if it has
    one) around each text, or, with ``chat``, each text wrapped in the chat template."""
    enc = _encode(tokenizer, texts, chat, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"].bool()


def prompt_lengths(tokenizer: PreTrainedTokenizerBase, texts: list[str], chat: bool) -> list[int]:
    """Token count of each prompt exactly as :func:`tokenize_prompts` encodes it."""
    return [len(ids) for ids in _encode(tokenizer, texts, chat)["input_ids"]]


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
    advantage: Mapping[str, Any] | None = None,
    chat: bool = False,
) -> RolloutBatch:
    """G samples for each problem (rows grouped contiguously), rewards, and advantages
    computed now and frozen with the rollouts (``advantage``: the keyword arguments of
    :func:`~replay_exp.algo.group_advantages`, its defaults if None; ``chat``: prompts in the
    chat template)."""
    repeated = [p for p in problems for _ in range(group_size)]
    ids_BxP, mask_BxP = tokenize_prompts(tokenizer, [p.prompt for p in problems], chat)
    ids_BxP, mask_BxP = (t.repeat_interleave(group_size, dim=0) for t in (ids_BxP, mask_BxP))
    gen = generator.generate(ids_BxP, mask_BxP, params, seed)
    reward_B = score(tokenizer, task, repeated, gen)
    B = len(repeated)
    group_reward_B = reward_B.view(-1, group_size).mean(dim=1).repeat_interleave(group_size)
    return RolloutBatch(
        prompt_ids_BxP=ids_BxP,
        prompt_mask_BxP=mask_BxP,
        completion_ids_BxC=gen.completion_ids_BxC,
        completion_mask_BxC=gen.completion_mask_BxC,
        behaviour_logp_BxC=gen.behaviour_logp_BxC,
        reward_B=reward_B,
        advantage_B=group_advantages(reward_B, group_size, **(advantage or {})),
        version_B=torch.full((B,), gen.version, dtype=torch.long),
        created_step_B=torch.full((B,), step, dtype=torch.long),
        group_id_B=first_group + torch.arange(B) // group_size,
        uid_B=first_uid + torch.arange(B),
        group_reward_B=group_reward_B,
        engine_gap_BxC=torch.zeros(gen.behaviour_logp_BxC.shape),
    )


@torch.no_grad()
def trainer_logprobs(
    policy: torch.nn.Module,
    batch: RolloutBatch,
    temperature: float,
    micro_batch_size: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The trainer's log-probs of ``batch``'s completions (valid as the generating policy's when
    the trainer holds the generator's weights; 0 on padding), and how far the stored engine
    log-probs are from them: mean / max |difference| over valid tokens."""
    was_training = policy.training
    policy.eval()
    logp_BxC, _ = policy_logprobs(policy, batch, temperature, micro_batch_size=micro_batch_size)
    policy.train(was_training)
    mask_BxC = batch.completion_mask_BxC
    logp_BxC = logp_BxC.float().cpu().masked_fill(~mask_BxC, 0.0)
    diff = (logp_BxC - batch.behaviour_logp_BxC)[mask_BxC].abs()
    stats = {
        "behaviour_logp_absdiff_mean": float(diff.mean()) if diff.numel() else 0.0,
        "behaviour_logp_absdiff_max": float(diff.max()) if diff.numel() else 0.0,
    }
    return logp_BxC, stats


def with_trainer_logp(
    policy: torch.nn.Module,
    batch: RolloutBatch,
    temperature: float,
    source: str,
    micro_batch_size: int | None = None,
) -> tuple[RolloutBatch, dict[str, float]]:
    """The trainer's log-probs at the generating weights, used as ``source`` says:

    - ``"behaviour"`` (``generation.behaviour_logp=trainer``): they replace the engine's as the
      stored behaviour log-probs (the engine mismatch is then 0 by construction);
    - ``"gap"`` (``generation.store_trainer_logp=true``): the engine's stay the behaviour
      log-probs and ``engine_gap_BxC = trainer - engine`` is stored beside them, so the
      trainer can split its ratio into engine mismatch and staleness.
    """
    logp_BxC, stats = trainer_logprobs(policy, batch, temperature, micro_batch_size)
    if source == "behaviour":
        return dataclasses.replace(batch, behaviour_logp_BxC=logp_BxC), stats
    gap_BxC = (logp_BxC - batch.behaviour_logp_BxC).masked_fill(~batch.completion_mask_BxC, 0.0)
    return dataclasses.replace(batch, engine_gap_BxC=gap_BxC), stats
