"""Replay buffers: an eviction policy x a sampling policy (+ reuse cap, shards), one interface.

``make_buffer(cfg.buffer, capacity=N, ...)`` builds what the ``buffer`` config node describes:
- ``buffer.name``: the eviction policy, one module each (``BUFFERS``): which rollouts stay.
- ``buffer.sampling``: the sampling policy (``SAMPLERS``, sampling.py): which stored rollouts
  form a batch.
- ``buffer.max_reuse``: a rollout leaves after K uses (null = never), with any of the above.
- ``buffer.shards``: T independent buffers of N/T (sharded.py).
The loop only sees ``ReplayBuffer`` (base.py). Adding an eviction policy = one module
implementing ``base.Eviction`` + one line in ``BUFFERS`` (+ a YAML in conf/buffer/); adding a
sampling policy = one ``sampling.Sampler`` + one line in ``SAMPLERS``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from replay_exp.buffer.base import EmptyBufferError, Eviction, ReplayBuffer
from replay_exp.buffer.fifo import FIFO
from replay_exp.buffer.max_age import MaxAge
from replay_exp.buffer.on_policy import OnPolicy
from replay_exp.buffer.positive_bias import PositiveBias
from replay_exp.buffer.priority import PRIORITIES, Priority
from replay_exp.buffer.replay import PolicyBuffer
from replay_exp.buffer.sampling import SAMPLERS, Sampler
from replay_exp.buffer.sharded import ShardedBuffer
from replay_exp.buffer.store import RolloutStore
from replay_exp.config.schemas import BufferConfig, build_node

BUFFERS: dict[str, type[Eviction]] = {
    "on_policy": OnPolicy,  # the paper's baseline: each rollout used once, newest first
    "fifo": FIFO,  # the paper's replay: the N freshest
    "max_age": MaxAge,  # drop rollouts more than buffer.max_age versions old
    "positive_bias": PositiveBias,  # the freshest (1-delta)N + the freshest delta*N correct
    "priority": Priority,  # the N of highest buffer.priority, ties: newer kept
}
# Values of buffer.staleness_policy (with buffer.max_staleness).
STALENESS_POLICIES = ("drop", "wait")


def as_spec(bcfg, **overrides) -> BufferConfig:
    """The buffer option's schema instance (``BufferConfig`` or its per-option subclass) from a
    config node, a mapping or a schema instance; keys not given take their YAML defaults
    (``conf/buffer/<name>.yaml``); ``overrides`` that are not None replace fields (e.g. the
    resolved capacity). An unknown name or a key the option does not have is a ValueError."""
    if dataclasses.is_dataclass(bcfg):
        d = dataclasses.asdict(bcfg)
    elif isinstance(bcfg, Mapping):
        d = dict(bcfg.items())
    else:
        raise TypeError(f"expected a buffer config node, mapping or BufferConfig, got {bcfg!r}")
    d.update({k: v for k, v in overrides.items() if v is not None})
    name = d.pop("name", None)
    if name not in BUFFERS:
        raise ValueError(f"buffer.name={name} is unknown; choose one of {sorted(BUFFERS)}")
    return build_node("buffer", name, name=name, **d)


def check_buffer_config(b) -> str | None:
    """The first problem of the buffer node ``b`` alone (schedule-independent), as a one-line
    message naming keys and values, or None. ``resolve()`` runs it once for the run."""
    name, sampling, N, T, K = b.name, b.sampling, b.capacity, b.shards, b.max_reuse
    if name not in BUFFERS:
        return f"buffer.name={name} is unknown; choose one of {sorted(BUFFERS)}"
    if sampling not in SAMPLERS:
        return f"buffer.sampling={sampling} is unknown; choose one of {sorted(SAMPLERS)}"
    if b.priority not in PRIORITIES:
        return f"buffer.priority={b.priority} is unknown; choose one of {sorted(PRIORITIES)}"
    if N is not None and N <= 0:
        return f"buffer.capacity={N} must be > 0"
    if T is None or T <= 0:
        return f"buffer.shards={T} must be > 0"
    if N is not None and N % T:
        return f"buffer.shards={T} does not divide buffer.capacity={N}"
    if K is not None and K <= 0:
        return f"buffer.max_reuse={K} must be > 0 (null = unlimited)"
    if name == "on_policy" and sampling != "uniform":
        return (
            f"buffer=on_policy hands out the newest rollouts once; it needs "
            f"buffer.sampling=uniform (got buffer.sampling={sampling})"
        )
    if name == "on_policy" and K is not None:
        return f"buffer=on_policy uses each rollout once; buffer.max_reuse={K} must be null"
    # Eviction knobs belong to their option's schema (buffer.delta is not a key of buffer=fifo);
    # the sampling knob recency_tau is shared, so its use is checked here.
    tau = b.recency_tau
    if sampling == "recency" and tau is None:
        return "buffer.recency_tau=null: buffer.sampling=recency needs tau > 0 (steps)"
    if sampling != "recency" and tau is not None:
        return (
            f"buffer.recency_tau={tau} is only used by buffer.sampling=recency (got "
            f"buffer.sampling={sampling}); set it to null"
        )
    if name == "max_age" and b.max_age is None:
        return "buffer.max_age=null: buffer=max_age needs the age limit A (policy versions)"
    if name == "positive_bias" and b.delta is None:
        return "buffer.delta=null: buffer=positive_bias needs delta in [0, 1]"
    if name == "max_age" and b.max_age < 0:
        return f"buffer.max_age={b.max_age} must be >= 0"
    if name == "positive_bias" and not 0 <= b.delta <= 1:
        return f"buffer.delta={b.delta} must be in [0, 1]"
    if sampling == "recency" and not b.recency_tau > 0:
        return f"buffer.recency_tau={b.recency_tau} must be > 0"
    if not (math.isfinite(b.priority_alpha) and b.priority_alpha >= 0):
        return f"buffer.priority_alpha={b.priority_alpha} must be finite and >= 0"
    if b.max_staleness is not None and b.max_staleness < 0:
        return f"buffer.max_staleness={b.max_staleness} must be >= 0 (null = admit everything)"
    if b.staleness_policy not in STALENESS_POLICIES:
        return (
            f"buffer.staleness_policy={b.staleness_policy} is unknown; choose one of "
            f"{list(STALENESS_POLICIES)}"
        )
    if b.staleness_policy == "wait" and b.max_staleness is None:
        return "buffer.staleness_policy=wait needs buffer.max_staleness=k (versions)"
    return None


def make_buffer(
    bcfg,
    *,
    capacity: int | None = None,
    max_prompt_len: int,
    max_completion_len: int,
    seed: int,
) -> ReplayBuffer:
    """Build the buffer described by ``bcfg`` (the ``buffer`` config node, a mapping or a
    BufferConfig; keys not given take their YAML defaults). ``capacity`` (the resolved N,
    ``derived.capacity``) overrides ``bcfg.capacity``; one of them must be set. The values are
    validated once, by ``resolve()`` (``check_buffer_config``); code that builds a buffer from
    its own values can call ``check_buffer_config(as_spec(...))`` first."""
    spec = as_spec(bcfg, capacity=capacity)
    if spec.capacity is None:
        raise ValueError(
            f"buffer.capacity=null: buffer={spec.name} needs the resolved capacity N "
            "(pass capacity=derived.capacity)"
        )
    kw = dict(
        eviction=BUFFERS[spec.name],
        sampler=SAMPLERS[spec.sampling],
        capacity=spec.capacity // spec.shards,
        max_prompt_len=max_prompt_len,
        max_completion_len=max_completion_len,
    )
    if spec.shards == 1:
        return PolicyBuffer(spec, **kw, seed=seed)
    seeds = np.random.SeedSequence(seed).spawn(spec.shards)
    return ShardedBuffer([PolicyBuffer(spec, **kw, seed=s) for s in seeds])


class FIFOBuffer(PolicyBuffer):
    """Shorthand for ``make_buffer({"name": "fifo", ...})``: the paper's replay buffer."""

    def __init__(
        self, capacity: int, max_prompt_len: int, max_completion_len: int, seed: int = 0, **spec
    ):
        spec = as_spec({"name": "fifo", "capacity": capacity, **spec})
        super().__init__(
            spec, FIFO, SAMPLERS[spec.sampling], capacity=capacity,
            max_prompt_len=max_prompt_len, max_completion_len=max_completion_len, seed=seed,
        )  # fmt: skip


class OnPolicyBuffer(PolicyBuffer):
    """Shorthand for ``make_buffer({"name": "on_policy", ...})``: the no-buffer baseline."""

    def __init__(self, capacity: int, max_prompt_len: int, max_completion_len: int, seed: int = 0):
        spec = as_spec({"name": "on_policy", "capacity": capacity})
        super().__init__(
            spec, OnPolicy, SAMPLERS["uniform"], capacity=capacity,
            max_prompt_len=max_prompt_len, max_completion_len=max_completion_len, seed=seed,
        )  # fmt: skip


__all__ = [
    "BUFFERS",
    "SAMPLERS",
    "PRIORITIES",
    "EmptyBufferError",
    "Eviction",
    "FIFOBuffer",
    "OnPolicyBuffer",
    "PolicyBuffer",
    "ReplayBuffer",
    "RolloutStore",
    "Sampler",
    "ShardedBuffer",
    "as_spec",
    "check_buffer_config",
    "make_buffer",
]
