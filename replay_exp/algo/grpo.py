"""GRPO policy-gradient loss for training from a replay buffer.

Deviations from vanilla GRPO (DeepSeekMath, Shao et al. 2024):

1. No KL term by default. ``kl_coef > 0`` adds the k3 estimator of KL(pi_theta || pi_ref)
   against a reference policy (``exp(ref - logp) - (ref - logp) - 1`` per token), as in the
   original; with the default ``kl_coef = 0`` no reference model is needed.
2. Advantages are frozen at generation time (see ``group_advantages``): stored with the rollout
   and never recomputed when it is replayed.
3. The importance ratio is taken against the STORED behaviour log-prob of the policy that
   generated the rollout (``RolloutBatch.behaviour_logp_BxC``), which may be several policy
   versions old when the rollout is replayed. It is never recomputed with "old" weights, so the
   ratio also corrects for staleness, and the clip bounds how far a replayed sample can push.
4. Asymmetric clipping ``clip(ratio, 1 - eps_low, 1 + eps_high)``; defaults 0.2 / 0.2 reproduce
   the symmetric PPO clip (DAPO's "clip-higher" uses e.g. eps_high = 0.28).
5. Training batches are drawn per rollout from a buffer, so one batch mixes rollouts from
   different prompt groups and of different ages; a group need not be complete in a batch.
6. Token-level aggregation by default. ``agg`` selects how per-token terms become a scalar:
   - ``"token_mean"`` (default, DAPO): sum over all valid tokens of the batch / their number;
     every token weighs the same, long sequences weigh more.
   - ``"seq_mean"`` (original GRPO): mean over each sequence's valid tokens, then mean over the
     sequences that have any; every sequence weighs the same.
   - ``"seq_sum_norm"`` (Dr.GRPO): sum over valid tokens / (B * norm_len), with ``norm_len`` a
     constant such as max_new_tokens; no per-sequence length normalisation bias.
   Each mode is a sum over rows divided by a normaliser of the whole batch
   (``agg_denominator``). The losses take that normaliser as ``denom``, so a micro-batch of
   rows, given the whole batch's ``denom``, contributes exactly its share of the batch loss and
   the micro-batch losses (and gradients) add up to the full-batch ones.
7. A single gradient step per batch: no inner PPO epochs over the same batch (reuse comes from
   the buffer instead).
8. Optional truncated importance sampling (TIS), off by default (``tis_cap=None``), as the peers
   define it (``tis_form="truncated_is"``; TRL ``vllm_importance_sampling_mode=token_truncate`` /
   ``sequence_truncate``, verl ``rollout_correction.rollout_is=token`` / ``sequence``): with a
   cap ``c > 0`` the surrogate's ratio is taken against pi_old, the weights this step starts
   from, and multiplied by the DETACHED truncated weight of pi_old against the behaviour policy::

       objective_t = w_t * min(u_t A, clip(u_t, 1 - eps_low, 1 + eps_high) A)
       u_t = pi_theta / pi_old
       w_t = min(pi_old / mu, c)                        (tis_level="token")
       w   = min(exp(sum_t log(pi_old / mu)), c)        ("sequence": one weight per completion)
       w   = min(exp(mean_t log(pi_old / mu)), c)       ("geometric": AReaL's sequence level)

   One optimizer step per batch (item 7) makes pi_old the current weights at the forward, so
   ``log pi_old = sg(log pi_theta)``: u = 1 in value (the clip never binds), no extra forward is
   needed, and the gradient of a token is ``w_t A grad log pi_theta``: the importance-weighted
   policy gradient, each weight truncated at c (biased, bounded variance, as in V-trace).
   Worked example (1 token, r = pi_theta / mu = 0.5, A = +1, c = 2): w = 0.5, u = 1, loss
   -0.5, d loss / d logp = -0.5, TRL's numbers. It equals ``proximal="recompute"`` (whose
   extra forward computes the same pi_old) with the weight truncated.
   ``tis_form="ratio_reweight"`` is the form this project shipped before: the clipped surrogate
   of r = pi_theta / mu times ``min(r, c)``, so the ratio enters twice and a token's gradient
   where the clip does not bind is ``min(r, c) * r * A`` (the example: -0.25, -0.25); a
   variance-reducing reweighting, not an importance correction. verl's bypass mode leaves the
   weight out under its ppo_clip loss to avoid exactly this double count.
   When to use it: heavily replayed, stale rollouts (large buffer capacity N, high reuse
   y = B/R, infrequent weight sync), where ratios drift far from 1; with fresh on-policy
   rollouts every weight is 1 and the loss equals the plain GRPO loss (clip included, since
   then mu = pi_old). Stats ``tis_weight_mean`` / ``tis_weight_min`` / ``tis_weight_max`` and
   ``tis_capped_frac`` (valid tokens whose weight was truncated at ``c``) are added when it is
   on.
9. Optional dual clip (``clip_ratio_c=None``: off; Ye et al. 2020, arXiv 1912.09729; verl's
   ``clip_ratio_c``, AReaL's ``c_clip``, TRL's ``delta``): a token with A < 0 contributes at
   most ``c |A|`` to the loss, ``objective = max(min(u A, clip(u) A), c A)``. Without it a ratio
   blown up on a bad token keeps the unbounded gradient ``u |A|`` (1 token, A = -1, u = e^2,
   c = 3: loss 3.0 and gradient 0 instead of 7.389 and 7.389). Stat ``dual_clip_frac``.

Everything here is a pure function: tensors in, ``(loss, detached stats)`` out; no config reads.
Padding (``mask False``) may hold arbitrary garbage (0, -inf, nan); it is replaced before any
arithmetic so it reaches neither the loss, the gradients, nor the stats. ``grpo_loss`` is
registered as ``algo=grpo`` at the end of this module (``replay_exp.algo.registry``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from replay_exp.algo.registry import LossInputs, register_loss
from replay_exp.config.schemas import DualClipAlgoConfig, GrpoConfig

AGG_MODES = ("token_mean", "seq_mean", "seq_sum_norm")
TIS_LEVELS = ("token", "sequence", "geometric")
TIS_FORMS = ("truncated_is", "ratio_reweight")

_ENTROPY_CHUNK_ROWS = 8  # rows of (C, V) processed at once by the no-grad entropy


def token_logprobs(
    logits_BxCxV: Tensor, ids_BxC: Tensor, temperature: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Log-prob of ``ids`` and per-token entropy under ``softmax(logits / temperature)``.

    Returns ``(logp_BxC, entropy_BxC)``, float32. ``logp_BxC`` is differentiable w.r.t. the
    logits; ``entropy_BxC`` is a detached statistic (computed without autograd, in row chunks,
    so it never materialises another full BxCxV tensor).

    Memory: besides the input, one float32 BxCxV tensor (the log-softmax) is kept alive; the
    temperature-scaled copy (only if ``temperature != 1`` or the input is not float32) is freed
    as soon as the log-softmax exists, since log_softmax's backward needs only its output.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if logits_BxCxV.shape[:-1] != ids_BxC.shape:
        raise ValueError(
            f"logits {tuple(logits_BxCxV.shape)} and ids {tuple(ids_BxC.shape)} disagree on (B, C)"
        )
    z_BxCxV = logits_BxCxV.float()
    if temperature != 1.0:
        z_BxCxV = z_BxCxV / temperature
    logp_all_BxCxV = torch.log_softmax(z_BxCxV, dim=-1)
    del z_BxCxV
    logp_BxC = logp_all_BxCxV.gather(-1, ids_BxC.long().unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy_BxC = torch.empty(ids_BxC.shape, dtype=torch.float32, device=ids_BxC.device)
        for i in range(0, ids_BxC.shape[0], _ENTROPY_CHUNK_ROWS):
            lp = logp_all_BxCxV[i : i + _ENTROPY_CHUNK_ROWS]
            # -sum p log p; clamping -inf to the smallest float makes p * log p = 0 * finite = 0
            lp_finite = lp.clamp(min=torch.finfo(lp.dtype).min)
            entropy_BxC[i : i + _ENTROPY_CHUNK_ROWS] = -(lp.exp() * lp_finite).sum(-1)
    return logp_BxC, entropy_BxC


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is True (optionally along ``dim``).

    Masked-out entries may hold anything (nan, inf); they are replaced by 0 before summing.
    An empty selection gives 0, not nan.
    """
    mask = mask.bool()
    x_sel = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if dim is None:
        return x_sel.sum() / mask.sum().clamp(min=1)
    return x_sel.sum(dim) / mask.sum(dim).clamp(min=1)


