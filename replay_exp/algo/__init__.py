"""Pure loss / advantage math for GRPO with experience replay (tensors in, (loss, stats) out)."""

from replay_exp.algo.advantages import group_advantages
from replay_exp.algo.grpo import AGG_MODES, aggregate, grpo_loss, masked_mean, token_logprobs

__all__ = [
    "AGG_MODES",
    "aggregate",
    "group_advantages",
    "grpo_loss",
    "masked_mean",
    "token_logprobs",
]
