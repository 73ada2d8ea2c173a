"""The losses by name: ``algo.name`` -> its pure loss function, its typed schema, its checks.

A loss registers itself where it is defined, with one decorator on a small function that
calls the pure loss with the tensors of :class:`LossInputs` and the loss's typed knobs::

    @register_loss("topr", schema=ToprConfig, check=check_topr)
    def algo_topr(x: LossInputs, algo: ToprConfig) -> tuple[Tensor, dict[str, float]]:
        return topr_loss(x.logp_BxC, x.behaviour_logp_BxC, x.reward_B, x.mask_BxC,
                         baseline=algo.topr_baseline, **x.common())

``replay_exp.update`` looks the loss up by ``algo.name`` (:data:`LOSSES`) and calls it;
``resolve()`` (``replay_exp.config.checks``) takes the names from :data:`LOSSES` and runs each
loss's ``check`` on its knobs. The schema (a subclass of ``AlgoConfig`` in
``replay_exp/config/schemas.py``, listed in its ``OPTION_SCHEMAS["algo"]`` so that composing a
config needs no torch) and the YAML ``conf/algo/<name>.yaml`` (its defaults and their
documentation) are the other two places a loss lives; ``register_loss`` refuses a schema that
``OPTION_SCHEMAS`` does not list under the same name.

What stays outside the loss, the same for every loss (``replay_exp.update``): the aggregation
(``algo.loss_agg``, the whole batch's normaliser ``denom``), micro-batching, the k3 KL penalty
(``algo.kl_coef``), the stale-data masks (``algo.mask`` on the losses whose schema is a
``MaskedAlgoConfig``: the dropped tokens leave ``LossInputs.mask_BxC``) and decoupled PPO's
proximal log-probs (``algo.proximal``, on ``GrpoConfig``).

Every module of ``replay_exp.algo`` is imported with the package, so a new loss module
registers itself without a line anywhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, is_dataclass
from types import SimpleNamespace
from typing import Any

from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from replay_exp.config.schemas import OPTION_SCHEMAS, AlgoConfig

LossFn = Callable[["LossInputs", Any], tuple[Tensor, dict[str, float]]]


@dataclass(frozen=True)
class LossInputs:
    """What the update hands every loss: one batch's (or micro-batch's) rows, on the policy's
    device. Padding (``mask_BxC`` False) may hold anything."""

    logp_BxC: Tensor  # log pi_theta of the completion tokens; the only tensor with a gradient
    behaviour_logp_BxC: Tensor  # stored log mu of the policy that generated each row
    advantage_B: Tensor  # frozen at generation (replay_exp.algo.advantages)
    reward_B: Tensor  # the stored reward
    mask_BxC: Tensor  # valid completion tokens, less those algo.mask dropped
    keep_BxC: Tensor | None  # the loss's own whole-batch mask (LossSpec.batch_keep), these rows
    prox_logp_BxC: Tensor | None  # decoupled PPO's log pi_prox (algo.proximal), else None
    agg: str  # algo.loss_agg
    norm_len: int  # the seq_sum_norm length (max_new_tokens)
    kl_coef: float  # algo.kl_coef
    ref_logp_BxC: Tensor | None  # reference-policy log-probs when kl_coef > 0
    denom: Tensor  # the WHOLE batch's aggregation normaliser (replay_exp.algo.agg_denominator)

    def common(self) -> dict[str, Any]:
        """The keyword arguments every pure loss takes: aggregation and the KL penalty."""
        return dict(agg=self.agg, norm_len=self.norm_len, kl_coef=self.kl_coef,
                    ref_logp_BxC=self.ref_logp_BxC, denom=self.denom)  # fmt: skip


@dataclass(frozen=True)
class LossSpec:
    """One registered loss (see :func:`register_loss` for the fields)."""

    name: str
    loss: LossFn
    schema: type
    check: Callable[[Any], str | None] | None = None
    batch_keep: Callable[[Tensor, Tensor, Any], Tensor] | None = None
    weight_clip: bool = False


# algo.name -> its loss. Filled by register_loss as the loss modules are imported.
LOSSES: dict[str, LossSpec] = {}


def register_loss(
    name: str,
    *,
    schema: type,
    check: Callable[[Any], str | None] | None = None,
    batch_keep: Callable[[Tensor, Tensor, Any], Tensor] | None = None,
    weight_clip: bool = False,
) -> Callable[[LossFn], LossFn]:
    """Register the decorated ``fn(x: LossInputs, algo: schema) -> (loss, stats)`` as the loss
    ``algo.name = name``; return ``fn`` unchanged.

    ``schema``: the loss's typed knobs, ``OPTION_SCHEMAS["algo"][name]``. ``check(algo)``: the
    first problem of the loss's own knobs as a one-line message naming keys and values, or
    None (``resolve()`` raises it as a ConfigError). ``batch_keep(log_ratio_BxC, mask_BxC,
    algo)``: a token mask the loss draws over the WHOLE batch (M2PO's budget); the update
    computes it on all rows before the first backward (one no-grad forward first when
    micro-batched), hands each call its rows as ``x.keep_BxC`` and reports ``masked_frac``.
    ``weight_clip``: ``eps_low`` / ``eps_high`` clip a detached weight, not the ratio (CISPO),
    so ``eps_low = 1`` (no lower bound) is allowed.
    """
    listed = OPTION_SCHEMAS["algo"].get(name)
    if listed is not schema:
        raise ValueError(
            f"loss {name}: schema {schema.__name__} is not OPTION_SCHEMAS['algo'][{name!r}] "
            f"({getattr(listed, '__name__', None)}); list it in replay_exp/config/schemas.py"
        )
    if not issubclass(schema, AlgoConfig):
        raise TypeError(f"loss {name}: schema {schema.__name__} must subclass AlgoConfig")

    def register(fn: LossFn) -> LossFn:
        if name in LOSSES:
            raise ValueError(f"loss {name} is registered twice ({LOSSES[name].loss.__module__})")
        LOSSES[name] = LossSpec(name, fn, schema, check, batch_keep, weight_clip)
        return fn

    return register


def get_loss(name: str) -> LossSpec:
    """The loss ``algo.name = name``; a KeyError names the registered ones (``resolve()``
    rejects an unknown name first, so here it is a programming error)."""
    if name not in LOSSES:
        raise KeyError(f"algo.name={name}: no such loss; the losses: {sorted(LOSSES)}")
    return LOSSES[name]


def loss_knobs(algo: Any) -> AlgoConfig:
    """The ``algo`` node (a config node, mapping, namespace or schema instance) as its loss's
    schema instance: exactly the schema's keys, no defaults filled in. A key the schema does
    not have, or lacks, is a ValueError naming it (``resolve()`` refuses both first, with a
    ConfigError); an unknown ``name`` a KeyError (:func:`get_loss`)."""
    if isinstance(algo, AlgoConfig):
        return algo
    if isinstance(algo, DictConfig):
        values = OmegaConf.to_container(algo, resolve=True)
    elif isinstance(algo, Mapping):
        values = dict(algo)
    elif isinstance(algo, SimpleNamespace):
        values = vars(algo)
    elif is_dataclass(algo):
        values = asdict(algo)
    else:
        raise TypeError(f"expected an algo config node, mapping or schema, got {algo!r}")
    spec = get_loss(values.get("name"))
    names = [f.name for f in fields(spec.schema)]
    unknown = sorted(set(values) - set(names))
    missing = [k for k in names if k not in values]
    if unknown or missing:
        raise ValueError(
            f"algo={spec.name} ({spec.schema.__name__}): "
            + "; ".join(
                ([f"no key {', '.join(f'algo.{k}' for k in unknown)}"] if unknown else [])
                + ([f"missing {', '.join(f'algo.{k}' for k in missing)}"] if missing else [])
            )
        )
    return spec.schema(**values)
