"""Max-age eviction: drop rollouts more than A policy versions old, and beyond capacity.

Semantics:
- A = ``buffer.max_age``. A rollout is evicted as soon as ``step - version > A`` at an ``add``
  or ``sample`` of step ``step`` (version = the generating policy's version), so every sampled
  rollout has off-policiness ``step - version`` in [0, A]. Versions need not arrive in order.
- It also keeps at most N = ``capacity`` rollouts, evicting the earliest added first (FIFO).
  ``resolve()`` sets N = ceil((A + 1) R / T) T when ``buffer.capacity`` is null: in the
  synchronous loop at most A + 1 steps' rollouts can be young enough, so the cap never binds.
- Sampling is ``buffer.sampling`` over what is stored; fewer than B stored -> all of them.
"""

from __future__ import annotations

import heapq

import numpy as np

from replay_exp.buffer.base import EMPTY, Eviction
from replay_exp.buffer.store import RolloutStore, SlotQueue, to_numpy, to_tensor


class MaxAge(Eviction):
    def __init__(self, store: RolloutStore, spec):
        super().__init__(store, spec)
        self.max_age = int(spec.max_age)
        self.queue = SlotQueue()  # insertion order, for the capacity
        # version -> [(slots, seqs)] in insertion order; entries of rows removed by other means
        # stay until their version expires or a compaction filters them (order-preserving)
        self.buckets: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        self.versions: list[int] = []  # min-heap of the bucket keys
        self.n_entries = 0

    def _push(self, slots: np.ndarray, seqs: np.ndarray) -> None:
        ver = self.store.rows["version"][slots]
        for v in np.unique(ver).tolist():
            m = ver == v
            if v not in self.buckets:
                self.buckets[v] = []
                heapq.heappush(self.versions, v)
            self.buckets[v].append((slots[m], seqs[m]))
        self.n_entries += len(slots)

    def _expired(self, step: int) -> np.ndarray:
        out = []
        while self.versions and step - self.versions[0] > self.max_age:
            for s, q in self.buckets.pop(heapq.heappop(self.versions)):
                out.append(s[self.store.current(s, q)])
                self.n_entries -= len(s)
        old = np.concatenate(out) if out else EMPTY
        self.queue.discard(old)
        return old

    def on_add(self, slots: np.ndarray, step: int) -> np.ndarray:
        seqs = self.store.rows["seq"][slots]
        self.queue.push(slots, seqs)
        self._push(slots, seqs)
        old = self._expired(step)
        over = self.queue.pop_front(len(self.store) - len(old) - self.store.capacity)
        if self.n_entries > 2 * len(self.store) + 64:
            self._compact()
        return np.concatenate([old, over])

    def before_sample(self, step: int) -> np.ndarray:
        return self._expired(step)

    def on_remove(self, slots: np.ndarray) -> None:
        self.queue.discard(slots)

    def _filtered(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Each bucket without the entries of removed rows, in order. O(entries)."""
        out = {}
        for v, parts in self.buckets.items():
            s = np.concatenate([p[0] for p in parts])
            q = np.concatenate([p[1] for p in parts])
            keep = self.store.current(s, q)
            out[v] = (s[keep], q[keep])
        return out

    def _compact(self) -> None:
        self.buckets = {v: [sq] for v, sq in self._filtered().items()}
        self.n_entries = sum(len(p[0][0]) for p in self.buckets.values())

    def state_dict(self) -> dict:
        b = self._filtered()
        return {
            "queue": self.queue.state_dict(),
            "versions": to_tensor(np.array(list(b), dtype=np.int64)),
            "counts": to_tensor(np.array([len(s) for s, _ in b.values()], dtype=np.int64)),
            "slots": to_tensor(np.concatenate([s for s, _ in b.values()] + [EMPTY])),
            "seqs": to_tensor(np.concatenate([q for _, q in b.values()] + [EMPTY])),
        }

    def load_state_dict(self, state: dict) -> None:
        self.queue.load_state_dict(state["queue"])
        vs, counts = to_numpy(state["versions"]), to_numpy(state["counts"])
        slots, seqs = to_numpy(state["slots"]), to_numpy(state["seqs"])
        ends = np.cumsum(counts)
        self.buckets = {
            int(v): [(slots[e - c : e], seqs[e - c : e])]
            for v, c, e in zip(vs, counts, ends, strict=True)
        }
        self.versions = [int(v) for v in vs]
        heapq.heapify(self.versions)
        self.n_entries = len(slots)
