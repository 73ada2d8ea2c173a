"""Synthetic rollouts for the buffer tests (``replay_exp.rollout.synthetic``) and buffer helpers."""

from __future__ import annotations

import pytest
import torch

from replay_exp.rollout.synthetic import random_rollouts, rollout_batch
from replay_exp.types import RolloutBatch

PAD_ID = 7  # a non-zero pad id, so a test can see whether padded columns are preserved


def _rollouts(R: int, step: int, uid_start: int, **kw) -> RolloutBatch:
    """R rollouts generated at ``step`` with uids uid_start..uid_start+R-1
    (``replay_exp.rollout.synthetic.random_rollouts``, padded with PAD_ID)."""
    return random_rollouts(R, step, uid_start, pad_id=PAD_ID, **kw)


@pytest.fixture
def make_rollouts():
    return _rollouts


def _stored_uses(buf) -> dict[int, int]:
    """uid -> uses so far of every rollout stored in ``buf`` (a PolicyBuffer or sharded)."""
    parts = getattr(buf, "shards", [buf])
    out: dict[int, int] = {}
    for p in parts:
        uids, uses = p.store.live_values("uid").tolist(), p.store.live_values("uses").tolist()
        out.update(zip(uids, uses, strict=True))
    return out


@pytest.fixture
def stored_uses():
    return _stored_uses


def _tiny(
    uids: list[int],
    step: int,
    *,
    reward: list[float] | None = None,
    advantage: list[float] | None = None,
    version: list[int] | int | None = None,
    group: list[int] | None = None,
) -> RolloutBatch:
    """One-token rollouts with chosen uids and metadata, for hand-computed expectations.
    Defaults: reward 0, advantage 0, version = step, group = uid."""
    ids = torch.tensor(uids).view(len(uids), 1)
    return rollout_batch(
        ids + 100, ids + 200, reward=reward, advantage=advantage,
        version=step if version is None else version, created_step=step, group=group, uid=uids,
    )  # fmt: skip


@pytest.fixture
def tiny():
    return _tiny


def _build(capacity: int, **spec):
    """make_buffer with one-token widths; ``spec`` are BufferConfig fields (name required)."""
    from replay_exp.buffer import make_buffer

    seed = spec.pop("seed", 0)
    return make_buffer(
        {"capacity": capacity, **spec}, max_prompt_len=8, max_completion_len=8, seed=seed
    )


@pytest.fixture
def build():
    return _build