def agg_denominator(mask_BxC: Tensor, mode: str, norm_len: int | None = None) -> Tensor:
    """The normaliser ``aggregate`` divides by (module docstring, item 6), a float32 0-dim tensor.

    ``"token_mean"``: the number of valid tokens; ``"seq_mean"``: the number of rows with at
    least one valid token; ``"seq_sum_norm"``: ``B * norm_len`` (``norm_len`` required). At least
    1, so an empty batch aggregates to 0, not nan.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; valid modes are {AGG_MODES}")
    mask_BxC = mask_BxC.bool()
    if mode == "token_mean":
        count = mask_BxC.sum()
    elif mode == "seq_mean":
        count = mask_BxC.any(dim=1).sum()
    else:
        if norm_len is None or norm_len <= 0:
            raise ValueError(
                f"aggregation 'seq_sum_norm' needs a positive norm_len, got {norm_len}"
            )
        count = torch.tensor(mask_BxC.shape[0] * norm_len, device=mask_BxC.device)
    return count.clamp(min=1).float()


def aggregate(
    loss_BxC: Tensor,
    mask_BxC: Tensor,
    mode: str,
    norm_len: int | None = None,
    denom: Tensor | float | None = None,
) -> Tensor:
    """Reduce per-token terms to a scalar over valid tokens (see module docstring, item 6).

    ``"token_mean"``: sum of valid tokens / number of valid tokens in the batch.
    ``"seq_mean"``: per-sequence mean over its valid tokens, then the mean over sequences with at
    least one valid token (an empty row has no mean and is left out).
    ``"seq_sum_norm"``: sum of valid tokens / (B * ``norm_len``); ``norm_len`` is required.
    Rows or batches with no valid tokens contribute 0, never nan.

    The numerator (sum of valid tokens, or of row means for ``"seq_mean"``) is a sum over rows;
    the normaliser is ``denom`` if given, else ``agg_denominator`` of this batch. Pass the
    whole batch's ``agg_denominator`` when ``loss_BxC`` holds only some of its rows.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; valid modes are {AGG_MODES}")
    mask_BxC = mask_BxC.bool()
    if denom is None:
        denom = agg_denominator(mask_BxC, mode, norm_len)
    if mode == "seq_mean":
        total = masked_mean(loss_BxC, mask_BxC, dim=1).sum()  # an empty row's mean is 0
    else:
        zero = torch.zeros((), dtype=loss_BxC.dtype, device=loss_BxC.device)
        total = torch.where(mask_BxC, loss_BxC, zero).sum()
    return total / denom


