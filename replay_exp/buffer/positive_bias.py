"""Positive-bias eviction (the paper's variant): fresh rollouts plus older CORRECT ones.

Semantics, exactly the paper's definition (delta = ``buffer.delta``, N = ``capacity``):
- The buffer keeps the freshest N_f = N - N_c rollouts plus the freshest N_c = delta*N
  (rounded half up) CORRECT (reward > 0) older rollouts not already kept. delta = 0 is FIFO.
  Example: N = 8, delta = 0.75 keeps the 2 freshest plus the 6 freshest correct older ones.
- Implemented as two insertion-ordered regions: every new rollout enters the fresh region;
  the oldest leaving it move to the correct region if correct, else are evicted; the correct
  region evicts its oldest beyond N_c. Each add is O(R).
- A rollout removed for another reason (``buffer.max_reuse``) frees a place in its region;
  regions refill from later arrivals (nothing moves back from the correct region).
- Sampling is ``buffer.sampling`` over both regions; fewer than B stored -> all of them.
"""

from __future__ import annotations

import math

import numpy as np

from replay_exp.buffer.base import Eviction
from replay_exp.buffer.store import RolloutStore, SlotQueue


def correct_slots(delta: float, capacity: int) -> int:
    """N_c = delta * N rounded half up: the places kept for older correct rollouts."""
    return math.floor(delta * capacity + 0.5)


class PositiveBias(Eviction):
    def __init__(self, store: RolloutStore, spec):
        super().__init__(store, spec)
        self.n_correct = correct_slots(float(spec.delta), store.capacity)
        self.n_fresh = store.capacity - self.n_correct
        self.fresh, self.correct = SlotQueue(), SlotQueue()

    def on_add(self, slots: np.ndarray, step: int) -> np.ndarray:
        seq, reward = self.store.rows["seq"], self.store.rows["reward"]
        self.fresh.push(slots, seq[slots])
        out = self.fresh.pop_front(len(self.fresh) - self.n_fresh)
        good = out[reward[out] > 0]
        self.correct.push(good, seq[good])
        dropped = self.correct.pop_front(len(self.correct) - self.n_correct)
        return np.concatenate([out[reward[out] <= 0], dropped])

    def on_remove(self, slots: np.ndarray) -> None:
        self.fresh.discard(slots)
        self.correct.discard(slots)

    def state_dict(self) -> dict:
        return {"fresh": self.fresh.state_dict(), "correct": self.correct.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.fresh.load_state_dict(state["fresh"])
        self.correct.load_state_dict(state["correct"])
