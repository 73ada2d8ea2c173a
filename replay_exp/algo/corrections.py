"""Stale-data corrections peers ship, as losses beside ``grpo_loss``: CISPO, GSPO, TOPR, M2PO.

Each is a pure function with ``grpo_loss``'s leading arguments ``(logp_BxC,
behaviour_logp_BxC, advantage_B, mask_BxC, *, ..., denom)`` and its return ``(loss, stats)``;
``r_t = exp(log pi_theta(y_t) - log mu(y_t))`` per valid token against the STORED behaviour
log-prob ``mu``, ``L_i = sum_t log r_t`` over row i's ``n_i`` valid tokens, ``A_i`` its frozen
advantage, ``sg`` a stop-gradient. Every loss aggregates with ``grpo.aggregate`` (``agg``,
``norm_len``, ``denom``: a micro-batch given the whole batch's ``denom`` returns its share),
adds the same optional k3 KL penalty (``kl_coef``, ``ref_logp_BxC``), and reports
``pg_loss`` and the staleness stats of ``grpo.ratio_stats``. Gradients flow only into
``logp_BxC``. Padding may hold anything; it is replaced before any arithmetic.

What each reduces to on-policy (every ``r_t = 1``), tested in ``tests/algo/test_corrections.py``:
CISPO, GSPO and M2PO to GRPO's gradient (value ``A``; CISPO's value is ``A log pi``), TOPR to
REINFORCE with the coefficient ``R - b``.

Each registers itself (``replay_exp.algo.registry``) at the end of this module as
``algo=cispo | gspo | m2po | topr``, with its schema (``replay_exp/config/schemas.py``) and its
YAML (``conf/algo/<name>.yaml``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from replay_exp.algo.grpo import (
    agg_denominator,
    aggregate,
    check_dual_clip,
    dual_clip,
    masked_mean,
    prepare,
    ratio_stats,
    stats_to_floats,
    with_kl_penalty,
)
from replay_exp.algo.masks import m2po_keep
from replay_exp.algo.registry import LossInputs, register_loss
from replay_exp.config.schemas import CispoConfig, GspoConfig, M2poConfig, ToprConfig


def _finish(
    objective_BxC: Tensor,
    logp_BxC: Tensor,
    log_ratio_BxC: Tensor,
    mask_BxC: Tensor,
    agg: str,
    norm_len: int | None,
    kl_coef: float,
    ref_logp_BxC: Tensor | None,
    denom: Tensor | float | None,
    extra: dict[str, Tensor],
) -> tuple[Tensor, dict[str, float]]:
    """Aggregate the objective, add the KL penalty, and collect the shared stats."""
    pg_loss = -aggregate(objective_BxC, mask_BxC, agg, norm_len, denom)
    loss, kl_ref = with_kl_penalty(
        pg_loss, logp_BxC, ref_logp_BxC, mask_BxC, kl_coef, agg, norm_len, denom
    )
    with torch.no_grad():
        values = {"pg_loss": pg_loss.detach(), **ratio_stats(log_ratio_BxC, mask_BxC), **extra}
        if kl_ref is not None:
            values["kl_ref"] = kl_ref.detach()
    return loss, stats_to_floats(values)


def cispo_loss(
    logp_BxC: Tensor,
    behaviour_logp_BxC: Tensor,
    advantage_B: Tensor,
    mask_BxC: Tensor,
    *,
    eps_low: float = 1.0,
    eps_high: float = 0.28,
    agg: str = "token_mean",
    norm_len: int | None = None,
    kl_coef: float = 0.0,
    ref_logp_BxC: Tensor | None = None,
    denom: Tensor | float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1, Chen et al. 2025, arXiv 2506.13585): per token
    ``sg(clip(r_t, 1 - eps_low, 1 + eps_high)) * A_i * log pi_theta(y_t)``.

    The importance weight is clipped, never the token: every token keeps the gradient
    ``w_t A_i grad log pi`` (PPO's clip instead zeroes it). The paper sets no lower bound
    (``eps_low = 1``: the weight is clipped at 0 from below, i.e. not at all) and tunes only
    ``eps_high``; Trinity-RFT's defaults are 1.0 / 0.28.

    Extra stats: ``clip_frac`` (valid tokens whose weight was clipped, either side),
    ``clip_frac_low`` / ``clip_frac_high``, ``weight_mean`` (mean clipped weight).
    """
    if not (0 <= eps_low <= 1 and eps_high >= 0):
        raise ValueError(f"cispo needs 0 <= eps_low <= 1 and eps_high >= 0, got {eps_low}, "
                         f"{eps_high}")  # fmt: skip
    mask_BxC, logp_BxC, behaviour_BxC, adv_Bx1 = prepare(
        logp_BxC, behaviour_logp_BxC, advantage_B, mask_BxC, kl_coef, ref_logp_BxC
    )
    log_ratio_BxC = logp_BxC - behaviour_BxC
    with torch.no_grad():
        ratio_BxC = torch.exp(log_ratio_BxC)
        w_BxC = ratio_BxC.clamp(1.0 - eps_low, 1.0 + eps_high)
        low_BxC = (ratio_BxC < 1.0 - eps_low) & mask_BxC
        high_BxC = (ratio_BxC > 1.0 + eps_high) & mask_BxC
        extra = {
            "clip_frac": masked_mean((low_BxC | high_BxC).float(), mask_BxC),
            "clip_frac_low": masked_mean(low_BxC.float(), mask_BxC),
            "clip_frac_high": masked_mean(high_BxC.float(), mask_BxC),
            "weight_mean": masked_mean(w_BxC, mask_BxC),
        }
    objective_BxC = w_BxC * adv_Bx1 * logp_BxC
    return _finish(objective_BxC, logp_BxC, log_ratio_BxC, mask_BxC, agg, norm_len, kl_coef,
                   ref_logp_BxC, denom, extra)  # fmt: skip


