"""One policy update on a batch of rollouts: forward, GRPO loss, backward, optimizer step."""

from __future__ import annotations

from typing import Any

import torch

from replay_exp.algo import grpo_loss, masked_mean, token_logprobs
from replay_exp.types import RolloutBatch


def policy_logprobs(
    model: torch.nn.Module, batch: RolloutBatch, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(completion token) and per-token entropy under ``model``, shapes [B, C].

    The sequence is [left-padded prompt | right-padded completion]; position ids count real
    tokens only, exactly as ``generate`` does with left padding."""
    device = next(model.parameters()).device
    ids = torch.cat([batch.prompt_ids_BxP, batch.completion_ids_BxC], dim=1).to(device)
    mask = torch.cat([batch.prompt_mask_BxP, batch.completion_mask_BxC], dim=1).to(device)
    pos = (mask.long().cumsum(dim=1) - 1).clamp(min=0)
    P = batch.prompt_ids_BxP.shape[1]
    logits = model(input_ids=ids, attention_mask=mask.long(), position_ids=pos).logits
    logits_BxCxV = logits[:, P - 1 : -1].float()
    return token_logprobs(logits_BxCxV, ids[:, P:], temperature)


def grpo_update(
    policy: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    algo: Any,
    temperature: float,
    norm_len: int,
    ref_model: torch.nn.Module | None = None,
) -> dict[str, float]:
    """Take one optimizer step on ``batch``; return the loss statistics."""
    policy.train()
    device = next(policy.parameters()).device
    mask_BxC = batch.completion_mask_BxC.to(device)
    logp_BxC, entropy_BxC = policy_logprobs(policy, batch, temperature)
    ref_logp_BxC = None
    if algo.kl_coef > 0:
        with torch.no_grad():
            ref_logp_BxC, _ = policy_logprobs(ref_model, batch, temperature)
    loss, stats = grpo_loss(
        logp_BxC,
        batch.behaviour_logp_BxC.to(device),
        batch.advantage_B.to(device),
        mask_BxC,
        eps_low=algo.eps_low,
        eps_high=algo.eps_high,
        agg=algo.loss_agg,
        norm_len=norm_len,
        kl_coef=algo.kl_coef,
        ref_logp_BxC=ref_logp_BxC,
    )
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    max_norm = algo.grad_clip if algo.grad_clip is not None else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), max_norm)
    optimizer.step()
    stats["loss"] = float(loss.detach())
    stats["grad_norm"] = float(grad_norm)
    stats["entropy"] = float(masked_mean(entropy_BxC.detach(), mask_BxC))
    stats["batch_size"] = len(batch)
    stats["tokens"] = int(mask_BxC.sum())
    return stats
