"""Pure loss / advantage math for GRPO with experience replay (tensors in, (loss, stats) out)."""

from replay_exp.algo.advantages import group_advantages
from replay_exp.algo.asymre import asymre_loss
from replay_exp.algo.corrections import cispo_loss, gspo_loss, m2po_loss, topr_loss
from replay_exp.algo.grpo import (
    AGG_MODES,
    PROXIMAL_MODES,
    TIS_LEVELS,
    agg_denominator,
    aggregate,
    grpo_loss,
    kl_k3,
    loglinear_proximal,
    masked_mean,
    ratio_stats,
    tis_weight,
    token_logprobs,
)
from replay_exp.algo.masks import MASKS, correction_keep, m2po_keep

# Values of ``algo.name``: the loss ``replay_exp.update.policy_update`` dispatches to.
ALGO_NAMES = ("asymre", "cispo", "grpo", "gspo", "m2po", "topr")

__all__ = [
    "AGG_MODES",
    "ALGO_NAMES",
    "MASKS",
    "PROXIMAL_MODES",
    "TIS_LEVELS",
    "agg_denominator",
    "aggregate",
    "asymre_loss",
    "cispo_loss",
    "correction_keep",
    "group_advantages",
    "grpo_loss",
    "gspo_loss",
    "kl_k3",
    "loglinear_proximal",
    "m2po_keep",
    "m2po_loss",
    "masked_mean",
    "ratio_stats",
    "tis_weight",
    "token_logprobs",
    "topr_loss",
]
