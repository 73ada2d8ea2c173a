"""FIFO eviction (the paper's buffer): keep the N freshest rollouts.

Semantics (synchronous loop; each step: generate R, ``add``, then ``sample``):
- The buffer holds the N = ``capacity`` most recently added rollouts; adding beyond N evicts
  the oldest (earliest added) first. A single add of more than N keeps only its last N rows.
- With the default ``buffer.sampling=uniform`` this is the paper's replay: B DISTINCT stored
  rollouts drawn uniformly without removing them, so a rollout is reused until evicted.
  Because ``add`` happens before ``sample`` within a step, a rollout is trainable during
  ceil(N/R) consecutive steps, so sampled ages lie in [0, ceil(N/R) - 1]; in steady state
  each rollout is used B/R times on average (replay ratio y = B/R; horizon x = N/R).
- Rows removed for another reason (``buffer.max_reuse``) simply free their place.
- ``resize(n)`` (a replay controller, ``replay_exp.control``) keeps the n freshest from then
  on, n up to the store's capacity (the largest the controller may set): shrinking evicts the
  oldest at once, growing lets the buffer fill.
"""

from __future__ import annotations

import numpy as np

from replay_exp.buffer.base import Eviction
from replay_exp.buffer.store import RolloutStore, SlotQueue


class FIFO(Eviction):
    def __init__(self, store: RolloutStore, spec):
        super().__init__(store, spec)
        self.queue = SlotQueue()  # insertion order, front = oldest
        self.capacity = store.capacity  # N now (resize); the store's is the most it may be

    def on_add(self, slots: np.ndarray, step: int) -> np.ndarray:
        self.queue.push(slots, self.store.rows["seq"][slots])
        return self.queue.pop_front(len(self.store) - self.capacity)

    def resize(self, capacity: int) -> np.ndarray:
        if not 0 < capacity <= self.store.capacity:
            raise ValueError(f"capacity {capacity} is not in [1, {self.store.capacity}]")
        self.capacity = int(capacity)
        return self.queue.pop_front(len(self.store) - self.capacity)

    def on_remove(self, slots: np.ndarray) -> None:
        self.queue.discard(slots)

    def state_dict(self) -> dict:
        return {"queue": self.queue.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.queue.load_state_dict(state["queue"])
