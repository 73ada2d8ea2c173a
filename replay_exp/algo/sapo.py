"""SAPO, Soft Adaptive Policy Optimization (Gao et al. 2025, Qwen, arXiv 2511.20347).

PPO's hard clip of the token ratio is replaced by a smooth gate. Per valid token t of row i,
with ``r_t = exp(log pi_theta(y_t) - log mu(y_t))`` against the STORED behaviour log-prob mu
(as every loss of this package) and ``A_i`` the row's frozen advantage:

    f(r; tau)  = (4 / tau) * sigmoid(tau * (r - 1))          the soft gate
    tau_t      = tau_pos if A_i > 0 else tau_neg              (A_i = 0 takes tau_neg; its term is 0)
    objective  = f(r_t; tau_t) * A_i,   loss = -aggregate(objective)

This is the paper's SAPO objective ``J(theta) = E[ 1/G sum_i 1/|y_i| sum_t f_{i,t}(r_{i,t})
A_{i,t} ]`` with the gate ``f_{i,t}(x) = sigma(tau_{i,t} (x - 1)) 4 / tau_{i,t}`` (as TRL's docs
give it; we could not read the paper's text, so its equation number is not quoted). The same
number is computed by verl ``verl/trainer/ppo/core_algos.py::compute_policy_loss_sapo``
(``actor.policy_loss.loss_mode=sapo``, ``actor.tau_pos`` / ``actor.tau_neg``), TRL
``GRPOTrainer._compute_loss`` (``loss_type="sapo"``, ``sapo_temperature_pos`` /
``sapo_temperature_neg``) and AReaL ``areal/utils/functional/functional.py::sapo_loss_fn``
(``actor.use_sapo_loss=true``, ``sapo_tau_pos`` / ``sapo_tau_neg``).

Gradient: ``d f / d log pi = 4 s (1 - s) r`` with ``s = sigmoid(tau (r - 1))``, so a token's
gradient is ``w_t A_i grad log pi`` with the smooth weight ``w_t = 4 s (1 - s) r``: exactly 1
at r = 1 (the ``4 / tau`` scale is chosen for that), decaying to 0 on both sides instead of
PPO's step to 0; a larger tau narrows the trust region. The negative-advantage gate is the
sharper one by default (tau_neg = 1.05 > tau_pos = 1.0): a token pushed down is damped sooner.

What it reduces to on-policy (every r = 1): gradient ``A_i grad log pi``, GRPO's; value
``2 A_i / tau_t`` (``f(1) = 2 / tau``), not GRPO's ``A_i``.

Conventions, and where the peers differ:

- Ratio: against the stored behaviour log-prob mu, however stale. verl takes it against
  ``old_log_prob`` (recomputed with the pre-update weights unless its bypass mode feeds the
  rollout log-probs), TRL against ``old_per_token_logps`` (recomputed, or the current
  detached log-probs when one step is taken per generation), AReaL against the stored
  ``logprobs`` (the behaviour policy; SAPO refuses AReaL's decoupled loss). On-policy all agree.
- Temperature by sign: ``A > 0`` gets tau_pos, ``A <= 0`` tau_neg, in all three peers.
- Aggregation: the paper's ``1/G sum_i 1/|y_i| sum_t`` is ``agg="seq_mean"``, what verl (it
  forces ``seq-mean-token-mean`` whatever ``loss_agg_mode`` says) and TRL (``loss_type="sapo"``
  takes the per-sequence mean, then the mean over sequences) compute; AReaL aggregates the
  token mean (``agg="token_mean"``). ``conf/algo/sapo.yaml`` sets ``seq_mean``; every
  ``algo.loss_agg`` mode is accepted (the gate is per token).
- Advantage: per token in the peers; here always the row's frozen ``A_i`` (a sequence-level
  advantage, as GRPO's).
- Token ratio only: TRL and AReaL can also gate a sequence-level ratio
  (``importance_sampling_level="sequence"``); their default, and verl's only form, is the
  token ratio used here.
- Defaults tau_pos = 1.0, tau_neg = 1.05: the paper's (Qwen3-30B-A3B-Base), and the default
  of every peer.
- Overflow guard: ``log r`` is clamped at 20 before the exp, as verl does (verl also clamps at
  -20; TRL and AReaL clamp nothing). Beyond ``r = e^20`` the gate is saturated (its float32
  sigmoid is exactly 1) for any tau > 4e-8, so nothing changes except that an infinite ratio
  no longer turns the zero gradient ``0 * inf`` into nan.
- No hard clip: ``eps_low`` / ``eps_high`` do not enter the loss (they only feed the diag/
  clip statistics), and there is no ``clip_frac`` stat (the controller reads NaN, as for any
  loss without a clip). Stats: ``gate_mean`` (mean f over valid tokens, AReaL's
  ``sapo_soft_gate``), ``gate_weight_mean`` / ``gate_weight_min`` (the gradient weight w; 1.0
  without valid tokens) besides ``pg_loss`` and the ratio stats.

Registered as ``algo=sapo`` at the end of this module (``replay_exp.algo.registry``);
YAML ``conf/algo/sapo.yaml``, schema ``SapoConfig``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from replay_exp.algo.corrections import _finish
from replay_exp.algo.grpo import _masked_min_max, masked_mean, prepare
from replay_exp.algo.registry import LossInputs, register_loss
from replay_exp.config.schemas import SapoConfig

# log r is clamped here before the exp (verl's guard): the gate is saturated long before.
LOG_RATIO_MAX = 20.0


def sapo_loss(
    logp_BxC: Tensor,
    behaviour_logp_BxC: Tensor,
    advantage_B: Tensor,
    mask_BxC: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    agg: str = "token_mean",
    norm_len: int | None = None,
    kl_coef: float = 0.0,
    ref_logp_BxC: Tensor | None = None,
    denom: Tensor | float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """SAPO loss (to minimise) and detached stats over valid tokens (module docstring).

    Per token ``(4 / tau) sigmoid(tau (r - 1)) A`` with ``tau = tau_pos`` where ``A > 0``, else
    ``tau_neg``; ``loss = -aggregate(objective) + kl_coef * aggregate(k3)`` (the k3 term of
    ``grpo_loss``, only when ``kl_coef > 0``). Gradients flow only into ``logp_BxC``. ``denom``
    is the aggregation normaliser (None: this batch's own; a micro-batch passes the whole
    batch's and gets its share of the loss).

    Stats (python floats): ``pg_loss``, the ratio stats of ``grpo.ratio_stats``, ``gate_mean``,
    ``gate_weight_mean``, ``gate_weight_min`` and ``kl_ref`` when ``kl_coef > 0``.
    """
    if not (tau_pos > 0 and tau_neg > 0 and math.isfinite(tau_pos) and math.isfinite(tau_neg)):
        raise ValueError(f"sapo needs finite tau_pos > 0 and tau_neg > 0, got {tau_pos}, {tau_neg}")
    mask_BxC, logp_BxC, behaviour_BxC, adv_Bx1 = prepare(
        logp_BxC, behaviour_logp_BxC, advantage_B, mask_BxC, kl_coef, ref_logp_BxC
    )
    log_ratio_BxC = logp_BxC - behaviour_BxC
    ratio_BxC = torch.exp(log_ratio_BxC.clamp(max=LOG_RATIO_MAX))
    pos, neg = (torch.tensor(t, device=adv_Bx1.device) for t in (tau_pos, tau_neg))
    tau_Bx1 = torch.where(adv_Bx1 > 0, pos, neg)
    s_BxC = torch.sigmoid(tau_Bx1 * (ratio_BxC - 1.0))
    gate_BxC = s_BxC * (4.0 / tau_Bx1)
    with torch.no_grad():
        s = s_BxC.detach()
        weight_BxC = 4.0 * s * (1.0 - s) * ratio_BxC.detach()
        one = torch.ones((), dtype=torch.float32, device=s.device)
        w_min, _ = _masked_min_max(weight_BxC, mask_BxC)
        extra = {
            "gate_mean": masked_mean(gate_BxC.detach(), mask_BxC),
            "gate_weight_mean": torch.where(mask_BxC.any(), masked_mean(weight_BxC, mask_BxC), one),
            "gate_weight_min": w_min,
        }
    objective_BxC = gate_BxC * adv_Bx1
    return _finish(objective_BxC, logp_BxC, log_ratio_BxC, mask_BxC, agg, norm_len, kl_coef,
                   ref_logp_BxC, denom, extra)  # fmt: skip


def check_sapo(algo: SapoConfig) -> str | None:
    """Both gate temperatures must be finite and > 0."""
    for key in ("sapo_tau_pos", "sapo_tau_neg"):
        value = getattr(algo, key)
        if not (value > 0 and math.isfinite(value)):
            return f"algo.{key}={value} must be a finite temperature > 0"
    return None


@register_loss("sapo", schema=SapoConfig, check=check_sapo)
def algo_sapo(x: LossInputs, algo: SapoConfig) -> tuple[Tensor, dict[str, float]]:
    """``algo=sapo``: :func:`sapo_loss` on the tokens ``algo.mask`` keeps."""
    return sapo_loss(x.logp_BxC, x.behaviour_logp_BxC, x.advantage_B, x.mask_BxC,
                     tau_pos=algo.sapo_tau_pos, tau_neg=algo.sapo_tau_neg,
                     **x.common())  # fmt: skip
