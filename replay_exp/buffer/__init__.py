"""Replay buffers: sibling policies behind ``ReplayBuffer`` (see base.py), picked by name.

Adding a policy = one module implementing ``ReplayBuffer`` + one line in ``BUFFERS``.
"""

from __future__ import annotations

from replay_exp.buffer.base import EmptyBufferError, ReplayBuffer, RolloutStore
from replay_exp.buffer.fifo import FIFOBuffer
from replay_exp.buffer.on_policy import OnPolicyBuffer

BUFFERS: dict[str, type[ReplayBuffer]] = {
    "on_policy": OnPolicyBuffer,  # the paper's baseline: each rollout used once, newest first
    "fifo": FIFOBuffer,  # the paper's replay: N freshest, uniform sampling without removal
}


def make_buffer(
    name: str, *, capacity: int, max_prompt_len: int, max_completion_len: int, seed: int
) -> ReplayBuffer:
    """Build buffer ``name``. Every policy takes the same constructor arguments; ``seed`` is
    ignored by policies that draw no random numbers."""
    if name not in BUFFERS:
        raise ValueError(f"unknown buffer {name!r}; valid names: {sorted(BUFFERS)}")
    return BUFFERS[name](
        capacity=capacity,
        max_prompt_len=max_prompt_len,
        max_completion_len=max_completion_len,
        seed=seed,
    )


__all__ = [
    "BUFFERS",
    "EmptyBufferError",
    "FIFOBuffer",
    "OnPolicyBuffer",
    "ReplayBuffer",
    "RolloutStore",
    "make_buffer",
]