def tis_weight(
    log_ratio_BxC: Tensor, mask_BxC: Tensor, cap: float, level: str
) -> tuple[Tensor, Tensor]:
    """Detached truncated importance weight (module docstring, item 8) and where it truncated.

    ``log_ratio_BxC`` is ``log pi_theta - log pi_behaviour`` per token. Returns ``(w_BxC,
    truncated_BxC)``: ``w = min(ratio_t, cap)`` (``level="token"``), ``min(exp(sum of the
    row's valid log-ratios), cap)`` broadcast over the row (``level="sequence"``) or the same
    with their mean (``"geometric"``), and a bool tensor, True where the untruncated weight
    exceeded ``cap``. Padding positions are never
    read; their weight is meaningless (the aggregation masks them).
    """
    if not cap > 0:
        raise ValueError(f"tis cap must be > 0, got {cap}")
    if level not in TIS_LEVELS:
        raise ValueError(f"unknown tis level {level!r}; valid levels are {TIS_LEVELS}")
    with torch.no_grad():
        mask_BxC = mask_BxC.bool()
        zero = torch.zeros((), dtype=torch.float32, device=log_ratio_BxC.device)
        log_ratio_BxC = torch.where(mask_BxC, log_ratio_BxC.detach().float(), zero)
        if level != "token":
            log_w_Bx1 = log_ratio_BxC.sum(dim=1, keepdim=True)
            if level == "geometric":
                log_w_Bx1 = log_w_Bx1 / mask_BxC.sum(dim=1, keepdim=True).clamp(min=1)
            log_ratio_BxC = log_w_Bx1.expand_as(mask_BxC)
        raw_BxC = torch.exp(log_ratio_BxC)
        return raw_BxC.clamp(max=cap), raw_BxC > cap


