"""Which tokens of a batch a loss may learn from: the stale-data masks peers ship.

A mask is orthogonal to the loss: it returns a detached bool ``keep_BxC`` and the loss is then
called with ``mask_BxC & keep_BxC`` and the WHOLE batch's normaliser ``denom`` (computed from the
unmasked ``mask_BxC``). A masked token is therefore removed from the loss as if it were padding
(its KL penalty term too), and still counts in the normaliser: under ``token_mean`` (and
``seq_sum_norm``) it is a zero term, so masking lowers the weight of the batch and never
re-weights the tokens that remain. Under ``seq_mean`` a partly masked row is averaged over its
kept tokens (each weighs 1 / (kept * rows) instead of 1 / (n_i * rows)); a fully masked row is
a zero that still counts among the rows. Because ``denom`` is fixed, a micro-batch of rows gets
exactly its share of the masked batch loss.

Notation: ``log r_t = log pi_theta(y_t) - log mu(y_t)`` per valid token (``mu``: the behaviour
policy whose log-probs are stored with the rollout), ``n_i`` the number of valid tokens of row
i, ``L_i = sum_t log r_t`` (the log of the sequence ratio W_i) and ``A_i`` the row's advantage.

``kind`` (``algo.mask``):

- ``none``: keep every valid token.
- ``icepop``: token-level MIS (IcePop, verl ``rollout_correction``, OpenRLHF ``icepop``): keep a
  token iff ``low <= r_t <= high`` (``algo.mask_low`` / ``mask_high``, default 0.5 / 5).
- ``seq_mis``: sequence-level MIS (OpenRLHF ``seq-mask-tis``, TRL ``sequence_mask``): keep a
  whole row iff ``low <= W_i <= high``, compared in log space: ``log low <= L_i <= log high``.
- ``geometric``: keep a row iff its geometric-mean ratio ``exp(L_i / n_i)`` is in
  ``[1 - d, 1 + d]`` (``algo.mask_geo_delta``; verl ``rollout_correction``, geometric mode).
- ``opsm``: off-policy sequence masking (DeepSeek-V3.2; slime ``--use-opsm``): drop a row iff
  ``A_i < 0`` and ``-L_i / n_i = mean_t log(mu / pi_theta) > delta`` (``algo.mask_opsm_delta``):
  only negative samples the current policy has moved away from are dropped.

``m2po_keep`` is the batch-level mask of M2PO (a second-moment budget, not a per-row rule).
Every function here is pure and detached; padding may hold anything.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

MASKS = ("none", "icepop", "seq_mis", "geometric", "opsm")


def clean_log_ratio(logp_BxC: Tensor, behaviour_logp_BxC: Tensor, mask_BxC: Tensor) -> Tensor:
    """Detached float32 ``log pi_theta - log mu`` with padding replaced by 0."""
    mask_BxC = mask_BxC.bool()
    zero = torch.zeros((), dtype=torch.float32, device=logp_BxC.device)
    diff = logp_BxC.detach().float() - behaviour_logp_BxC.detach().float()
    return torch.where(mask_BxC, diff, zero)


def correction_keep(
    logp_BxC: Tensor,
    behaviour_logp_BxC: Tensor,
    advantage_B: Tensor,
    mask_BxC: Tensor,
    kind: str,
    *,
    low: float = 0.5,
    high: float = 5.0,
    geo_delta: float = 0.02,
    opsm_delta: float = 1e-4,
) -> Tensor:
    """The tokens the mask ``kind`` keeps (module docstring), bool (B, C), False on padding.

    Every rule reads only its own row, so a micro-batch's keep mask is the rows of the whole
    batch's.
    """
    if kind not in MASKS:
        raise ValueError(f"unknown mask {kind!r}; valid masks are {MASKS}")
    mask_BxC = mask_BxC.bool()
    if kind == "none":
        return mask_BxC.clone()
    with torch.no_grad():
        log_r = clean_log_ratio(logp_BxC, behaviour_logp_BxC, mask_BxC)
        if kind == "icepop":
            return mask_BxC & (log_r >= math.log(low)) & (log_r <= math.log(high))
        seq_B = log_r.sum(dim=1)
        n_B = mask_BxC.sum(dim=1).clamp(min=1).float()
        if kind == "seq_mis":
            row_B = (seq_B >= math.log(low)) & (seq_B <= math.log(high))
        elif kind == "geometric":
            geo_B = torch.exp(seq_B / n_B)
            row_B = (geo_B >= 1.0 - geo_delta) & (geo_B <= 1.0 + geo_delta)
        else:  # opsm
            row_B = ~((advantage_B.detach().float().to(mask_BxC.device) < 0)
                      & (-seq_B / n_B > opsm_delta))  # fmt: skip
        return mask_BxC & row_B.unsqueeze(1)


def m2po_keep(log_ratio_BxC: Tensor, mask_BxC: Tensor, threshold: float) -> Tensor:
    """M2PO's token mask over a WHOLE batch: drop the tokens with the largest ``(log r)^2``
    until the mean ``(log r)^2`` of the rest is at most ``threshold`` (AReaL ``m2_threshold``;
    Trinity-RFT ``m2po_policy_loss``).

    Sort the n valid tokens' ``m_t = (log r_t)^2`` ascending (a stable sort, so ties keep their
    batch order); the prefix means ``cumsum_k / k`` are non-decreasing in k, so the kept set is
    the k smallest for the largest k with ``cumsum_k / k <= threshold`` (k = n: nothing
    dropped; k = 0 if even the smallest exceeds it). Exactly ``n - k`` tokens are dropped, ties
    included, so the result is the same however the rows are later cut into micro-batches.
    """
    if not threshold >= 0:
        raise ValueError(f"m2po threshold must be >= 0, got {threshold}")
    with torch.no_grad():
        mask_BxC = mask_BxC.bool()
        flat_mask = mask_BxC.flatten()
        m = log_ratio_BxC.detach().float().flatten()[flat_mask].square()
        keep = torch.zeros_like(flat_mask)
        if m.numel():
            order = torch.sort(m, stable=True).indices
            prefix = torch.cumsum(m[order], 0) / torch.arange(
                1, m.numel() + 1, device=m.device, dtype=torch.float32
            )
            over = (prefix > threshold).nonzero()  # the first prefix over the budget
            k = int(over[0]) if len(over) else m.numel()
            kept = torch.zeros(m.numel(), dtype=torch.bool, device=m.device)
            kept[order[:k]] = True
            keep[flat_mask] = kept
        return keep.view_as(mask_BxC)
