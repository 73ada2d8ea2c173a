"""DPPO-Binary-TV (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement Learning",
arXiv 2602.04879): a trust region on the probability difference, not the ratio.

PPO's clip bounds ``r = pi / mu``, a one-sample estimate of the policy's divergence that
over-penalises rare tokens (1e-5 -> 1e-3 is r = 100) and under-penalises likely ones (0.99 ->
0.8 is r = 0.81). DPPO drops a token whose update left a trust region on a divergence; the
Binary approximation of the total variation (the sampled token against "all the others") is
``|pi(y_t) - mu(y_t)|``. Per valid token t of row i, with ``r_t = exp(log pi_theta(y_t) - log
mu(y_t))`` against the STORED behaviour log-prob mu (as every loss of this package), ``d_t =
pi_theta(y_t) - mu(y_t)`` (probabilities, detached) and ``A_i`` the row's frozen advantage:

    dropped_t = (A_i > 0 and d_t > delta_high) or (A_i < 0 and d_t < -delta_low)
    objective_t = 0 if dropped_t else r_t A_i
    loss = -aggregate(objective) + kl_tau * aggregate((log r_t)^2) [+ kl_coef * aggregate(k3)]

A token is dropped only when it moved past the region IN the direction its advantage pushes
(binary masking: its gradient is 0, the term a constant 0); elsewhere the gradient is the
unclipped importance-weighted ``r_t A_i grad log pi``. A dropped token still counts in the
normaliser (``denom``), as in every peer. The paper's DPPO objective is the masked
importance-weighted surrogate with the Binary-TV mask (we could not read the paper's text,
so its equation number is not quoted; the formula is read off the peers' code).

The same number: prime-rl ``src/prime_rl/trainer/rl/loss.py::default_loss_fn``
(``[trainer.loss] type = "default"``: ``dppo_mask_low`` / ``dppo_mask_high`` = our
``delta_low`` / ``delta_high``, ``kl_tau`` = our ``kl_tau``, ``adv_tau = 1``), exactly, with
``agg="token_mean"`` (prime-rl divides the sum by the global loss-token count) and the ratio
against the inference log-probs, i.e. mu. verl ``dppo_tv`` (``compute_policy_loss_dppo_tv``,
``actor.policy_loss.loss_mode=dppo_tv``, ``clip_ratio_low`` / ``clip_ratio_high`` as the TV
thresholds; the authors' ``sail-sg/Stable-RL`` ``dppo_binary_tv``) computes the same mask and
the same GRADIENT, not the same value: its surrogate is ``-A sg(min(r, clip_ratio_c)) log pi``
(REINFORCE form, the detached ratio truncated at ``clip_ratio_c``: verl's default 20,
Stable-RL's 10, 10000 in verl's DPPO example), whose gradient equals ours wherever ``r <=
clip_ratio_c``.

What it reduces to on-policy (every r = 1, so d = 0 and nothing is dropped): GRPO exactly, value
``A_i`` per token and gradient ``A_i grad log pi`` (the ``(log r)^2`` term and its gradient
``2 log r`` are 0 there).

Conventions, and where the peers differ:

- Ratio and mask against the stored mu, however stale: prime-rl's (it always uses the
  inference log-probs) and verl's bypass mode (recommended by the authors' example, Sec. 5.2 of
  the paper); verl otherwise takes both against a recomputed ``old_log_prob``
  (``dppo_binary_tv_recompute`` in Stable-RL).
- Strict inequalities: a token exactly at ``d = delta`` is kept (prime-rl, verl).
- ``A = 0``: its term is 0 whatever the mask (prime-rl and verl give it the A < 0 branch of
  the mask); here it is left out of the product so that an overflowed ``r = inf`` cannot
  make ``0 * inf`` a nan, and it never counts as dropped in ``clip_frac`` (prime-rl's
  ``is_masked`` and verl's ``pg_clipfrac`` count an A = 0 token with ``d < -delta_low``).
- Thresholds: prime-rl's defaults 0.2 / 0.2 (``conf/algo/dppo.yaml``); verl's DPPO example
  (written with the authors) uses 0.15 / 0.15. Both satisfy ``0 < delta <= 1`` (``d`` lies in
  (-1, 1), so delta = 1 never drops a token).
- The ``(log r)^2`` term is prime-rl's regulariser toward mu (its docs: "similar to
  Kimi-K2.5"), over every valid token, dropped ones included; it is not part of the paper's
  DPPO, and verl's ``dppo_tv`` has none. Default ``kl_tau = 0`` (the paper's loss);
  ``algo.dppo_kl_tau=1e-3`` is prime-rl's default loss. Unrelated to ``algo.kl_coef`` (k3
  to the reference policy).
- prime-rl's docs (docs/algorithms.md) write the policy term as ``min(r, delta) A`` with an
  IS cap delta; its code (loss.py, read here) takes the ratio uncapped, as this module does.
- eps_low / eps_high do not enter the loss (they only feed the diag/ clip statistics).

Stats: ``clip_frac`` (valid tokens the trust region dropped: ``clip_frac_high``, A > 0 and d >
delta_high, plus ``clip_frac_low``, A < 0 and d < -delta_low; prime-rl's ``is_masked_high``
/ ``is_masked_low``), ``tv_mean`` / ``tv_max`` (mean and largest ``|d|`` over valid tokens),
``dppo_kl`` (the aggregated ``(log r)^2``, so loss = pg_loss + kl_tau * dppo_kl [+ kl_coef *
kl_ref]) when ``kl_tau > 0``, besides ``pg_loss`` and the ratio stats.

Registered as ``algo=dppo`` at the end of this module (``replay_exp.algo.registry``);
YAML ``conf/algo/dppo.yaml``, schema ``DppoConfig``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from replay_exp.algo.corrections import _finish
from replay_exp.algo.grpo import _masked_min_max, aggregate, masked_mean, prepare
from replay_exp.algo.registry import LossInputs, register_loss
from replay_exp.config.schemas import DppoConfig


def dppo_loss(
    logp_BxC: Tensor,
    behaviour_logp_BxC: Tensor,
    advantage_B: Tensor,
    mask_BxC: Tensor,
    *,
    delta_low: float = 0.2,
    delta_high: float = 0.2,
    kl_tau: float = 0.0,
    agg: str = "token_mean",
    norm_len: int | None = None,
    kl_coef: float = 0.0,
    ref_logp_BxC: Tensor | None = None,
    denom: Tensor | float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """DPPO-Binary-TV loss (to minimise) and detached stats (module docstring).

    Per token ``r A`` unless ``pi - mu`` left ``[-delta_low, delta_high]`` in the direction of
    ``A`` (then 0, no gradient); ``loss = -aggregate(objective) + kl_tau * aggregate((log
    r)^2) + kl_coef * aggregate(k3)`` (the last two only when their coefficient is > 0).
    Gradients flow only into ``logp_BxC``. ``denom``: as in ``grpo_loss`` (a micro-batch given
    the whole batch's gets its share; the mask is per token, so rows never need each other).
    """
    if not (0 < delta_low <= 1 and 0 < delta_high <= 1):
        raise ValueError(f"dppo needs 0 < delta <= 1, got delta_low={delta_low}, "
                         f"delta_high={delta_high}")  # fmt: skip
    if not (kl_tau >= 0 and math.isfinite(kl_tau)):
        raise ValueError(f"dppo needs a finite kl_tau >= 0, got {kl_tau}")
    mask_BxC, logp_BxC, behaviour_BxC, adv_Bx1 = prepare(
        logp_BxC, behaviour_logp_BxC, advantage_B, mask_BxC, kl_coef, ref_logp_BxC
    )
    log_ratio_BxC = logp_BxC - behaviour_BxC
    with torch.no_grad():
        d_BxC = torch.exp(logp_BxC.detach()) - torch.exp(behaviour_BxC)
        high_BxC = (d_BxC > delta_high) & (adv_Bx1 > 0) & mask_BxC
        low_BxC = (d_BxC < -delta_low) & (adv_Bx1 < 0) & mask_BxC
        kept_BxC = mask_BxC & ~(high_BxC | low_BxC) & (adv_Bx1 != 0)
        tv_BxC = d_BxC.abs()
        _, tv_max = _masked_min_max(tv_BxC, mask_BxC)
        extra = {
            "clip_frac": masked_mean((low_BxC | high_BxC).float(), mask_BxC),
            "clip_frac_low": masked_mean(low_BxC.float(), mask_BxC),
            "clip_frac_high": masked_mean(high_BxC.float(), mask_BxC),
            "tv_mean": masked_mean(tv_BxC, mask_BxC),
            "tv_max": torch.where(mask_BxC.any(), tv_max, torch.zeros_like(tv_max)),
        }
    zero = torch.zeros((), dtype=torch.float32, device=logp_BxC.device)
    # the log-ratio of a token left out is replaced before the exp: where's backward would
    # otherwise send its zero gradient through exp(inf) and make a nan
    ratio_BxC = torch.exp(torch.where(kept_BxC, log_ratio_BxC, zero))
    objective_BxC = torch.where(kept_BxC, ratio_BxC * adv_Bx1, zero)
    if kl_tau > 0:
        sq_log_ratio = aggregate(log_ratio_BxC.square(), mask_BxC, agg, norm_len, denom)
        extra["dppo_kl"] = sq_log_ratio.detach()
    loss, stats = _finish(objective_BxC, logp_BxC, log_ratio_BxC, mask_BxC, agg, norm_len,
                          kl_coef, ref_logp_BxC, denom, extra)  # fmt: skip
    if kl_tau > 0:
        loss = loss + kl_tau * sq_log_ratio
    return loss, stats


def check_dppo(algo: DppoConfig) -> str | None:
    """The trust-region thresholds in (0, 1] and a finite ``algo.dppo_kl_tau >= 0``."""
    for key in ("dppo_delta_low", "dppo_delta_high"):
        value = getattr(algo, key)
        if not 0 < value <= 1:
            return f"algo.{key}={value} must be in (0, 1] (a bound on pi - mu)"
    if not (algo.dppo_kl_tau >= 0 and math.isfinite(algo.dppo_kl_tau)):
        return f"algo.dppo_kl_tau={algo.dppo_kl_tau} must be finite and >= 0 (0 = off)"
    return None


@register_loss("dppo", schema=DppoConfig, check=check_dppo)
def algo_dppo(x: LossInputs, algo: DppoConfig) -> tuple[Tensor, dict[str, float]]:
    """``algo=dppo``: :func:`dppo_loss` on the tokens ``algo.mask`` keeps."""
    return dppo_loss(x.logp_BxC, x.behaviour_logp_BxC, x.advantage_B, x.mask_BxC,
                     delta_low=algo.dppo_delta_low, delta_high=algo.dppo_delta_high,
                     kl_tau=algo.dppo_kl_tau, **x.common())  # fmt: skip