def _masked_min_max(x_BxC: Tensor, mask_BxC: Tensor) -> tuple[Tensor, Tensor]:
    """Min and max of ``x`` over valid positions; 1.0 and 1.0 if there are none."""
    one = torch.ones((), dtype=torch.float32, device=x_BxC.device)
    if mask_BxC.numel() == 0:  # e.g. C = 0 after RolloutBatch.trimmed() of empty rows
        return one, one
    has_valid = mask_BxC.any()
    lo = torch.where(has_valid, torch.where(mask_BxC, x_BxC, torch.inf).min(), one)
    hi = torch.where(has_valid, torch.where(mask_BxC, x_BxC, -torch.inf).max(), one)
    return lo, hi


def clipped_tokens(
    ratio_BxC: Tensor, adv_Bx1: Tensor, eps_low: float, eps_high: float
) -> tuple[Tensor, Tensor]:
    """Where the clip zeroes a token's gradient: (ratio < 1 - eps_low with A < 0, ratio >
    1 + eps_high with A > 0); there the clipped term is the smaller one and is constant."""
    return (ratio_BxC < 1.0 - eps_low) & (adv_Bx1 < 0), (ratio_BxC > 1.0 + eps_high) & (adv_Bx1 > 0)


def ratio_stats(log_ratio_BxC: Tensor, mask_BxC: Tensor) -> dict[str, Tensor]:
    """Detached staleness statistics of ``ratio = exp(log_ratio)`` over valid tokens.

    ``ratio_mean`` / ``ratio_min`` / ``ratio_max`` (1.0 if there are no valid tokens) and
    ``approx_kl``: token mean of ``(ratio - 1) - log(ratio)``, the k3 estimate of
    KL(behaviour || current). Values are 0-dim tensors (stacked into floats by the caller).
    Padding must already be replaced by 0 in ``log_ratio_BxC``.
    """
    with torch.no_grad():
        mask_BxC = mask_BxC.bool()
        log_ratio = log_ratio_BxC.detach()
        ratio = torch.exp(log_ratio)
        one = torch.ones((), dtype=torch.float32, device=ratio.device)
        ratio_min, ratio_max = _masked_min_max(ratio, mask_BxC)
        return {
            "ratio_mean": torch.where(mask_BxC.any(), masked_mean(ratio, mask_BxC), one),
            "ratio_min": ratio_min,
            "ratio_max": ratio_max,
            "approx_kl": masked_mean((ratio - 1.0) - log_ratio, mask_BxC),
        }


def kl_k3(
    logp_BxC: Tensor,
    ref_logp_BxC: Tensor,
    mask_BxC: Tensor,
    agg: str = "token_mean",
    norm_len: int | None = None,
    denom: Tensor | float | None = None,
) -> Tensor:
    """Aggregated k3 estimate of KL(pi_theta || pi_ref): ``exp(d) - d - 1``, ``d = ref - logp``.

    Differentiable w.r.t. ``logp_BxC`` only (the reference is a constant). Padding in either
    input may hold garbage; it is replaced by 0 before any arithmetic (k3 = 0 there).
    """
    mask_BxC = mask_BxC.bool()
    zero = torch.zeros((), dtype=torch.float32, device=logp_BxC.device)
    logp_BxC = torch.where(mask_BxC, logp_BxC.float(), zero)
    ref_BxC = torch.where(mask_BxC, ref_logp_BxC.detach().float(), zero)
    d_BxC = ref_BxC - logp_BxC
    k3_BxC = torch.exp(d_BxC) - d_BxC - 1.0
    return aggregate(k3_BxC, mask_BxC, agg, norm_len, denom)


