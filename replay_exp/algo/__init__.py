"""Pure loss / advantage math for GRPO with experience replay (tensors in, (loss, stats) out)."""

from replay_exp.algo.advantages import group_advantages
from replay_exp.algo.asymre import asymre_loss
from replay_exp.algo.grpo import (
    AGG_MODES,
    TIS_LEVELS,
    agg_denominator,
    aggregate,
    grpo_loss,
    kl_k3,
    masked_mean,
    ratio_stats,
    tis_weight,
    token_logprobs,
)

# Values of ``algo.name``: the loss ``replay_exp.update.policy_update`` dispatches to.
ALGO_NAMES = ("asymre", "grpo")

__all__ = [
    "AGG_MODES",
    "ALGO_NAMES",
    "TIS_LEVELS",
    "agg_denominator",
    "aggregate",
    "asymre_loss",
    "group_advantages",
    "grpo_loss",
    "kl_k3",
    "masked_mean",
    "ratio_stats",
    "tis_weight",
    "token_logprobs",
]
