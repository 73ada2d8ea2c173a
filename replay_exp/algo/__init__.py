"""Pure loss / advantage math for GRPO with experience replay (tensors in, (loss, stats) out).

The losses register themselves by name (``replay_exp.algo.registry``): ``LOSSES[algo.name]``
holds each loss with its typed schema and its checks; ``replay_exp.update`` looks the loss up
there. Every module of this package is imported below, so a loss module added to the folder
registers itself with no line here.
"""

import importlib
import pkgutil

from replay_exp.algo.advantages import STD_MODES, group_advantages
from replay_exp.algo.asymre import asymre_loss
from replay_exp.algo.corrections import cispo_loss, gspo_loss, m2po_loss, topr_loss
from replay_exp.algo.grpo import (
    AGG_MODES,
    PROXIMAL_MODES,
    TIS_FORMS,
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
from replay_exp.algo.registry import LOSSES, LossInputs, get_loss, loss_knobs, register_loss

for _module in pkgutil.iter_modules(__path__):  # each loss module registers its losses
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "AGG_MODES",
    "LOSSES",
    "MASKS",
    "PROXIMAL_MODES",
    "STD_MODES",
    "TIS_FORMS",
    "TIS_LEVELS",
    "LossInputs",
    "agg_denominator",
    "aggregate",
    "asymre_loss",
    "cispo_loss",
    "correction_keep",
    "get_loss",
    "group_advantages",
    "grpo_loss",
    "gspo_loss",
    "kl_k3",
    "loglinear_proximal",
    "loss_knobs",
    "m2po_keep",
    "m2po_loss",
    "masked_mean",
    "ratio_stats",
    "register_loss",
    "tis_weight",
    "token_logprobs",
    "topr_loss",
]
