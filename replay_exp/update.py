"""One policy update on a batch of rollouts: forward, loss, backward, optimizer step.

The loss is chosen by ``algo.name``: ``grpo`` (``replay_exp.algo.grpo_loss``, clipped surrogate,
optional truncated IS) or ``asymre`` (``replay_exp.algo.asymre_loss``, no importance ratio).
"""

from __future__ import annotations

from typing import Any

import torch

from replay_exp.algo import ALGO_NAMES, asymre_loss, grpo_loss, masked_mean, token_logprobs
from replay_exp.models.shared_prefix import completion_logits, positions, supports_prefix_sharing
from replay_exp.types import RolloutBatch


def policy_logprobs(
    model: torch.nn.Module, batch: RolloutBatch, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(completion token) and per-token entropy under ``model``, shapes [B, C].

    The sequence is [left-padded prompt | right-padded completion]; position ids count real
    tokens only, exactly as ``generate`` does with left padding. Rows that share a prompt share
    its forward (``replay_exp.models.shared_prefix``); other modules get one full forward."""
    device = next(model.parameters()).device
    p_ids, p_mask = batch.prompt_ids_BxP.to(device), batch.prompt_mask_BxP.to(device)
    c_ids, c_mask = batch.completion_ids_BxC.to(device), batch.completion_mask_BxC.to(device)
    if supports_prefix_sharing(model):
        logits_BxCxV = completion_logits(model, p_ids, p_mask, c_ids, c_mask).float()
    else:
        ids, mask = torch.cat([p_ids, c_ids], dim=1), torch.cat([p_mask, c_mask], dim=1)
        logits = model(input_ids=ids, attention_mask=mask.long(), position_ids=positions(mask))
        logits_BxCxV = logits.logits[:, p_ids.shape[1] - 1 : -1].float()
    return token_logprobs(logits_BxCxV, c_ids, temperature)


def policy_update(
    policy: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    algo: Any,
    temperature: float,
    norm_len: int,
    ref_model: torch.nn.Module | None = None,
) -> dict[str, float]:
    """Take one optimizer step on ``batch`` with the loss ``algo.name``; return its statistics.

    Every loss reports ``loss``, ``pg_loss``, ``grad_norm``, ``entropy``, ``batch_size``,
    ``tokens`` and the staleness stats ``ratio_mean`` / ``ratio_min`` / ``ratio_max`` /
    ``approx_kl`` (detached for AsymRE, which has no ratio in its loss), plus its own: GRPO the
    ``clip_frac*`` (and ``tis_*`` when ``algo.tis_cap`` is set), AsymRE ``coef_mean`` /
    ``coef_pos_frac``; ``kl_ref`` when ``algo.kl_coef > 0``.
    """
    if algo.name not in ALGO_NAMES:
        raise ValueError(f"algo.name={algo.name} is unknown; choose one of {list(ALGO_NAMES)}")
    policy.train()
    device = next(policy.parameters()).device
    mask_BxC = batch.completion_mask_BxC.to(device)
    logp_BxC, entropy_BxC = policy_logprobs(policy, batch, temperature)
    ref_logp_BxC = None
    if algo.kl_coef > 0:
        with torch.no_grad():
            ref_logp_BxC, _ = policy_logprobs(ref_model, batch, temperature)
    if algo.name == "asymre":
        if algo.adv_normalize_std:
            raise ValueError(
                "algo.name=asymre recovers V_hat = reward - advantage, which needs "
                "algo.adv_normalize_std=false"
            )
        # V_hat (group-mean reward at generation time) = r - A for unnormalised advantages.
        reward_B = batch.reward_B.to(device)
        loss, stats = asymre_loss(
            logp_BxC,
            reward_B,
            reward_B - batch.advantage_B.to(device),
            mask_BxC,
            dv=algo.asymre_dv,
            agg=algo.loss_agg,
            norm_len=norm_len,
            kl_coef=algo.kl_coef,
            ref_logp_BxC=ref_logp_BxC,
            behaviour_logp_BxC=batch.behaviour_logp_BxC.to(device),
        )
    else:
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
            tis_cap=algo.tis_cap,
            tis_level=algo.tis_level,
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