def gspo_loss(
    logp_BxC: Tensor,
    behaviour_logp_BxC: Tensor,
    advantage_B: Tensor,
    mask_BxC: Tensor,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    clip_ratio_c: float | None = None,
    agg: str = "token_mean",
    norm_len: int | None = None,
    kl_coef: float = 0.0,
    ref_logp_BxC: Tensor | None = None,
    denom: Tensor | float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO (Zheng et al. 2025, arXiv 2507.18071): the length-normalised sequence ratio
    ``s_i = exp(L_i / n_i)`` (differentiable), PPO's clip on it, and the same term
    ``min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)`` for every valid token of row i.

    Gradient: where the clip does not bind, ``d s_i = s_i (1 / n_i) sum_t d log pi(y_t)``, so
    with ``agg="seq_mean"`` this is GSPO's sequence objective and with ``token_mean`` it is
    GSPO-token with every token's ratio equal to ``s_i`` (a row of n_i tokens has n_i equal
    terms, whose gradients sum to ``s_i A_i sum_t grad log pi``). The paper's eps are small
    (3e-4 / 4e-4): a length-normalised ratio moves far less than a token's. ``clip_ratio_c``:
    the dual clip on the sequence ratio (``grpo.dual_clip``; a row with A < 0 and s > c gives
    the constant ``c A``), as AReaL's ``c_clip`` with ``importance_sampling_level=sequence``;
    verl's ``gspo`` loss has none.

    Extra stats: ``clip_frac`` (valid tokens whose row the clip zeroes: s < 1 - eps_low with
    A < 0, or s > 1 + eps_high with A > 0), ``seq_ratio_mean`` / ``seq_ratio_min`` /
    ``seq_ratio_max`` over rows with a valid token (1.0 if none), with the dual clip
    ``dual_clip_frac`` (valid tokens whose row it binds).
    """
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"clip eps must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    mask_BxC, logp_BxC, behaviour_BxC, adv_Bx1 = prepare(
        logp_BxC, behaviour_logp_BxC, advantage_B, mask_BxC, kl_coef, ref_logp_BxC
    )
    log_ratio_BxC = logp_BxC - behaviour_BxC
    n_Bx1 = mask_BxC.sum(dim=1, keepdim=True).clamp(min=1).float()
    s_Bx1 = torch.exp(log_ratio_BxC.sum(dim=1, keepdim=True) / n_Bx1)
    clipped_Bx1 = torch.clamp(s_Bx1, 1.0 - eps_low, 1.0 + eps_high) * adv_Bx1
    objective_Bx1 = torch.minimum(s_Bx1 * adv_Bx1, clipped_Bx1)
    objective_Bx1, dual_Bx1 = dual_clip(objective_Bx1, s_Bx1, adv_Bx1, clip_ratio_c)
    objective_BxC = objective_Bx1.expand_as(mask_BxC)
    with torch.no_grad():
        s = s_Bx1.detach()
        zeroed_Bx1 = ((s < 1.0 - eps_low) & (adv_Bx1 < 0)) | ((s > 1.0 + eps_high) & (adv_Bx1 > 0))
        rows_B = mask_BxC.any(dim=1)
        one = torch.ones((), dtype=torch.float32, device=s.device)
        s_B = s.squeeze(1)
        extra = {
            "clip_frac": masked_mean((zeroed_Bx1 & mask_BxC).float(), mask_BxC),
            "seq_ratio_mean": torch.where(rows_B.any(), masked_mean(s_B, rows_B), one),
            "seq_ratio_min": torch.where(rows_B.any(), torch.where(rows_B, s_B, torch.inf).min(),
                                         one),
            "seq_ratio_max": torch.where(rows_B.any(), torch.where(rows_B, s_B, -torch.inf).max(),
                                         one),
        }  # fmt: skip
        if dual_Bx1 is not None:
            extra["dual_clip_frac"] = masked_mean((dual_Bx1 & mask_BxC).float(), mask_BxC)
    return _finish(objective_BxC, logp_BxC, log_ratio_BxC, mask_BxC, agg, norm_len, kl_coef,
                   ref_logp_BxC, denom, extra)  # fmt: skip


def topr_loss(
    logp_BxC: Tensor,
    behaviour_logp_BxC: Tensor,
    reward_B: Tensor,
    mask_BxC: Tensor,
    *,
    baseline: float = 0.5,
    agg: str = "token_mean",
    norm_len: int | None = None,
    kl_coef: float = 0.0,
    ref_logp_BxC: Tensor | None = None,
    denom: Tensor | float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """TOPR, tapered off-policy REINFORCE (Le Roux et al. 2025, arXiv 2503.14286): with the
    coefficient ``c_i = R_i - b`` of the stored reward (``b = baseline``), per token
    ``c_i log pi_theta(y_t)`` when ``c_i > 0`` (an SFT-like push, no ratio), else
    ``sg(clip(W_i, 0, 1)) c_i log pi_theta(y_t)`` with ``W_i = exp(L_i)`` the sequence ratio:
    a negative sample the current policy already finds less likely than the behaviour policy
    did is pushed down less, and none more than on-policy.

    Works on the stored reward, not the advantage (AsymRE's sibling): the third argument is
    ``reward_B``. The paper's rewards are +-1; for a binary reward in {0, 1}, ``b = 0.5`` gives
    +-0.5, the paper's update at half the learning rate.

    Extra stats: ``pos_frac`` (rows with c > 0), ``taper_mean`` (mean ``clip(W, 0, 1)`` over the
    negative rows; 1.0 if none) and ``tapered_frac`` (negative rows whose ``W < 1``, i.e. whose
    push was reduced).
    """
    mask_BxC, logp_BxC, behaviour_BxC, _ = prepare(
        logp_BxC, behaviour_logp_BxC, reward_B, mask_BxC, kl_coef, ref_logp_BxC
    )
    log_ratio_BxC = logp_BxC - behaviour_BxC
    with torch.no_grad():
        c_B = reward_B.detach().float().to(logp_BxC.device) - baseline
        pos_B = c_B > 0
        W_B = torch.exp(log_ratio_BxC.detach().sum(dim=1))
        taper_B = W_B.clamp(0.0, 1.0)
        coef_B = torch.where(pos_B, c_B, taper_B * c_B)
        neg_B = ~pos_B
        one = torch.ones((), dtype=torch.float32, device=c_B.device)
        extra = {
            "pos_frac": pos_B.float().mean() if len(c_B) else one * 0,
            "taper_mean": torch.where(neg_B.any(), masked_mean(taper_B, neg_B), one),
            "tapered_frac": masked_mean((W_B < 1).float(), neg_B),
        }
    objective_BxC = coef_B.unsqueeze(1) * logp_BxC
    return _finish(objective_BxC, logp_BxC, log_ratio_BxC, mask_BxC, agg, norm_len, kl_coef,
                   ref_logp_BxC, denom, extra)  # fmt: skip


def m2po_loss(
    logp_BxC: Tensor,
    behaviour_logp_BxC: Tensor,
    advantage_B: Tensor,
    mask_BxC: Tensor,
    *,
    threshold: float = 0.04,
    keep_BxC: Tensor | None = None,
    agg: str = "token_mean",
    norm_len: int | None = None,
    kl_coef: float = 0.0,
    ref_logp_BxC: Tensor | None = None,
    denom: Tensor | float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """M2PO (Zheng et al. 2025, "Prosperity before collapse", arXiv 2510.01161; AReaL
    ``m2_threshold``): the unclipped surrogate ``r_t A_i`` on the tokens that survive the
    second-moment budget ``masks.m2po_keep`` (the largest ``(log r)^2`` are dropped until the
    mean of the rest is at most ``threshold``).

    The mask needs the WHOLE batch. ``keep_BxC``: the batch's mask, computed by the caller on
    all rows (``replay_exp.update`` runs one no-grad forward of the whole batch first when
    it is micro-batched), sliced to this call's rows; None: computed here from these rows (the
    whole batch in one call). Dropped tokens count in the normaliser ``denom`` (computed from
    the unmasked mask), as for every mask (``replay_exp.algo.masks``).

    Extra stats: ``m2po_masked_frac`` (valid tokens dropped), ``m2`` (mean ``(log r)^2`` of the
    kept tokens, <= threshold) and ``m2_all`` (of every valid token).
    """
    mask_BxC, logp_BxC, behaviour_BxC, adv_Bx1 = prepare(
        logp_BxC, behaviour_logp_BxC, advantage_B, mask_BxC, kl_coef, ref_logp_BxC
    )
    log_ratio_BxC = logp_BxC - behaviour_BxC
    if keep_BxC is None:
        keep_BxC = m2po_keep(log_ratio_BxC, mask_BxC, threshold)
    if keep_BxC.shape != mask_BxC.shape:
        raise ValueError(
            f"keep_BxC {tuple(keep_BxC.shape)} must match mask {tuple(mask_BxC.shape)}"
        )
    kept_BxC = mask_BxC & keep_BxC.bool().to(mask_BxC.device)
    if denom is None:  # the unmasked batch's normaliser: a dropped token is a zero term
        denom = agg_denominator(mask_BxC, agg, norm_len)
    with torch.no_grad():
        m_BxC = log_ratio_BxC.detach().square()
        extra = {
            "m2po_masked_frac": masked_mean((mask_BxC & ~kept_BxC).float(), mask_BxC),
            "m2": masked_mean(m_BxC, kept_BxC),
            "m2_all": masked_mean(m_BxC, mask_BxC),
        }
    objective_BxC = torch.exp(log_ratio_BxC) * adv_Bx1
    return _finish(objective_BxC, logp_BxC, log_ratio_BxC, kept_BxC, agg, norm_len, kl_coef,
                   ref_logp_BxC, denom, extra)  # fmt: skip


# --- registered as algo=<name> (replay_exp.algo.registry) --------------------------------------


@register_loss("cispo", schema=CispoConfig, weight_clip=True)
def algo_cispo(x: LossInputs, algo: CispoConfig) -> tuple[Tensor, dict[str, float]]:
    """``algo=cispo``: :func:`cispo_loss` on the tokens ``algo.mask`` keeps."""
    return cispo_loss(x.logp_BxC, x.behaviour_logp_BxC, x.advantage_B, x.mask_BxC,
                      eps_low=algo.eps_low, eps_high=algo.eps_high, **x.common())  # fmt: skip


@register_loss("gspo", schema=GspoConfig, check=check_dual_clip)
def algo_gspo(x: LossInputs, algo: GspoConfig) -> tuple[Tensor, dict[str, float]]:
    """``algo=gspo``: :func:`gspo_loss` on the tokens ``algo.mask`` keeps, with the dual clip
    (``algo.clip_ratio_c``)."""
    return gspo_loss(x.logp_BxC, x.behaviour_logp_BxC, x.advantage_B, x.mask_BxC,
                     eps_low=algo.eps_low, eps_high=algo.eps_high,
                     clip_ratio_c=algo.clip_ratio_c, **x.common())  # fmt: skip


def check_m2po(algo: M2poConfig) -> str | None:
    """``algo.m2_threshold`` must be a positive budget."""
    if not algo.m2_threshold > 0:
        return f"algo.m2_threshold={algo.m2_threshold} must be > 0 (the budget on mean (log r)^2)"
    return None


def m2po_batch_keep(log_ratio_BxC: Tensor, mask_BxC: Tensor, algo: M2poConfig) -> Tensor:
    """M2PO's budget over the whole batch (:func:`~replay_exp.algo.masks.m2po_keep`)."""
    return m2po_keep(log_ratio_BxC, mask_BxC, algo.m2_threshold)