def prepare(
    logp_BxC: Tensor,
    behaviour_logp_BxC: Tensor,
    advantage_B: Tensor,
    mask_BxC: Tensor,
    kl_coef: float = 0.0,
    ref_logp_BxC: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Check the shapes every ratio loss shares and return ``(mask, logp, behaviour, adv_Bx1)``:
    bool mask, float32 log-probs with padding replaced by 0 (``behaviour`` detached), the
    detached advantage as a column.

    Padding is replaced BEFORE any arithmetic: exp(garbage) = inf would turn into 0 * inf = nan
    in the backward pass even if the forward masked it out afterwards.
    """
    if logp_BxC.shape != behaviour_logp_BxC.shape or logp_BxC.shape != mask_BxC.shape:
        raise ValueError(
            f"shape mismatch: logp {tuple(logp_BxC.shape)}, behaviour_logp "
            f"{tuple(behaviour_logp_BxC.shape)}, mask {tuple(mask_BxC.shape)}"
        )
    if advantage_B.shape != logp_BxC.shape[:1]:
        raise ValueError(
            f"advantage_B {tuple(advantage_B.shape)} must be (B,) with B={logp_BxC.shape[0]}"
        )
    if kl_coef > 0 and ref_logp_BxC is None:
        raise ValueError(f"kl_coef={kl_coef} > 0 needs ref_logp_BxC (reference-policy log-probs)")
    mask_BxC = mask_BxC.bool()
    zero = torch.zeros((), dtype=torch.float32, device=logp_BxC.device)
    logp_BxC = torch.where(mask_BxC, logp_BxC.float(), zero)
    behaviour_BxC = torch.where(mask_BxC, behaviour_logp_BxC.detach().float(), zero)
    return mask_BxC, logp_BxC, behaviour_BxC, advantage_B.detach().float().unsqueeze(1)


def weight_stats(w_BxC: Tensor, truncated_BxC: Tensor, mask_BxC: Tensor) -> dict[str, Tensor]:
    """``tis_weight_mean`` / ``_min`` / ``_max`` (1.0 without valid tokens) and
    ``tis_capped_frac`` of a detached per-token weight over valid tokens."""
    one = torch.ones((), dtype=torch.float32, device=w_BxC.device)
    w_min, w_max = _masked_min_max(w_BxC, mask_BxC)
    return {
        "tis_weight_mean": torch.where(mask_BxC.any(), masked_mean(w_BxC, mask_BxC), one),
        "tis_weight_min": w_min,
        "tis_weight_max": w_max,
        "tis_capped_frac": masked_mean(truncated_BxC.float(), mask_BxC),
    }


def grpo_loss(
    logp_BxC: Tensor,
    behaviour_logp_BxC: Tensor,
    advantage_B: Tensor,
    mask_BxC: Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    agg: str = "token_mean",
    norm_len: int | None = None,
    kl_coef: float = 0.0,
    ref_logp_BxC: Tensor | None = None,
    tis_cap: float | None = None,
    tis_level: str = "token",
    tis_form: str = "truncated_is",
    clip_ratio_c: float | None = None,
    prox_logp_BxC: Tensor | None = None,
    denom: Tensor | float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped GRPO surrogate loss (to minimise) and detached stats over valid tokens.

    ``ratio = exp(logp - behaviour_logp)``; per token the objective is
    ``w * min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)`` and
    ``loss = -aggregate(objective) + kl_coef * aggregate(k3)`` with
    ``k3 = exp(ref - logp) - (ref - logp) - 1`` (only when ``kl_coef > 0``). ``w`` is 1 unless
    ``tis_cap`` is set; then (module docstring, item 8) it is the detached truncated weight of
    ``tis_weight`` (``tis_level`` "token", "sequence" or "geometric") and, with
    ``tis_form="truncated_is"`` (the default), the clip's ratio is taken against
    ``pi_old = sg(pi_theta)`` instead of ``mu`` (so it is 1 in value); ``"ratio_reweight"``
    keeps it against ``mu``. ``clip_ratio_c``: dual clip (item 9), A < 0 tokens' objective is
    at least ``c A``.

    Decoupled PPO (``prox_logp_BxC`` given; Hilton et al. 2022, "Batch size-invariance for
    policy optimization"; AReaL's decoupled loss): the clip is taken against the proximal
    policy instead of the behaviour policy, ``u = exp(logp - prox_logp)`` replaces ``ratio``
    inside the min, and ``w`` is the detached behaviour weight ``pi_prox / mu`` (token level,
    or ``exp(sum_t log(pi_prox / mu))`` per sequence with ``tis_level="sequence"``),
    truncated at ``tis_cap`` when it is set, untruncated otherwise (so under decoupled PPO
    ``tis_cap`` caps ``pi_prox / mu``, not ``pi_theta / mu``). ``prox_logp_BxC`` is a constant.
    With ``prox_logp = behaviour_logp`` the weight is 1 (or ``min(1, tis_cap)``) and this is
    exactly plain GRPO without TIS.

    Gradients flow only into ``logp_BxC``; behaviour/ref/prox log-probs and advantages are
    constants. ``denom`` is the aggregation normaliser (``agg_denominator``; None: this batch's
    own). A micro-batch given the whole batch's ``denom`` returns its share of the batch loss
    (and of ``pg_loss`` / ``kl_ref``); its other stats are of its own rows.

    Stats (python floats): ``pg_loss`` (the policy-gradient part of the loss), ``clip_frac``
    (valid tokens whose gradient the clip zeroes: ``clip_frac_low`` = ratio < 1 - eps_low with
    A < 0, plus ``clip_frac_high`` = ratio > 1 + eps_high with A > 0; the ratio is ``u`` under
    decoupled PPO), ``ratio_mean`` / ``ratio_min`` / ``ratio_max`` (of pi_theta / mu; 1.0 if
    there are no valid tokens), ``approx_kl`` (token mean of ``(ratio - 1) - log(ratio)``, the
    k3 estimate of KL(behaviour || current)), when ``kl_coef > 0``, ``kl_ref`` (the aggregated
    k3 term, so loss = pg_loss + kl_coef * kl_ref) and, when ``tis_cap`` is set or under
    decoupled PPO, ``tis_weight_mean`` / ``tis_weight_min`` / ``tis_weight_max`` and
    ``tis_capped_frac`` (valid tokens whose weight was truncated at the cap), and with the dual
    clip ``dual_clip_frac`` (valid tokens with A < 0 whose ratio exceeded ``clip_ratio_c``).
    """
    if eps_low < 0 or eps_high < 0:
        raise ValueError(f"clip eps must be >= 0, got eps_low={eps_low}, eps_high={eps_high}")
    if tis_level not in TIS_LEVELS:
        raise ValueError(f"unknown tis level {tis_level!r}; valid levels are {TIS_LEVELS}")
    if tis_cap is not None and not tis_cap > 0:
        raise ValueError(f"tis cap must be > 0, got {tis_cap}")
    if tis_form not in TIS_FORMS:
        raise ValueError(f"unknown tis form {tis_form!r}; valid forms are {TIS_FORMS}")
    if clip_ratio_c is not None and not clip_ratio_c > 1:
        raise ValueError(f"dual clip needs clip_ratio_c > 1, got {clip_ratio_c}")
    if prox_logp_BxC is not None and prox_logp_BxC.shape != logp_BxC.shape:
        raise ValueError(
            f"shape mismatch: logp {tuple(logp_BxC.shape)}, prox_logp {tuple(prox_logp_BxC.shape)}"
        )
    mask_BxC, logp_BxC, behaviour_BxC, adv_Bx1 = prepare(
        logp_BxC, behaviour_logp_BxC, advantage_B, mask_BxC, kl_coef, ref_logp_BxC
    )
    log_ratio_BxC = logp_BxC - behaviour_BxC
    weighted = tis_cap is not None or prox_logp_BxC is not None
    if prox_logp_BxC is None:
        anchor_BxC = behaviour_BxC
        if tis_cap is not None:  # w = min(pi_old / mu, c) with pi_old = sg(pi_theta)
            w_BxC, trunc_BxC = tis_weight(log_ratio_BxC, mask_BxC, tis_cap, tis_level)
            if tis_form == "truncated_is":  # the clip against pi_old: u = 1 in value
                anchor_BxC = logp_BxC.detach()
    else:
        zero = torch.zeros((), dtype=torch.float32, device=logp_BxC.device)
        anchor_BxC = torch.where(mask_BxC, prox_logp_BxC.detach().float(), zero)
        cap = math.inf if tis_cap is None else tis_cap
        w_BxC, trunc_BxC = tis_weight(anchor_BxC - behaviour_BxC, mask_BxC, cap, tis_level)
    clip_ratio_BxC = torch.exp(logp_BxC - anchor_BxC)
    unclipped_BxC = clip_ratio_BxC * adv_Bx1
    clipped_BxC = torch.clamp(clip_ratio_BxC, 1.0 - eps_low, 1.0 + eps_high) * adv_Bx1
    objective_BxC = torch.minimum(unclipped_BxC, clipped_BxC)
    objective_BxC, dual_BxC = dual_clip(objective_BxC, clip_ratio_BxC, adv_Bx1, clip_ratio_c)
    if weighted:
        objective_BxC = objective_BxC * w_BxC
    pg_loss = -aggregate(objective_BxC, mask_BxC, agg, norm_len, denom)
    loss, kl_ref = with_kl_penalty(
        pg_loss, logp_BxC, ref_logp_BxC, mask_BxC, kl_coef, agg, norm_len, denom
    )

    with torch.no_grad():
        low_BxC, high_BxC = clipped_tokens(clip_ratio_BxC.detach(), adv_Bx1, eps_low, eps_high)
        low_BxC, high_BxC = low_BxC & mask_BxC, high_BxC & mask_BxC
        values = {
            "pg_loss": pg_loss.detach(),
            "clip_frac": masked_mean((low_BxC | high_BxC).float(), mask_BxC),
            "clip_frac_low": masked_mean(low_BxC.float(), mask_BxC),
            "clip_frac_high": masked_mean(high_BxC.float(), mask_BxC),
            **ratio_stats(log_ratio_BxC, mask_BxC),
        }
        if dual_BxC is not None:
            values["dual_clip_frac"] = masked_mean(dual_BxC.float(), mask_BxC)
        if kl_ref is not None:
            values["kl_ref"] = kl_ref.detach()
        if weighted:
            values.update(weight_stats(w_BxC, trunc_BxC, mask_BxC))
    return loss, stats_to_floats(values)


def dual_clip(
    objective: Tensor, ratio: Tensor, adv: Tensor, clip_ratio_c: float | None
) -> tuple[Tensor, Tensor | None]:
    """Dual-clip PPO (module docstring, item 9) on a clipped objective ``min(u A, clip(u) A)``
    of the ratio ``u`` (shapes broadcast: per token, or per row for GSPO): where A < 0 the
    objective becomes ``max(objective, c A)``. Returns it and where the dual clip binds (A < 0
    and u > c: there ``min(u A, clip(u) A) = A max(u, 1 - eps_low) < c A``, and the term is
    the constant ``c A``); ``(objective, None)`` unchanged when ``clip_ratio_c`` is None."""
    if clip_ratio_c is None:
        return objective, None
    negative = adv < 0
    bound = negative & (ratio.detach() > clip_ratio_c)
    return torch.where(negative, torch.maximum(objective, clip_ratio_c * adv), objective), bound


def with_kl_penalty(
    pg_loss: Tensor,
    logp_BxC: Tensor,
    ref_logp_BxC: Tensor | None,
    mask_BxC: Tensor,
    kl_coef: float,
    agg: str,
    norm_len: int | None,
    denom: Tensor | float | None = None,
) -> tuple[Tensor, Tensor | None]:
    """``(pg_loss + kl_coef * KL_k3(pi_theta || pi_ref), the KL term)``; the KL term is None and
    the loss unchanged when ``kl_coef == 0``."""
    if kl_coef <= 0:
        return pg_loss, None
    if ref_logp_BxC is None:
        raise ValueError(f"kl_coef={kl_coef} > 0 needs ref_logp_BxC (reference-policy log-probs)")
    kl_ref = kl_k3(logp_BxC, ref_logp_BxC, mask_BxC, agg, norm_len, denom)
    return pg_loss + kl_coef * kl_ref, kl_ref


def stats_to_floats(values: dict[str, Tensor]) -> dict[str, float]:
    """0-dim tensors to python floats with one device sync."""
    with torch.no_grad():
        floats = torch.stack([v.float() for v in values.values()]).tolist()
    return dict(zip(values, floats, strict=True))


PROXIMAL_MODES = ("none", "recompute", "loglinear")


def loglinear_proximal(logp_BxC: Tensor, behaviour_logp_BxC: Tensor, lag_B: Tensor) -> Tensor:
    """AReaL's log-linear approximation of the proximal policy's log-probs (detached):
    ``log pi_prox = log mu + alpha (log pi_theta - log mu)`` with
    ``alpha = (v_prox - v_mu) / (v_theta - v_mu)`` (AReaL ``prox_logp_method=loglinear``,
    docs/algorithms/prox_approx.md).

    Our reading of the versions: at step s the weights before the update are version s (the
    proximal policy, one step behind the policy being optimised), the update moves them to
    s + 1 (``v_theta``), and a rollout of version v has lag ``L = s - v``. So
    ``alpha = L / (L + 1)``: a fresh rollout (L = 0) gets ``pi_prox = mu`` (plain GRPO), a
    stale one a proximal policy that is the geometric interpolation ``L / (L + 1)`` of the way
    from mu to pi_theta, so the clip ratio ``pi_theta / pi_prox = r^(1 / (L + 1))`` and the
    behaviour weight ``pi_prox / mu = r^(L / (L + 1))``.
    """
    lag = lag_B.detach().to(logp_BxC.device).float().clamp(min=0)
    alpha_Bx1 = (lag / (lag + 1.0)).unsqueeze(1)
    mu = behaviour_logp_BxC.detach().float()
    return mu + alpha_Bx1 * (logp_BxC.detach().float() - mu)


def check_grpo(algo: GrpoConfig) -> str | None:
    """The first problem of ``algo=grpo``'s own knobs (TIS, the proximal policy), or None."""
    if algo.tis_level not in TIS_LEVELS:
        return f"algo.tis_level={algo.tis_level} is unknown; choose one of {sorted(TIS_LEVELS)}"
    if algo.tis_cap is not None and not algo.tis_cap > 0:
        return f"algo.tis_cap={algo.tis_cap} must be > 0 (or null for no truncated IS)"
    if algo.tis_form not in TIS_FORMS:
        return f"algo.tis_form={algo.tis_form} is unknown; choose one of {list(TIS_FORMS)}"
    if algo.proximal not in PROXIMAL_MODES:
        return f"algo.proximal={algo.proximal} is unknown; choose one of {list(PROXIMAL_MODES)}"
    if algo.tis_form == "ratio_reweight" and algo.proximal != "none":
        return (
            f"algo.tis_form=ratio_reweight weights the ratio against mu, which "
            f"algo.proximal={algo.proximal} replaces; use algo.tis_form=truncated_is"
        )
    return check_dual_clip(algo)


def check_dual_clip(algo: DualClipAlgoConfig) -> str | None:
    """``algo.clip_ratio_c`` is null or > 1 (below 1 it would cap a ratio the clip keeps)."""
    if algo.clip_ratio_c is not None and not algo.clip_ratio_c > 1:
        return f"algo.clip_ratio_c={algo.clip_ratio_c} must be > 1 (or null for no dual clip)"
    return None


@register_loss("grpo", schema=GrpoConfig, check=check_grpo)
def algo_grpo(x: LossInputs, algo: GrpoConfig) -> tuple[Tensor, dict[str, float]]:
    """``algo=grpo``: :func:`grpo_loss` with truncated IS (``algo.tis_cap`` / ``tis_level`` /
    ``tis_form``), the dual clip (``algo.clip_ratio_c``) and, under decoupled PPO
    (``algo.proximal``), the proximal log-probs the update computed."""
    return grpo_loss(
        x.logp_BxC, x.behaviour_logp_BxC, x.advantage_B, x.mask_BxC, eps_low=algo.eps_low,
        eps_high=algo.eps_high, tis_cap=algo.tis_cap, tis_level=algo.tis_level,
        tis_form=algo.tis_form, clip_ratio_c=algo.clip_ratio_c, prox_logp_BxC=x.prox_logp_BxC,
        **x.common(),
    )  # fmt: skip
