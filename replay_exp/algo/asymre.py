"""AsymRE: asymmetric REINFORCE with a shifted group baseline and no importance ratio.

The paper's alternative loss ("AsymRE", Arnal et al.): per token of a rollout,

    objective_t = (r - (V_hat + dV)) * log pi_theta(token_t)

with ``r`` the rollout's reward, ``V_hat`` the mean reward of its group of G samples (computed
once, at generation time, like the GRPO advantage) and ``dV`` a constant shift (paper: -0.1).
Differences from the GRPO loss of ``grpo.py``:

1. No importance ratio and no clip: the behaviour log-prob is not part of the loss, so a
   replayed rollout is weighted exactly like a fresh one, however stale. The gradient of a
   valid token is ``-(r - V_hat - dV) * grad log pi / (aggregation normaliser)``.
2. The baseline is shifted by ``dV``. With ``dV < 0`` the effective baseline ``V_hat + dV`` sits
   below the group mean: positive-reward samples are pushed up more than negative ones are
   pushed down (the asymmetry that keeps off-policy REINFORCE stable), and a group whose
   rewards are all equal still gets the coefficient ``-dV`` (0.1 for the paper's value) instead
   of 0. ``dV = 0`` is plain REINFORCE with the group-mean baseline (Dr.GRPO's advantage).
3. No std normalisation: the coefficient is ``r - V_hat - dV`` in reward units.
4. Aggregation over tokens uses the same modes as GRPO (``grpo.aggregate``), and the optional
   k3 KL penalty to a reference policy (``kl_coef > 0``) is the same term as GRPO's: it is
   independent of the policy-gradient estimator, so it is allowed (the paper uses none).

Where ``V_hat`` comes from: rollouts store ``reward_B`` and the frozen ``advantage_B``. When
advantages are generated with ``adv_normalize_std=False``, ``advantage = r - V_hat`` exactly (an
all-equal group has advantage 0 = r - V_hat too), so the trainer recovers
``V_hat = reward_B - advantage_B`` from what is stored, to one float32 rounding of the
advantage (exact for binary rewards whenever k/G is a dyadic fraction, e.g. G a power of two).
``algo.name=asymre`` therefore requires ``algo.adv_normalize_std=false`` (``resolve`` checks).

Pure function: tensors in, ``(loss, detached stats)`` out; no config reads. Padding (``mask
False``) may hold arbitrary garbage; it is replaced before any arithmetic. Registered as
``algo=asymre`` at the end of this module (``replay_exp.algo.registry``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from replay_exp.algo.grpo import (
    aggregate,
    masked_mean,
    ratio_stats,
    stats_to_floats,
    with_kl_penalty,
)
from replay_exp.algo.registry import LossInputs, register_loss
from replay_exp.config.schemas import AsymreConfig


def asymre_loss(
    logp_BxC: Tensor,
    reward_B: Tensor,
    baseline_B: Tensor,
    mask_BxC: Tensor,
    *,
    dv: float = -0.1,
    agg: str = "token_mean",
    norm_len: int | None = None,
    kl_coef: float = 0.0,
    ref_logp_BxC: Tensor | None = None,
    behaviour_logp_BxC: Tensor | None = None,
    denom: Tensor | float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """AsymRE loss (to minimise) and detached stats over valid tokens.

    ``coef_B = reward_B - (baseline_B + dv)`` (a constant), per token the objective is
    ``coef * logp`` and ``loss = -aggregate(objective) + kl_coef * aggregate(k3)`` (the k3 term
    as in ``grpo_loss``, only when ``kl_coef > 0``). Gradients flow only into ``logp_BxC``.
    ``baseline_B`` is V_hat, the group-mean reward at generation time. ``denom`` is the
    aggregation normaliser, as in ``grpo_loss`` (None: this batch's own; a micro-batch passes
    the whole batch's and gets its share of the loss).

    ``behaviour_logp_BxC`` is optional and never enters the loss or its gradient; when given,
    the staleness stats of ``grpo_loss`` (``ratio_mean`` / ``ratio_min`` / ``ratio_max`` /
    ``approx_kl`` of ``pi_theta / pi_behaviour``) are reported for monitoring.

    Stats (python floats): ``pg_loss`` (the policy-gradient part of the loss), ``coef_mean``
    (mean of ``coef`` over the B rollouts), ``coef_pos_frac`` (fraction of rollouts with
    ``coef > 0``, i.e. pushed up), the ratio stats above if ``behaviour_logp_BxC`` is given, and
    ``kl_ref`` when ``kl_coef > 0``.
    """
    if logp_BxC.shape != mask_BxC.shape:
        raise ValueError(
            f"shape mismatch: logp {tuple(logp_BxC.shape)}, mask {tuple(mask_BxC.shape)}"
        )
    B = logp_BxC.shape[0]
    if reward_B.shape != (B,) or baseline_B.shape != (B,):
        raise ValueError(
            f"reward_B {tuple(reward_B.shape)} and baseline_B {tuple(baseline_B.shape)} must "
            f"be (B,) with B={B}"
        )
    if behaviour_logp_BxC is not None and behaviour_logp_BxC.shape != logp_BxC.shape:
        raise ValueError(
            f"shape mismatch: logp {tuple(logp_BxC.shape)}, behaviour_logp "
            f"{tuple(behaviour_logp_BxC.shape)}"
        )
    if kl_coef > 0 and ref_logp_BxC is None:
        raise ValueError(f"kl_coef={kl_coef} > 0 needs ref_logp_BxC (reference-policy log-probs)")

    mask_BxC = mask_BxC.bool()
    zero = torch.zeros((), dtype=torch.float32, device=logp_BxC.device)
    # Replace padding BEFORE any arithmetic (a -inf logp on padding would give 0 * inf = nan).
    logp_BxC = torch.where(mask_BxC, logp_BxC.float(), zero)
    coef_B = reward_B.detach().float() - (baseline_B.detach().float() + dv)
    objective_BxC = coef_B.unsqueeze(1) * logp_BxC
    pg_loss = -aggregate(objective_BxC, mask_BxC, agg, norm_len, denom)
    loss, kl_ref = with_kl_penalty(
        pg_loss, logp_BxC, ref_logp_BxC, mask_BxC, kl_coef, agg, norm_len, denom
    )

    with torch.no_grad():
        rows_B = torch.ones(B, dtype=torch.bool, device=coef_B.device)
        values = {
            "pg_loss": pg_loss.detach(),
            "coef_mean": masked_mean(coef_B, rows_B),
            "coef_pos_frac": masked_mean((coef_B > 0).float(), rows_B),
        }
        if behaviour_logp_BxC is not None:
            behaviour_BxC = torch.where(mask_BxC, behaviour_logp_BxC.detach().float(), zero)
            values.update(ratio_stats(logp_BxC.detach() - behaviour_BxC, mask_BxC))
        if kl_ref is not None:
            values["kl_ref"] = kl_ref.detach()
    return loss, stats_to_floats(values)


def check_asymre(algo: AsymreConfig) -> str | None:
    """V_hat is recovered as reward - advantage, exact only for unnormalised advantages;
    ``algo.asymre_dv`` must be finite. (``kl_coef > 0`` is allowed: the same k3 term as GRPO.)"""
    if algo.adv_normalize_std:
        return "algo.name=asymre needs algo.adv_normalize_std=false (V_hat = r - advantage)"
    if not math.isfinite(algo.asymre_dv):
        return f"algo.asymre_dv={algo.asymre_dv} must be finite"
    return None


@register_loss("asymre", schema=AsymreConfig, check=check_asymre)
def algo_asymre(x: LossInputs, algo: AsymreConfig) -> tuple[Tensor, dict[str, float]]:
    """``algo=asymre``: :func:`asymre_loss` with ``V_hat = r - A`` (the group-mean reward at
    generation time, exact for unnormalised advantages); the behaviour log-probs feed only the
    ratio stats."""
    return asymre_loss(
        x.logp_BxC, x.reward_B, x.reward_B - x.advantage_B, x.mask_BxC, dv=algo.asymre_dv,
        behaviour_logp_BxC=x.behaviour_logp_BxC, **x.common(),
    )  # fmt: skip