@register_loss("m2po", schema=M2poConfig, check=check_m2po, batch_keep=m2po_batch_keep)
def algo_m2po(x: LossInputs, algo: M2poConfig) -> tuple[Tensor, dict[str, float]]:
    """``algo=m2po``: :func:`m2po_loss` with the whole batch's budget mask ``x.keep_BxC`` (None:
    drawn from these rows alone)."""
    return m2po_loss(x.logp_BxC, x.behaviour_logp_BxC, x.advantage_B, x.mask_BxC,
                     threshold=algo.m2_threshold, keep_BxC=x.keep_BxC, **x.common())  # fmt: skip


def check_topr(algo: ToprConfig) -> str | None:
    """``algo.topr_baseline`` must be finite."""
    if not math.isfinite(algo.topr_baseline):
        return f"algo.topr_baseline={algo.topr_baseline} must be finite"
    return None


@register_loss("topr", schema=ToprConfig, check=check_topr)
def algo_topr(x: LossInputs, algo: ToprConfig) -> tuple[Tensor, dict[str, float]]:
    """``algo=topr``: :func:`topr_loss` on the stored reward (not the advantage)."""
    return topr_loss(x.logp_BxC, x.behaviour_logp_BxC, x.reward_B, x.mask_BxC,
                     baseline=algo.topr_baseline, **x.common())  # fmt: skip
