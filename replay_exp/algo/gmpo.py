"""GMPO, Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv 2507.20673).

GRPO optimises the arithmetic mean over a sequence's tokens of ``r_t A``; GMPO the geometric
mean of the (clipped) token ratios times the sequence's advantage. Per row i with ``n_i``
valid tokens, ``A_i`` its frozen advantage and ``r_t = exp(log pi_theta(y_t) - log mu(y_t))``
against the STORED behaviour log-prob mu (as every loss of this package):

    c_t = min(log r_t, eps_high)     if A_i >= 0       (token-level clip, in LOG space,
    c_t = max(log r_t, -eps_low)     if A_i < 0         one-sided by the sign of A: PPO's)
    s_i = exp((1 / n_i) sum_t c_t)                      (geometric mean of the clipped ratios)
    objective: the row term s_i A_i, for every valid token of row i

So the ratio range is ``(e^-eps_low, e^eps_high)``, the paper's wide ``(e^-0.4, e^0.4)``. This
is the paper's objective ``J_GMPO = E[ 1/G sum_i ( prod_t min(r_t^sgn(A), clip(r_t^sgn(A),
e1, e2))^sgn(A) )^(1/|o_i|) A_i ]`` (as TRL's docs give it; we could not read the paper's text,
so its equation number is not quoted) written in log space, as its code does. The same number is
computed by verl ``verl/trainer/ppo/core_algos.py::compute_policy_loss_geo_mean``
(``actor.policy_loss.loss_mode=geo_mean``, ``clip_ratio_low`` / ``clip_ratio_high`` in log
space), TRL ``trl/experimental/gmpo/gmpo_trainer.py::GMPOTrainer._compute_loss``
(``epsilon`` / ``epsilon_high``, log space) and the authors' ``callsys/GMPO``
``train_zero_math_gmpo.py`` (``--cliprange``, symmetric).

Gradient: where ``c_t = log r_t`` (the clip does not bind), ``d s_i / d log pi(y_t) = s_i /
n_i``; a clipped token's ``c_t`` is a constant, so the clip zeroes exactly that token's
gradient and leaves the rest of its row's. ``d objective_i / d log pi(y_t) = s_i A_i / n_i``:
every unclipped token of a row is pushed by the same ``s_i A_i``, the geometric mean damping a
row whose ratios drifted, where GRPO weights each token by its own ``r_t``.

How the aggregation modes map (the loss is per sequence; ``s_i A_i`` is broadcast to the row's
valid tokens, as ``gspo_loss`` does):

- ``seq_mean`` (``conf/algo/gmpo.yaml``): ``(1 / rows) sum_i s_i A_i``, the paper's ``1/G
  sum_i``, what verl and TRL compute (they divide by every row, an empty one included: a row
  with no valid token, which the update never builds, would count there and not here);
- ``token_mean``: ``sum_i n_i s_i A_i / N``, each row weighted by its length;
- ``seq_sum_norm``: ``sum_i n_i s_i A_i / (B * norm_len)``.

In every mode a token's gradient is GRPO's with ``r_t`` replaced by ``s_i`` (and 0 where
clipped): on-policy (every r = 1, so s = 1 and nothing is clipped) it is GRPO's gradient
exactly, ``A_i grad log pi`` over the mode's normaliser, and the value is GRPO's too.

Conventions, and where the peers differ:

- Ratio: against the stored mu, however stale; verl against ``old_log_prob`` (recomputed
  unless in bypass mode), TRL against ``old_per_token_logps``, the authors against the
  sampling policy's log-probs. On-policy all agree.
- Clip sides: ``A > 0`` is clipped above at ``eps_high``, ``A < 0`` below at ``-eps_low`` (the
  ratio-space meaning of eps_low / eps_high everywhere in this project, and verl's and TRL's
  reading of their low / high knobs). The paper's formula clips ``r^sgn(A)`` in ``[e1, e2]``,
  which puts ``e2`` on the A < 0 side too; with the paper's symmetric range the two agree.
- ``A = 0``: clipped above like ``A > 0`` (the authors' ``sgn = -1 if A >= 0``); TRL clips it
  like ``A < 0``, verl sets its log-ratio to 0. Its term ``s_i * 0`` is 0 either way; clipping
  above only keeps ``s_i`` finite, so that 0 * inf cannot make a nan.
- Advantage: sequence-level, as verl assumes (``we only support sequence level advantage``)
  and every advantage here is.
- eps_low / eps_high are LOG-space bounds here; ``replay_exp.config.checks`` still asks
  ``0 <= eps_low < 1`` (meant for ``1 - eps_low`` in ratio space), which for GMPO only means
  a lower bound above ``e^-1``; the paper's 0.4 fits. The diag/ clip statistics read them as
  ratio-space bounds ``1 -+ eps`` and are approximate for GMPO; the loss's own ``clip_frac`` is
  exact.
- Dual clip (``algo.clip_ratio_c``, off by default; ``grpo.dual_clip``): for A < 0 the term
  becomes ``max(s_i A_i, c A_i)``. GMPO clips a negative row's log-ratios only from below, so
  its ``s_i`` is unbounded above and so is the gradient ``s_i |A_i|`` of a blown-up bad
  sequence; the dual clip bounds it. Ours only: verl's ``geo_mean`` reads no ``clip_ratio_c``.

Stats: ``clip_frac`` (valid tokens whose gradient the clip zeroes: ``clip_frac_high``, A > 0
and log r > eps_high, plus ``clip_frac_low``, A < 0 and log r < -eps_low, TRL's
``clip_ratio/*``), ``seq_ratio_mean`` / ``seq_ratio_min`` / ``seq_ratio_max`` of ``s_i`` over
rows with a valid token (1.0 if none), with the dual clip ``dual_clip_frac`` (valid tokens
whose row it binds), besides ``pg_loss`` and the ratio stats.

Registered as ``algo=gmpo`` at the end of this module (``replay_exp.algo.registry``);
YAML ``conf/algo/gmpo.yaml``, schema ``GmpoConfig``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from replay_exp.algo.corrections import _finish
from replay_exp.algo.grpo import _masked_min_max, check_dual_clip, dual_clip, masked_mean, prepare
from replay_exp.algo.registry import LossInputs, register_loss
from replay_exp.config.schemas import GmpoConfig


def gmpo_loss(
    logp_BxC: Tensor,
    behaviour_logp_BxC: Tensor,
    advantage_B: Tensor,
    mask_BxC: Tensor,
    *,
    eps_low: float = 0.4,
    eps_high: float = 0.4,
    clip_ratio_c: float | None = None,
    agg: str = "token_mean",
    norm_len: int | None = None,
    kl_coef: float = 0.0,
    ref_logp_BxC: Tensor | None = None,
    denom: Tensor | float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GMPO loss (to minimise) and detached stats (module docstring).

    ``s_i = exp(mean_t c_t)`` of the log-space clipped log-ratios ``c_t`` (above at
    ``eps_high`` where ``A >= 0``, below at ``-eps_low`` where ``A < 0``), the term ``s_i A_i``
    on each valid token of row i, ``loss = -aggregate(objective) + kl_coef * aggregate(k3)``
    (the k3 term of ``grpo_loss``, only when ``kl_coef > 0``). Gradients flow only into
    ``logp_BxC``. ``denom``: as in ``grpo_loss`` (a micro-batch given the whole batch's gets
    its share; the term is per row, so rows never need each other).
    """
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"clip eps must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    mask_BxC, logp_BxC, behaviour_BxC, adv_Bx1 = prepare(
        logp_BxC, behaviour_logp_BxC, advantage_B, mask_BxC, kl_coef, ref_logp_BxC
    )
    log_ratio_BxC = logp_BxC - behaviour_BxC  # 0 on padding (prepare)
    clipped_BxC = torch.where(
        adv_Bx1 < 0, log_ratio_BxC.clamp(min=-eps_low), log_ratio_BxC.clamp(max=eps_high)
    )
    zero = torch.zeros((), dtype=torch.float32, device=logp_BxC.device)
    n_Bx1 = mask_BxC.sum(dim=1, keepdim=True).clamp(min=1).float()
    s_Bx1 = torch.exp(torch.where(mask_BxC, clipped_BxC, zero).sum(dim=1, keepdim=True) / n_Bx1)
    # dual clip (grpo.dual_clip): A < 0 clips log r only from below, so s is unbounded above
    objective_Bx1, dual_Bx1 = dual_clip(s_Bx1 * adv_Bx1, s_Bx1, adv_Bx1, clip_ratio_c)
    objective_BxC = objective_Bx1.expand_as(mask_BxC)
    with torch.no_grad():
        lr = log_ratio_BxC.detach()
        low_BxC = (lr < -eps_low) & (adv_Bx1 < 0) & mask_BxC
        high_BxC = (lr > eps_high) & (adv_Bx1 > 0) & mask_BxC
        rows_B = mask_BxC.any(dim=1)
        s_B = s_Bx1.detach().squeeze(1)
        one = torch.ones((), dtype=torch.float32, device=s_B.device)
        s_min, s_max = _masked_min_max(s_B, rows_B)
        extra = {
            "clip_frac": masked_mean((low_BxC | high_BxC).float(), mask_BxC),
            "clip_frac_low": masked_mean(low_BxC.float(), mask_BxC),
            "clip_frac_high": masked_mean(high_BxC.float(), mask_BxC),
            "seq_ratio_mean": torch.where(rows_B.any(), masked_mean(s_B, rows_B), one),
            "seq_ratio_min": s_min,
            "seq_ratio_max": s_max,
        }
        if dual_Bx1 is not None:
            extra["dual_clip_frac"] = masked_mean((dual_Bx1 & mask_BxC).float(), mask_BxC)
    return _finish(objective_BxC, logp_BxC, log_ratio_BxC, mask_BxC, agg, norm_len, kl_coef,
                   ref_logp_BxC, denom, extra)  # fmt: skip


@register_loss("gmpo", schema=GmpoConfig, check=check_dual_clip)
def algo_gmpo(x: LossInputs, algo: GmpoConfig) -> tuple[Tensor, dict[str, float]]:
    """``algo=gmpo``: :func:`gmpo_loss` on the tokens ``algo.mask`` keeps, ``algo.eps_low`` /
    ``algo.eps_high`` as its log-space clip range (resolve() checks their signs and range)."""
    return gmpo_loss(x.logp_BxC, x.behaviour_logp_BxC, x.advantage_B, x.mask_BxC,
                     eps_low=algo.eps_low, eps_high=algo.eps_high,
                     clip_ratio_c=algo.clip_ratio_c, **x.common())  # fmt: skip
