"""One policy update on a batch of rollouts: forward, loss, backward, optimizer step.

The loss is chosen by ``algo.name``: ``grpo`` (``replay_exp.algo.grpo_loss``, clipped surrogate,
optional truncated IS, optional decoupled PPO via ``algo.proximal``), ``cispo`` / ``gspo`` /
``m2po`` / ``topr`` (``replay_exp.algo.corrections``) or ``asymre``
(``replay_exp.algo.asymre_loss``, no importance ratio); ``algo.mask`` (grpo, cispo, gspo)
restricts any of the first three to the tokens a stale-data mask keeps
(``replay_exp.algo.masks``). docs/corrections.md has the rules and their sources.

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
    cispo_loss,
    correction_keep,
    grpo_loss,
    gspo_loss,
    loglinear_proximal,
    m2po_keep,
    m2po_loss,
    masked_mean,
    topr_loss,
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
    diagnostics: bool = False,
    gap_known: bool = True,
) -> dict[str, float]:
    """Take one optimizer step on ``batch`` with the loss ``algo.name``; return its statistics.

    Forward and backward run ``algo.micro_batch_size`` rollouts at a time (absent or None: all
    of them), with the gradient of the full batch (module docstring).

    ``version``: the policy version being updated (the step); needed by
    ``algo.proximal=loglinear`` (a rollout's lag) and by the diagnostics. ``diagnostics``:
    one more no-grad forward after the optimizer step measures the update
    (``replay_exp.algo.diagnostics``): its statistics are added as ``diag/<name>``, with
    ``diag/seconds`` (the time they took, so the caller can leave it out of the training time).
    They read the model, never change it. ``gap_known``: whether the batch's stored engine
    gaps were measured (False: the split into mismatch and staleness is logged as NaN).

    Whole-batch passes. Two options need the whole batch before the first backward, and get
    one no-grad forward of it (in the micro-batches' chunks, so its values are the ones the
    loss sees): ``algo.proximal=recompute`` (log pi_prox, the weights before this update) and
    ``algo=m2po`` when micro-batched (its token mask is a budget over the whole batch; in one
    chunk the mask comes from the forward itself, at no cost). The time is training time.
    ``stats["extra_forwards"]`` counts them for the ledger's FLOPs.

    Every loss reports ``loss``, ``pg_loss``, ``grad_norm``, ``entropy``, ``batch_size``,
    ``tokens`` and the staleness stats ``ratio_mean`` / ``ratio_min`` / ``ratio_max`` /
    ``approx_kl`` (detached where the loss has no ratio), plus its own (the loss functions'
    docstrings); ``masked_frac`` / ``masked_seq_frac`` (valid tokens, and rows with a valid
    token, that ``algo.mask`` or M2PO's budget dropped) when one is active; ``kl_ref`` when
    ``algo.kl_coef > 0``.
    """
    # ``algo`` was validated once, by resolve(); only what the caller must pass is checked here.
    if algo.kl_coef > 0 and ref_model is None:
        raise ValueError(f"algo.kl_coef={algo.kl_coef} > 0 needs a reference model")
    proximal = getattr(algo, "proximal", "none")
    mask_kind = getattr(algo, "mask", "none")
    if (proximal == "loglinear" or diagnostics) and version is None:
        raise ValueError("algo.proximal=loglinear and the diagnostics need the policy version")
    policy.train()
    device = next(policy.parameters()).device
    B, C = batch.completion_ids_BxC.shape
    mask_BxC = batch.completion_mask_BxC.to(device)
    behaviour_BxC = batch.behaviour_logp_BxC.to(device)
    denom = agg_denominator(mask_BxC, algo.loss_agg, norm_len)  # of the WHOLE batch
    # Detached per-token values of every row, filled micro-batch by micro-batch, for the stats.
    logp_BxC = torch.zeros(B, C, device=device)
    entropy_BxC = torch.zeros(B, C, device=device)
    ref_logp_BxC = torch.zeros(B, C, device=device) if algo.kl_coef > 0 else None
    masked = mask_kind != "none" or algo.name == "m2po"
    keep_BxC = mask_BxC.clone() if masked else None
    prox_BxC = torch.zeros(B, C, device=device) if proximal != "none" else None
    lag_B = None if version is None else (version - batch.version_B).to(device)

    micro_size = getattr(algo, "micro_batch_size", None)
    chunks = row_chunks(B, micro_size)
    extra_forwards = 0
    if proximal == "recompute" or (algo.name == "m2po" and len(chunks) > 1):
        with torch.no_grad():
            pre_BxC, _ = policy_logprobs(policy, batch, temperature, micro_size)
        extra_forwards = 1
        if proximal == "recompute":
            prox_BxC = pre_BxC.float().masked_fill(~mask_BxC, 0.0)
        if algo.name == "m2po":
            keep_BxC = m2po_keep(pre_BxC - behaviour_BxC, mask_BxC, algo.m2_threshold)

    optimizer.zero_grad(set_to_none=True)
    for rows in chunks:
        micro = batch if len(chunks) == 1 else micro_batch(batch, rows)
        logp_mxc, entropy_mxc = policy_logprobs(policy, micro, temperature)
        w = logp_mxc.shape[1]
        ref_mxc = None
        if ref_logp_BxC is not None:
            with torch.no_grad():
                ref_mxc, _ = policy_logprobs(ref_model, micro, temperature)
            ref_logp_BxC[rows, :w] = ref_mxc
        if proximal == "loglinear":
            prox_BxC[rows, :w] = loglinear_proximal(
                logp_mxc, behaviour_BxC[rows, :w], lag_B[rows]
            ).masked_fill(~mask_BxC[rows, :w], 0.0)
        if mask_kind != "none":
            keep_BxC[rows, :w] = correction_keep(
                logp_mxc, behaviour_BxC[rows, :w], batch.advantage_B[rows], mask_BxC[rows, :w],
                mask_kind, low=algo.mask_low, high=algo.mask_high,
                geo_delta=algo.mask_geo_delta, opsm_delta=algo.mask_opsm_delta,
            )  # fmt: skip
        elif algo.name == "m2po" and len(chunks) == 1:
            keep_BxC = m2po_keep(logp_mxc - behaviour_BxC, mask_BxC, algo.m2_threshold)
        keep = None if keep_BxC is None else keep_BxC[rows, :w]
        prox = None if prox_BxC is None else prox_BxC[rows, :w]
        loss, stats = batch_loss(algo, micro, logp_mxc, ref_mxc, norm_len, denom, prox, keep)
        loss.backward()
        logp_BxC[rows, :w] = logp_mxc.detach()
        entropy_BxC[rows, :w] = entropy_mxc
    max_norm = algo.grad_clip if algo.grad_clip is not None else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), max_norm)
    optimizer.step()

    if len(chunks) > 1:  # one micro-batch's stats are partial: recompute on the whole batch
        with torch.no_grad():
            loss, stats = batch_loss(
                algo, batch, logp_BxC, ref_logp_BxC, norm_len, denom, prox_BxC, keep_BxC
            )
    stats["loss"] = float(loss.detach())
    stats["grad_norm"] = float(grad_norm)
    stats["entropy"] = float(masked_mean(entropy_BxC, mask_BxC))
    stats["batch_size"] = len(batch)
    stats["tokens"] = int(mask_BxC.sum())
    stats["extra_forwards"] = extra_forwards
    if keep_BxC is not None:
        dropped_BxC = mask_BxC & ~keep_BxC
        rows_B = mask_BxC.any(dim=1)
        stats["masked_frac"] = float(masked_mean(dropped_BxC.float(), mask_BxC))
        stats["masked_seq_frac"] = float(masked_mean(dropped_BxC.any(dim=1).float(), rows_B))
    if diagnostics:
        t0 = time.perf_counter()
        with torch.no_grad():
            after_BxC, _ = policy_logprobs(policy, batch, temperature, micro_size)
        gap_BxC = batch.engine_gap_BxC.to(device) if gap_known else None
        diag = update_diagnostics(
            logp_BxC, after_BxC, behaviour_BxC, mask_BxC, batch.advantage_B, lag_B,
            algo.eps_low, algo.eps_high, keep_BxC=keep_BxC, gap_BxC=gap_BxC,
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
    prox_logp_BxC: torch.Tensor | None = None,
    keep_BxC: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss ``algo.name`` of ``batch`` (all rows or one micro-batch) given its log-probs,
    normalised by ``denom``. ``prox_logp_BxC``: decoupled PPO's proximal log-probs (grpo);
    ``keep_BxC``: the tokens the mask keeps (``algo.mask``, or M2PO's budget), the rest leave
    the loss as padding would (``replay_exp.algo.masks``)."""
    device = logp_BxC.device
    mask_BxC = batch.completion_mask_BxC.to(device)
    behaviour_BxC = batch.behaviour_logp_BxC.to(device)
    if algo.name not in ALGO_NAMES:  # a programming error (resolve() rejects unknown names)
        raise KeyError(f"algo.name={algo.name}: no such loss; the losses: {list(ALGO_NAMES)}")
    common = dict(
        agg=algo.loss_agg, norm_len=norm_len, kl_coef=algo.kl_coef, ref_logp_BxC=ref_logp_BxC,
        denom=denom,
    )  # fmt: skip
    if algo.name == "asymre":
        # V_hat (group-mean reward at generation time) = r - A for unnormalised advantages.
        reward_B = batch.reward_B.to(device)
        return asymre_loss(
            logp_BxC, reward_B, reward_B - batch.advantage_B.to(device), mask_BxC,
            dv=algo.asymre_dv, behaviour_logp_BxC=behaviour_BxC, **common,
        )  # fmt: skip
    if algo.name == "topr":
        return topr_loss(
            logp_BxC, behaviour_BxC, batch.reward_B.to(device), mask_BxC,
            baseline=algo.topr_baseline, **common,
        )  # fmt: skip
    advantage_B = batch.advantage_B.to(device)
    if algo.name == "m2po":
        return m2po_loss(
            logp_BxC, behaviour_BxC, advantage_B, mask_BxC, threshold=algo.m2_threshold,
            keep_BxC=keep_BxC, **common,
        )  # fmt: skip
    if keep_BxC is not None:  # algo.mask: masked tokens leave the loss, denom stays
        mask_BxC = mask_BxC & keep_BxC.to(device)
    clip = dict(eps_low=algo.eps_low, eps_high=algo.eps_high)
    if algo.name == "cispo":
        return cispo_loss(logp_BxC, behaviour_BxC, advantage_B, mask_BxC, **clip, **common)
    if algo.name == "gspo":
        return gspo_loss(logp_BxC, behaviour_BxC, advantage_B, mask_BxC, **clip, **common)
    return grpo_loss(
        logp_BxC, behaviour_BxC, advantage_B, mask_BxC, **clip, tis_cap=algo.tis_cap,
        tis_level=algo.tis_level, prox_logp_BxC=prox_logp_BxC, **common,
    )  # fmt: skip
