"""One policy update on a batch of rollouts: forward, loss, backward, optimizer step.

The loss is chosen by ``algo.name``: ``grpo`` (``replay_exp.algo.grpo_loss``, clipped surrogate,
optional truncated IS) or ``asymre`` (``replay_exp.algo.asymre_loss``, no importance ratio).

Loss normalisation. ``algo.loss_agg`` reduces the per-token terms of the WHOLE batch of B
rollouts to one scalar (``replay_exp.algo.grpo``, item 6): ``token_mean`` divides the sum over
every valid completion token of the B rollouts by the number of those tokens (the ``tokens``
stat), so every token weighs the same, whatever the length of its rollout or of the others;
``seq_mean`` divides the sum of per-rollout token means by the number of rollouts with a valid
token; ``seq_sum_norm`` divides the token sum by ``B * norm_len``.

Micro-batching. With ``algo.micro_batch_size = m`` (None: the whole batch) the forward and
backward run on m rollouts at a time, contiguous rows of the batch in its order (rows of one
prompt group that land in the same micro-batch share one prompt forward), and the gradients
accumulate before ONE optimizer step. Each micro-batch's loss is divided by the normaliser of
the whole batch (``replay_exp.algo.agg_denominator``), not by its own, so the micro-batch
losses add up to the full-batch loss and the accumulated gradient is the full-batch gradient
up to float rounding: micro-batching changes peak memory (one micro-batch's activations and
[m, C, V] logits), never the update. The stats are computed once, after the last backward, from
the whole batch's log-probs, so they are the full-batch values too.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from replay_exp.algo import (
    ALGO_NAMES,
    agg_denominator,
    asymre_loss,
    grpo_loss,
    masked_mean,
)
from replay_exp.algo.diagnostics import update_diagnostics
from replay_exp.models.forward import micro_batch, policy_logprobs, row_chunks
from replay_exp.types import RolloutBatch

__all__ = ["batch_loss", "micro_batch", "policy_logprobs", "policy_update", "row_chunks"]


def policy_update(
    policy: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: RolloutBatch,
    algo: Any,
    temperature: float,
    norm_len: int,
    ref_model: torch.nn.Module | None = None,
    version: int | None = None,
) -> dict[str, float]:
    """Take one optimizer step on ``batch`` with the loss ``algo.name``; return its statistics.

    Forward and backward run ``algo.micro_batch_size`` rollouts at a time (absent or None: all
    of them), with the gradient of the full batch (module docstring).

    ``version``: the policy version being updated (the step). When given, one more no-grad
    forward after the optimizer step measures the update (``replay_exp.algo.diagnostics``):
    its statistics are added as ``diag/<name>``, with ``diag/seconds`` (the time they took, so
    the caller can leave it out of the training time). They read the model, never change it.

    Every loss reports ``loss``, ``pg_loss``, ``grad_norm``, ``entropy``, ``batch_size``,
    ``tokens`` and the staleness stats ``ratio_mean`` / ``ratio_min`` / ``ratio_max`` /
    ``approx_kl`` (detached for AsymRE, which has no ratio in its loss), plus its own: GRPO the
    ``clip_frac*`` (and ``tis_*`` when ``algo.tis_cap`` is set), AsymRE ``coef_mean`` /
    ``coef_pos_frac``; ``kl_ref`` when ``algo.kl_coef > 0``.
    """
    # ``algo`` was validated once, by resolve(); only what the caller must pass is checked here.
    if algo.kl_coef > 0 and ref_model is None:
        raise ValueError(f"algo.kl_coef={algo.kl_coef} > 0 needs a reference model")
    policy.train()
    device = next(policy.parameters()).device
    B, C = batch.completion_ids_BxC.shape
    mask_BxC = batch.completion_mask_BxC.to(device)
    denom = agg_denominator(mask_BxC, algo.loss_agg, norm_len)  # of the WHOLE batch
    # Detached per-token values of every row, filled micro-batch by micro-batch, for the stats.
    logp_BxC = torch.zeros(B, C, device=device)
    entropy_BxC = torch.zeros(B, C, device=device)
    ref_logp_BxC = torch.zeros(B, C, device=device) if algo.kl_coef > 0 else None

    optimizer.zero_grad(set_to_none=True)
    micro_size = getattr(algo, "micro_batch_size", None)
    chunks = row_chunks(B, micro_size)
    for rows in chunks:
        micro = batch if len(chunks) == 1 else micro_batch(batch, rows)
        logp_mxc, entropy_mxc = policy_logprobs(policy, micro, temperature)
        ref_mxc = None
        if ref_logp_BxC is not None:
            with torch.no_grad():
                ref_mxc, _ = policy_logprobs(ref_model, micro, temperature)
            ref_logp_BxC[rows, : ref_mxc.shape[1]] = ref_mxc
        loss, stats = batch_loss(algo, micro, logp_mxc, ref_mxc, norm_len, denom)
        loss.backward()
        logp_BxC[rows, : logp_mxc.shape[1]] = logp_mxc.detach()
        entropy_BxC[rows, : entropy_mxc.shape[1]] = entropy_mxc
    max_norm = algo.grad_clip if algo.grad_clip is not None else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), max_norm)
    optimizer.step()

    if len(chunks) > 1:  # one micro-batch's stats are partial: recompute on the whole batch
        with torch.no_grad():
            loss, stats = batch_loss(algo, batch, logp_BxC, ref_logp_BxC, norm_len, denom)
    stats["loss"] = float(loss.detach())
    stats["grad_norm"] = float(grad_norm)
    stats["entropy"] = float(masked_mean(entropy_BxC, mask_BxC))
    stats["batch_size"] = len(batch)
    stats["tokens"] = int(mask_BxC.sum())
    if version is not None:
        t0 = time.perf_counter()
        with torch.no_grad():
            after_BxC, _ = policy_logprobs(policy, batch, temperature, micro_size)
        diag = update_diagnostics(
            logp_BxC, after_BxC, batch.behaviour_logp_BxC.to(device), mask_BxC,
            batch.advantage_B, version - batch.version_B, algo.eps_low, algo.eps_high,
        )  # fmt: skip
        stats.update({f"diag/{k}": v for k, v in diag.items()})
        stats["diag/seconds"] = time.perf_counter() - t0
    return stats


def batch_loss(
    algo: Any,
    batch: RolloutBatch,
    logp_BxC: torch.Tensor,
    ref_logp_BxC: torch.Tensor | None,
    norm_len: int,
    denom: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss ``algo.name`` of ``batch`` (all rows or one micro-batch) given its log-probs,
    normalised by ``denom``."""
    device = logp_BxC.device
    mask_BxC = batch.completion_mask_BxC.to(device)
    behaviour_BxC = batch.behaviour_logp_BxC.to(device)
    if algo.name not in ALGO_NAMES:  # a programming error (resolve() rejects unknown names)
        raise KeyError(f"algo.name={algo.name}: no such loss; the losses: {list(ALGO_NAMES)}")
    if algo.name == "asymre":
        # V_hat (group-mean reward at generation time) = r - A for unnormalised advantages.
        reward_B = batch.reward_B.to(device)
        return asymre_loss(
            logp_BxC,
            reward_B,
            reward_B - batch.advantage_B.to(device),
            mask_BxC,
            dv=algo.asymre_dv,
            agg=algo.loss_agg,
            norm_len=norm_len,
            kl_coef=algo.kl_coef,
            ref_logp_BxC=ref_logp_BxC,
            behaviour_logp_BxC=behaviour_BxC,
            denom=denom,
        )
    return grpo_loss(
        logp_BxC,
        behaviour_BxC,
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
        denom=denom,
    )
