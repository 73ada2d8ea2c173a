"""Priority eviction: keep the N highest-priority rollouts; and the priority functions.

Semantics:
- priority (``buffer.priority``), computed once when a rollout is added and stored with it:
  ``abs_advantage`` = |advantage| (the frozen group-normalised advantage); ``group_reward_var``
  = population variance of the rewards of the rollout's group (the rows sharing its group_id
  in the same ``add``; groups arrive whole), p(1 - p) for binary rewards. Both are 0 for a
  group whose rewards are all equal: no learning signal.
- After each add the lowest-priority rollouts beyond N = ``capacity`` are evicted (a new one
  may be evicted at once); ties are broken by recency: among equal priorities the earliest
  added leaves first (newer kept).
- A min-heap of (priority, insertion number, slot) keys, one Python int each, with lazy
  deletion: add is O(R log N); rows removed for another reason are skipped when popped and
  purged when the heap holds twice the stored rows.
- Sampling is ``buffer.sampling`` (``prioritized`` reuses these priorities); fewer than B
  stored -> all of them.
"""

from __future__ import annotations

import heapq

import numpy as np

from replay_exp.buffer.base import Eviction
from replay_exp.buffer.store import RolloutStore, to_numpy, to_tensor
from replay_exp.types import RolloutBatch

_LOW32 = 0xFFFFFFFF


def abs_advantage(batch: RolloutBatch) -> np.ndarray:
    return np.abs(batch.advantage_B.float().numpy())


def group_reward_var(batch: RolloutBatch) -> np.ndarray:
    g, r = batch.group_id_B.numpy(), batch.reward_B.double().numpy()
    _, inv, cnt = np.unique(g, return_inverse=True, return_counts=True)
    mean = np.bincount(inv, weights=r) / cnt
    var = np.bincount(inv, weights=(r - mean[inv]) ** 2) / cnt
    return var[inv].astype(np.float32)


PRIORITIES = {"abs_advantage": abs_advantage, "group_reward_var": group_reward_var}


def priority_bits(p: np.ndarray) -> np.ndarray:
    """Order-preserving integer codes of non-negative float32 priorities (as int64)."""
    p = (np.maximum(p.astype(np.float32), np.float32(0)) + np.float32(0)).astype(np.float32)
    return p.view(np.uint32).astype(np.int64)


class Priority(Eviction):
    def __init__(self, store: RolloutStore, spec):
        super().__init__(store, spec)
        self.heap: list[int] = []

    def _keys(self, slots: np.ndarray) -> list[int]:
        bits = priority_bits(self.store.rows["priority"][slots]).tolist()
        seqs = (self.store.rows["seq"][slots] & _LOW32).tolist()
        return [
            (b << 64) | (q << 32) | s for b, q, s in zip(bits, seqs, slots.tolist(), strict=False)
        ]

    def _live(self, key: int) -> bool:
        slot, seq = key & _LOW32, (key >> 32) & _LOW32
        s = self.store
        return (
            slot < len(s.live.pos)
            and s.live.pos[slot] >= 0
            and (int(s.rows["seq"][slot]) & _LOW32) == seq
        )

    def on_add(self, slots: np.ndarray, step: int) -> np.ndarray:
        for key in self._keys(slots):
            heapq.heappush(self.heap, key)
        over = len(self.store) - self.store.capacity
        out: list[int] = []
        while len(out) < over:
            key = heapq.heappop(self.heap)
            if self._live(key):
                out.append(key & _LOW32)
        if len(self.heap) > 2 * (len(self.store) - len(out)) + 64:
            gone = set(out)
            self.heap = [k for k in self.heap if (k & _LOW32) not in gone and self._live(k)]
            heapq.heapify(self.heap)
        return np.array(out, dtype=np.int64)

    def state_dict(self) -> dict:
        live = [k for k in self.heap if self._live(k)]
        return {
            "bits": to_tensor(np.array([k >> 64 for k in live], dtype=np.int64)),
            "seqs": to_tensor(np.array([(k >> 32) & _LOW32 for k in live], dtype=np.int64)),
            "slots": to_tensor(np.array([k & _LOW32 for k in live], dtype=np.int64)),
        }

    def load_state_dict(self, state: dict) -> None:
        parts = [to_numpy(state[k]).tolist() for k in ("bits", "seqs", "slots")]
        self.heap = [(b << 64) | (q << 32) | s for b, q, s in zip(*parts, strict=True)]
        heapq.heapify(self.heap)
