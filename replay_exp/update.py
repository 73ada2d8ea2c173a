"""One policy update on a batch of rollouts: forward, loss, backward, optimizer step.

The loss is the one registered under ``algo.name`` (``replay_exp.algo.registry``, ``LOSSES``:
grpo, cispo, gspo, m2po, topr, sapo, gmpo, dppo, asymre; each module of ``replay_exp.algo``
registers its own),
called with its typed knobs: ``loss_knobs`` turns the ``algo`` node into the loss's schema
instance, and a key the schema lacks or does not have is an error, never a silent default.
What is not the loss's own is done here, the same way for every loss: the aggregation and
micro-batching (below), the KL reference forward (``algo.kl_coef``), the stale-data masks
(``algo.mask`` where the loss's schema is a ``MaskedAlgoConfig``: all but m2po, topr, asymre;
``replay_exp.algo.masks``) and a loss's own whole-batch mask (M2PO's budget, its
``batch_keep``), decoupled PPO's proximal log-probs (``algo.proximal``, ``GrpoConfig``), the
gradient clip and the diagnostics. docs/corrections.md has the rules and their sources.

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
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from replay_exp.algo import (
    LossInputs,
    agg_denominator,
    correction_keep,
    get_loss,
    loglinear_proximal,
    loss_knobs,
    masked_mean,
)
from replay_exp.algo.diagnostics import ess_fraction, update_diagnostics
from replay_exp.algo.registry import LossSpec
from replay_exp.config.schemas import AlgoConfig, GrpoConfig, MaskedAlgoConfig
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
    signals: bool = False,
) -> dict[str, float]:
    """Take one optimizer step on ``batch`` with the loss ``algo.name``; return its statistics.

    ``algo``: the algo config node (or its schema instance), exactly its loss's schema keys.
    Forward and backward run ``algo.micro_batch_size`` rollouts at a time (None: all of them),
    with the gradient of the full batch (module docstring).

    ``version``: the policy version being updated (the step); needed by
    ``algo.proximal=loglinear`` (a rollout's lag) and by the diagnostics. ``diagnostics``:
    one more no-grad forward after the optimizer step measures the update
    (``replay_exp.algo.diagnostics``): its statistics are added as ``diag/<name>``, with
    ``diag/seconds`` (the time they took, so the caller can leave it out of the training time).
    They read the model, never change it. ``gap_known``: whether the batch's stored engine
    gaps were measured (False: the split into mismatch and staleness is logged as NaN).
    ``signals``: what a replay controller reads, at no extra forward (:func:`_signals`).

    Whole-batch passes (:func:`_whole_batch_pass`, training time) are counted in
    ``stats["extra_forwards"]`` for the ledger's FLOPs.

    Every loss reports ``loss``, ``pg_loss``, ``grad_norm``, ``entropy``, ``batch_size``,
    ``tokens`` and the staleness stats ``ratio_mean`` / ``ratio_min`` / ``ratio_max`` /
    ``approx_kl`` (detached where the loss has no ratio), plus its own (the loss functions'
    docstrings); ``masked_frac`` / ``masked_seq_frac`` (valid tokens, and rows with a valid
    token, that ``algo.mask`` or the loss's own whole-batch mask dropped) when one is active;
    ``kl_ref`` when ``algo.kl_coef > 0``.
    """
    knobs = loss_knobs(algo)  # the loss's schema instance: exactly its keys, or an error
    spec = get_loss(knobs.name)
    # ``algo`` was validated once, by resolve(); only what the caller must pass is checked here.
    if knobs.kl_coef > 0 and ref_model is None:
        raise ValueError(f"algo.kl_coef={knobs.kl_coef} > 0 needs a reference model")
    if (_proximal(knobs) == "loglinear" or diagnostics) and version is None:
        raise ValueError("algo.proximal=loglinear and the diagnostics need the policy version")
    policy.train()
    rows = _Rows.empty(batch, knobs, spec, next(policy.parameters()).device, version)
    denom = agg_denominator(rows.mask_BxC, knobs.loss_agg, norm_len)  # of the WHOLE batch
    chunks = row_chunks(rows.mask_BxC.shape[0], knobs.micro_batch_size)
    extra_forwards = _whole_batch_pass(policy, batch, knobs, spec, rows, temperature, chunks)

    optimizer.zero_grad(set_to_none=True)
    for sl in chunks:
        micro = batch if len(chunks) == 1 else micro_batch(batch, sl)
        logp_mxc, entropy_mxc = policy_logprobs(policy, micro, temperature)
        w = logp_mxc.shape[1]
        ref_mxc = _reference_logp(ref_model, micro, temperature, rows, sl, w)
        _fill_corrections(knobs, spec, rows, sl, logp_mxc, batch.advantage_B, len(chunks) == 1)
        prox, keep = rows.of(rows.prox_BxC, sl, w), rows.of(rows.keep_BxC, sl, w)
        loss, stats = batch_loss(knobs, micro, logp_mxc, ref_mxc, norm_len, denom, prox, keep)
        loss.backward()
        rows.logp_BxC[sl, :w] = logp_mxc.detach()
        rows.entropy_BxC[sl, :w] = entropy_mxc
    max_norm = knobs.grad_clip if knobs.grad_clip is not None else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), max_norm)
    optimizer.step()

    if len(chunks) > 1:  # one micro-batch's stats are partial: recompute on the whole batch
        with torch.no_grad():
            loss, stats = batch_loss(knobs, batch, rows.logp_BxC, rows.ref_logp_BxC, norm_len,
                                     denom, rows.prox_BxC, rows.keep_BxC)  # fmt: skip
    stats.update(loss=float(loss.detach()), grad_norm=float(grad_norm))
    stats["entropy"] = float(masked_mean(rows.entropy_BxC, rows.mask_BxC))
    stats.update(batch_size=len(batch), tokens=int(rows.mask_BxC.sum()))
    stats["extra_forwards"] = extra_forwards
    stats.update(rows.masked_stats())
    stats.update(_signals(rows, version) if signals else {})
    if diagnostics:
        stats.update(_diagnostics(policy, batch, knobs, rows, temperature, gap_known))
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
    normalised by ``denom``: the registered loss called with :class:`LossInputs` and its typed
    knobs. ``prox_logp_BxC``: decoupled PPO's proximal log-probs (``algo.proximal``);
    ``keep_BxC``: the tokens a mask keeps. ``algo.mask``'s dropped tokens leave the loss as
    padding would (``replay_exp.algo.masks``; the normaliser stays); a loss with its own
    whole-batch mask (``batch_keep``, M2PO) gets it as ``keep_BxC`` instead."""
    knobs = loss_knobs(algo)
    spec = get_loss(knobs.name)
    device = logp_BxC.device
    mask_BxC = batch.completion_mask_BxC.to(device)
    if keep_BxC is not None and spec.batch_keep is None:  # algo.mask: masked tokens leave
        mask_BxC = mask_BxC & keep_BxC.to(device)
        keep_BxC = None
    inputs = LossInputs(
        logp_BxC=logp_BxC, behaviour_logp_BxC=batch.behaviour_logp_BxC.to(device),
        advantage_B=batch.advantage_B.to(device), reward_B=batch.reward_B.to(device),
        mask_BxC=mask_BxC, keep_BxC=keep_BxC, prox_logp_BxC=prox_logp_BxC,
        agg=knobs.loss_agg, norm_len=norm_len, kl_coef=knobs.kl_coef,
        ref_logp_BxC=ref_logp_BxC, denom=denom,
    )  # fmt: skip
    return spec.loss(inputs, knobs)


def _mask_kind(knobs: AlgoConfig) -> str:
    """``algo.mask`` where the loss takes a stale-data mask (its schema is a
    ``MaskedAlgoConfig``), else ``none``."""
    return knobs.mask if isinstance(knobs, MaskedAlgoConfig) else "none"


def _proximal(knobs: AlgoConfig) -> str:
    """``algo.proximal`` where the loss takes decoupled PPO (its schema is a ``GrpoConfig``),
    else ``none``."""
    return knobs.proximal if isinstance(knobs, GrpoConfig) else "none"


@dataclass
class _Rows:
    """The whole batch's per-token tensors (B x C, on the policy's device): the log-probs and
    entropies, filled micro-batch by micro-batch (detached, for the stats and diagnostics), and
    what the loss reads besides them: the reference log-probs, the kept tokens of a mask, the
    proximal log-probs (None where not needed)."""

    mask_BxC: Tensor
    behaviour_BxC: Tensor
    logp_BxC: Tensor
    entropy_BxC: Tensor
    ref_logp_BxC: Tensor | None
    keep_BxC: Tensor | None
    prox_BxC: Tensor | None
    lag_B: Tensor | None  # versions since each rollout was generated (None: no version given)

    @classmethod
    def empty(
        cls,
        batch: RolloutBatch,
        knobs: AlgoConfig,
        spec: LossSpec,
        device: Any,
        version: int | None,
    ) -> _Rows:
        B, C = batch.completion_ids_BxC.shape
        mask_BxC = batch.completion_mask_BxC.to(device)
        masked = _mask_kind(knobs) != "none" or spec.batch_keep is not None
        return cls(
            mask_BxC=mask_BxC,
            behaviour_BxC=batch.behaviour_logp_BxC.to(device),
            logp_BxC=torch.zeros(B, C, device=device),
            entropy_BxC=torch.zeros(B, C, device=device),
            ref_logp_BxC=torch.zeros(B, C, device=device) if knobs.kl_coef > 0 else None,
            keep_BxC=mask_BxC.clone() if masked else None,
            prox_BxC=torch.zeros(B, C, device=device) if _proximal(knobs) != "none" else None,
            lag_B=None if version is None else (version - batch.version_B).to(device),
        )

    @staticmethod
    def of(x_BxC: Tensor | None, sl: slice, w: int) -> Tensor | None:
        """Rows ``sl`` (first ``w`` columns) of ``x_BxC``; None stays None."""
        return None if x_BxC is None else x_BxC[sl, :w]

    def masked_stats(self) -> dict[str, float]:
        """``masked_frac`` / ``masked_seq_frac``: the valid tokens, and the rows with a valid
        token, that a mask dropped (none without a mask)."""
        if self.keep_BxC is None:
            return {}
        dropped_BxC = self.mask_BxC & ~self.keep_BxC
        rows_B = self.mask_BxC.any(dim=1)
        return {
            "masked_frac": float(masked_mean(dropped_BxC.float(), self.mask_BxC)),
            "masked_seq_frac": float(masked_mean(dropped_BxC.any(dim=1).float(), rows_B)),
        }


def _whole_batch_pass(
    policy: torch.nn.Module,
    batch: RolloutBatch,
    knobs: AlgoConfig,
    spec: LossSpec,
    rows: _Rows,
    temperature: float,
    chunks: list,
) -> int:
    """The no-grad forward of the whole batch (in the micro-batches' chunks, so its values are
    the ones the loss sees) that two options need before the first backward:
    ``algo.proximal=recompute`` (log pi_prox, the weights before this update) and a loss's own
    whole-batch mask when micro-batched (M2PO's budget; in one chunk the mask comes from the
    loss's forward itself, at no cost: :func:`_fill_corrections`). Returns the forwards run."""
    recompute = _proximal(knobs) == "recompute"
    if not (recompute or (spec.batch_keep is not None and len(chunks) > 1)):
        return 0
    with torch.no_grad():
        pre_BxC, _ = policy_logprobs(policy, batch, temperature, knobs.micro_batch_size)
    if recompute:
        rows.prox_BxC = pre_BxC.float().masked_fill(~rows.mask_BxC, 0.0)
    if spec.batch_keep is not None:
        rows.keep_BxC = spec.batch_keep(pre_BxC - rows.behaviour_BxC, rows.mask_BxC, knobs)
    return 1


def _reference_logp(
    ref_model: torch.nn.Module | None,
    micro: RolloutBatch,
    temperature: float,
    rows: _Rows,
    sl: slice,
    w: int,
) -> Tensor | None:
    """The reference policy's log-probs of the micro-batch ``micro`` (rows ``sl``) when
    ``algo.kl_coef > 0`` (kept in ``rows`` for the whole-batch stats), else None."""
    if rows.ref_logp_BxC is None:
        return None
    with torch.no_grad():
        ref_mxc, _ = policy_logprobs(ref_model, micro, temperature)
    rows.ref_logp_BxC[sl, :w] = ref_mxc
    return ref_mxc


def _fill_corrections(
    knobs: AlgoConfig,
    spec: LossSpec,
    rows: _Rows,
    sl: slice,
    logp_mxc: Tensor,
    advantage_B: Tensor,
    one_chunk: bool,
) -> None:
    """From the micro-batch's log-probs, the rows ``sl`` of what the loss reads besides them:
    ``algo.proximal=loglinear``'s proximal log-probs, ``algo.mask``'s kept tokens, and (the
    batch in one chunk) the loss's own whole-batch mask."""
    w = logp_mxc.shape[1]
    mask_mxc, behaviour_mxc = rows.mask_BxC[sl, :w], rows.behaviour_BxC[sl, :w]
    if _proximal(knobs) == "loglinear":
        rows.prox_BxC[sl, :w] = loglinear_proximal(
            logp_mxc, behaviour_mxc, rows.lag_B[sl]
        ).masked_fill(~mask_mxc, 0.0)
    kind = _mask_kind(knobs)
    if kind != "none":
        rows.keep_BxC[sl, :w] = correction_keep(
            logp_mxc, behaviour_mxc, advantage_B[sl], mask_mxc, kind, low=knobs.mask_low,
            high=knobs.mask_high, geo_delta=knobs.mask_geo_delta, opsm_delta=knobs.mask_opsm_delta,
        )  # fmt: skip
    elif spec.batch_keep is not None and one_chunk:
        rows.keep_BxC = spec.batch_keep(logp_mxc - rows.behaviour_BxC, rows.mask_BxC, knobs)


def _signals(rows: _Rows, version: int | None) -> dict[str, Any]:
    """What a replay controller reads (``replay_exp.control``), from the log-probs the loss
    already computed: ``ess_frac`` (the batch's sequence-level effective sample size,
    ``algo.diagnostics.ess_fraction``) and ``control_rows`` (numpy: each row's lag and
    sequence log-weight log w_i = sum_t (log pi_before - log pi_behaviour); the caller pops
    it before logging)."""
    if version is None:
        raise ValueError("the controller's signals need the policy version")
    mask = rows.mask_BxC.bool()
    log_w = torch.where(mask, rows.logp_BxC - rows.behaviour_BxC.float(), 0.0).sum(dim=1)
    has = mask.any(dim=1)
    return {
        "ess_frac": ess_fraction(log_w[has]),
        "control_rows": {
            "lag": rows.lag_B[has].cpu().numpy(),
            "logw": log_w[has].double().cpu().numpy(),
        },
    }


def _diagnostics(
    policy: torch.nn.Module,
    batch: RolloutBatch,
    knobs: AlgoConfig,
    rows: _Rows,
    temperature: float,
    gap_known: bool,
) -> dict[str, float]:
    """``diag/<name>``: one no-grad forward after the optimizer step measures the update
    (``replay_exp.algo.diagnostics``); ``diag/seconds``: the time it took."""
    t0 = time.perf_counter()
    with torch.no_grad():
        after_BxC, _ = policy_logprobs(policy, batch, temperature, knobs.micro_batch_size)
    gap_BxC = batch.engine_gap_BxC.to(rows.mask_BxC.device) if gap_known else None
    diag = update_diagnostics(
        rows.logp_BxC, after_BxC, rows.behaviour_BxC, rows.mask_BxC, batch.advantage_B,
        rows.lag_B, knobs.eps_low, knobs.eps_high, keep_BxC=rows.keep_BxC, gap_BxC=gap_BxC,
    )  # fmt: skip
    out = {f"diag/{k}": v for k, v in diag.items()}
    out["diag/seconds"] = time.perf_counter() - t0
    return out
