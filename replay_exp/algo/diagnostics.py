"""Per-update diagnostics: how stale a batch is, and how far one update moves the policy.

Pure functions of detached per-token log-probs; nothing here touches a model or a config. The
loop logs them every step under ``diag/`` (``replay_exp.update.policy_update`` computes
``logp_after`` with one no-grad forward after the optimizer step).

Notation, per valid completion token t of row i:

- ``r_t = pi_before(y_t) / pi_behaviour(y_t)``: the importance ratio the loss sees (the current
  policy, before the update, against the policy that generated the rollout);
- ``lag_i = version_now - version_i``: how many updates old the generating weights are.

Statistics (all token means over valid tokens unless said otherwise):

- ``update_kl``: KL(pi_before || pi_after), one step's movement, on the batch's own contexts:
  ``sum_t w_t k3(u_t) / sum_t w_t`` with ``u_t = log pi_after(y_t) - log pi_before(y_t)``,
  ``k3(u) = e^u - 1 - u`` and ``w_t = r_t``, which re-weights tokens drawn from the behaviour
  policy to draws from pi_before (self-normalised). For an on-policy batch every ``w_t = 1``
  and this is the plain k3 estimator; it is non-zero whenever the update changes the policy.
- Per lag bucket (``LAG_BUCKETS``: 0, 1-3, 4-15, >= 16 versions): ``token_frac`` (share of the
  batch's tokens in the bucket), ``clip_frac`` (tokens whose gradient the PPO clip zeroes: r <
  1 - eps_low with A < 0 or r > 1 + eps_high with A > 0, as ``grpo_loss``'s ``clip_frac``),
  ``outside_clip`` (tokens with r outside [1 - eps_low, 1 + eps_high], whatever the sign of A),
  ``ratio_dev`` (mean |r - 1|) and ``kl`` (KL(behaviour || current), k3 of ``log r``: mean of
  ``r - 1 - log r``). An empty bucket gives NaN (logged as null).
- The same four for the whole batch: ``clip_frac``, ``outside_clip``, ``ratio_dev``, ``kl``.
- ``ess_frac``: effective sample size of the sequence-level importance weights
  ``W_i = prod_t r_t`` (``(sum W)^2 / sum W^2``) divided by the number of rows with a token;
  1 when every weight is equal (on-policy), near 1/n when one rollout dominates.

Ratios before any truncation or mask (what a correction acts on; TRL #5231), over all valid
tokens: ``ratio_raw_mean``, ``ratio_raw_max``, and per lag bucket and for the batch
``above_2`` / ``below_half`` (share of tokens with r > 2 / r < 0.5). When a mask is active
(``keep_BxC``: ``algo.mask`` or M2PO's budget), ``masked_frac`` (valid tokens dropped), per
bucket and for the batch, and ``masked_seq_frac`` (rows with a valid token that lost any).

The split of the ratio (``gap_BxC``: the stored ``engine_gap = log pi_trainer(at the
generating weights) - log mu_engine``): ``log r = staleness + mismatch`` with ``mismatch =
gap`` (trainer vs engine at the same weights: exactly 0 for the hf engine, which is the
trainer's model) and ``staleness = log r - gap`` (current weights vs the generating ones).
For each part, k3 KL (``mismatch_kl``, ``staleness_kl``: mean of ``e^x - 1 - x``) and the
mean ``|e^x - 1|`` (``mismatch_dev``, ``staleness_dev``), for the batch and per lag bucket
(``<bucket>/mismatch_kl``, ``<bucket>/staleness_kl``); NaN when the gap was not measured
(``gap_BxC`` None: a non-hf engine without ``generation.store_trainer_logp``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from replay_exp.algo.grpo import clipped_tokens

# (name, lowest lag, highest lag) of each bucket, in policy versions.
LAG_BUCKETS = (("lag0", 0, 0), ("lag1-3", 1, 3), ("lag4-15", 4, 15), ("lag16+", 16, math.inf))


def _k3(log_ratio: Tensor) -> Tensor:
    """``e^x - 1 - x`` (>= 0), the k3 KL term of a log-ratio."""
    return torch.expm1(log_ratio) - log_ratio


def _staleness(
    log_r: Tensor, adv_Bx1: Tensor, mask: Tensor, eps_low: float, eps_high: float
) -> dict[str, float]:
    """clip_frac, outside_clip, ratio_dev, kl over the tokens in ``mask`` (NaN if none)."""
    n = int(mask.sum())
    if n == 0:
        return dict.fromkeys(("clip_frac", "outside_clip", "ratio_dev", "kl"), math.nan)
    r = torch.exp(log_r)
    low, high = r < 1.0 - eps_low, r > 1.0 + eps_high
    zeroed_low, zeroed_high = clipped_tokens(r, adv_Bx1, eps_low, eps_high)
    zeroed = zeroed_low | zeroed_high
    return {
        "clip_frac": float((zeroed & mask).sum()) / n,
        "outside_clip": float(((low | high) & mask).sum()) / n,
        "ratio_dev": float(((r - 1.0).abs() * mask).sum()) / n,
        "kl": float((_k3(log_r) * mask).sum()) / n,
    }


def ess_fraction(log_w: Tensor) -> float:
    """Effective sample size of the sequence weights ``W_i = exp(log_w_i)`` over their count:
    ``(sum W)^2 / (n sum W^2)``, in log space (sums of many log-ratios overflow); NaN for no
    row. Equal weights give 1; one weight e^10 among e^0 ones gives about 1/n.

    Hand-checked: log_w = [0, log 3] gives W = [1, 3], (1 + 3)^2 / (2 (1 + 9)) = 16/20 = 0.8."""
    if len(log_w) == 0:
        return math.nan
    ess = torch.exp(2 * torch.logsumexp(log_w, 0) - torch.logsumexp(2 * log_w, 0))
    return float(ess) / len(log_w)


@torch.no_grad()
def update_diagnostics(
    logp_before_BxC: Tensor,
    logp_after_BxC: Tensor,
    behaviour_logp_BxC: Tensor,
    mask_BxC: Tensor,
    advantage_B: Tensor,
    lag_B: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    *,
    keep_BxC: Tensor | None = None,
    gap_BxC: Tensor | None = None,
) -> dict[str, float]:
    """The module docstring's statistics of one update, as python floats.

    Keys: ``update_kl``, ``ess_frac``, ``clip_frac``, ``outside_clip``, ``ratio_dev``, ``kl``,
    ``ratio_raw_mean``, ``ratio_raw_max``, ``above_2``, ``below_half``, the split
    (``mismatch_kl``, ``mismatch_dev``, ``staleness_kl``, ``staleness_dev``), with
    ``keep_BxC`` ``masked_frac`` and ``masked_seq_frac``, and ``<bucket>/<stat>`` for each of
    ``LAG_BUCKETS`` and the stats ``token_frac``, ``clip_frac``, ``outside_clip``,
    ``ratio_dev``, ``kl``, ``above_2``, ``below_half``, ``mismatch_kl``, ``staleness_kl`` (and
    ``masked_frac`` with ``keep_BxC``). Padding may hold anything."""
    mask = mask_BxC.bool()
    zero = torch.zeros((), dtype=torch.float32, device=mask.device)
    before = torch.where(mask, logp_before_BxC.float(), zero)
    after = torch.where(mask, logp_after_BxC.float(), zero)
    behaviour = torch.where(mask, behaviour_logp_BxC.float(), zero)
    adv_Bx1 = advantage_B.float().unsqueeze(1).to(mask.device)
    log_r = before - behaviour  # 0 on padding
    n_tokens = int(mask.sum())

    out: dict[str, float] = {}
    # One step's movement, importance-weighted from behaviour draws to pi_before draws.
    w = torch.exp(log_r) * mask
    out["update_kl"] = float((w * _k3(after - before)).sum() / w.sum()) if n_tokens else math.nan
    rows = mask.any(dim=1)
    out["ess_frac"] = ess_fraction(log_r.sum(dim=1)[rows])
    out.update(_staleness(log_r, adv_Bx1, mask, eps_low, eps_high))
    r = torch.exp(log_r)
    out["ratio_raw_mean"] = float((r * mask).sum()) / n_tokens if n_tokens else math.nan
    out["ratio_raw_max"] = float(torch.where(mask, r, -torch.inf).max()) if n_tokens else math.nan
    dropped = None
    if keep_BxC is not None:
        dropped = mask & ~keep_BxC.bool().to(mask.device)
        rows_with = int(rows.sum())
        out["masked_seq_frac"] = (
            float(dropped.any(dim=1).sum()) / rows_with if rows_with else math.nan
        )
    mismatch = staleness = None
    if gap_BxC is not None:
        mismatch = torch.where(mask, gap_BxC.float().to(mask.device), zero)
        staleness = log_r - mismatch
    out.update(_tails(r, mask, dropped, mismatch, staleness, with_dev=True))
    lag_Bx1 = lag_B.to(mask.device).unsqueeze(1)
    for name, lo, hi in LAG_BUCKETS:
        in_bucket = mask & (lag_Bx1 >= lo) & (lag_Bx1 <= hi)
        out[f"{name}/token_frac"] = float(in_bucket.sum()) / n_tokens if n_tokens else math.nan
        for key, v in _staleness(log_r, adv_Bx1, in_bucket, eps_low, eps_high).items():
            out[f"{name}/{key}"] = v
        for key, v in _tails(r, in_bucket, dropped, mismatch, staleness).items():
            out[f"{name}/{key}"] = v
    return out


def _tails(
    r: Tensor,
    mask: Tensor,
    dropped: Tensor | None,
    mismatch: Tensor | None,
    staleness: Tensor | None,
    with_dev: bool = False,
) -> dict[str, float]:
    """Over the tokens in ``mask`` (NaN if none): ``above_2``, ``below_half``, ``masked_frac``
    (if ``dropped``), ``mismatch_kl`` / ``staleness_kl`` (NaN without the split) and, with
    ``with_dev``, ``mismatch_dev`` / ``staleness_dev``."""
    n = int(mask.sum())
    keys = ["above_2", "below_half", "mismatch_kl", "staleness_kl"]
    keys += ["mismatch_dev", "staleness_dev"] if with_dev else []
    keys += ["masked_frac"] if dropped is not None else []
    if n == 0:
        return dict.fromkeys(keys, math.nan)
    out = {
        "above_2": float(((r > 2.0) & mask).sum()) / n,
        "below_half": float(((r < 0.5) & mask).sum()) / n,
    }
    for name, x in (("mismatch", mismatch), ("staleness", staleness)):
        out[f"{name}_kl"] = math.nan if x is None else float((_k3(x) * mask).sum()) / n
        if with_dev:
            dev = math.nan if x is None else float((torch.expm1(x).abs() * mask).sum()) / n
            out[f"{name}_dev"] = dev
    if dropped is not None:
        out["masked_frac"] = float((dropped & mask).sum()) / n
    return out
