"""Sharded buffer (``buffer.shards`` = T > 1): T independent buffers behind one interface.

The paper's async cluster has T trainers pulling from their own buffers. Here:
- each shard is a full ``PolicyBuffer`` (same eviction and sampling policy) of capacity N/T,
  with its own random stream (``SeedSequence(seed).spawn(T)``);
- ``add`` deals the arrivals to the shards by whole prompt group, round-robin: the groups
  (runs of equal ``group_id``, in arrival order) go to shards c, c+1, ... (mod T), and the
  cursor c carries over to the next add, so shards receive the same number of groups to
  within one;
- ``sample(B, step)`` draws B/T from each shard (B must be a multiple of T) and concatenates
  them in shard order. A shard with fewer than B/T rollouts gives all it has, an empty shard
  nothing, so the batch can be smaller than B; ``EmptyBufferError`` only if all are empty;
- ``stats``/``telemetry`` are those of the union (sizes, counters and histograms add up; the
  last batch is the union of the shards' parts).
"""

from __future__ import annotations

import numpy as np
import torch

from replay_exp.buffer.base import EmptyBufferError, ReplayBuffer
from replay_exp.buffer.replay import PolicyBuffer, collect_stats, collect_telemetry
from replay_exp.types import RolloutBatch


class ShardedBuffer(ReplayBuffer):
    def __init__(self, shards: list[PolicyBuffer]):
        self.shards = shards
        self.cursor = 0  # shard that receives the next prompt group

    def add(self, rollouts: RolloutBatch, step: int) -> None:
        T = len(self.shards)
        gid = rollouts.group_id_B.numpy()
        if len(gid) == 0:
            return
        group = np.cumsum(np.r_[True, gid[1:] != gid[:-1]]) - 1  # group index of each row
        shard = (self.cursor + group) % T
        for i, buf in enumerate(self.shards):
            rows = np.flatnonzero(shard == i)
            if len(rows):
                buf.add(rollouts.index(torch.from_numpy(rows)), step)
        self.cursor = int((self.cursor + group[-1] + 1) % T)

    def sample(self, batch_size: int, step: int) -> RolloutBatch:
        T = len(self.shards)
        if batch_size <= 0 or batch_size % T:
            raise ValueError(f"batch_size={batch_size} must be a positive multiple of {T} shards")
        parts = []
        for buf in self.shards:
            try:
                parts.append(buf.sample(batch_size // T, step))
            except EmptyBufferError:
                continue
        if not parts:
            raise EmptyBufferError(f"sample() on an empty buffer ({T} empty shards)")
        return RolloutBatch.cat(parts)

    def __len__(self) -> int:
        return sum(len(b) for b in self.shards)

    def newest_version(self) -> int:
        return max(b.newest_version() for b in self.shards)

    def stats(self) -> dict[str, float]:
        return collect_stats(self.shards)

    def telemetry(self) -> dict[str, list[int]]:
        return collect_telemetry(self.shards)

    def nbytes(self) -> int:
        return sum(b.nbytes() for b in self.shards)

    def state_dict(self) -> dict:
        return {"cursor": self.cursor, "shards": [b.state_dict() for b in self.shards]}

    def load_state_dict(self, state: dict) -> None:
        if len(state["shards"]) != len(self.shards):
            raise ValueError(
                f"state has {len(state['shards'])} shards, this buffer {len(self.shards)}"
            )
        self.cursor = int(state["cursor"])
        for b, s in zip(self.shards, state["shards"], strict=True):
            b.load_state_dict(s)
