"""Sampling policies (``buffer.sampling``): which stored rollouts form a batch.

Orthogonal to eviction: a sampler sees only the store's rows and is told of every add, use and
removal. Every sampler returns k DISTINCT stored rollouts (k = min(B, stored), so with fewer
than B stored the batch is all of them) and never removes anything (``buffer.max_reuse`` and
the eviction policy do). Random numbers come from the buffer's own generator.

- ``uniform`` (the paper's default): k distinct rollouts uniformly at random, random order.
  A rollout is reused across steps until evicted. O(B).
- ``without_replacement``: epochs. Every stored rollout is used once before any is used again:
  draws are uniform among the rollouts not yet used in the current epoch (new arrivals join
  it). When fewer than k remain, the batch takes all of them, a new epoch starts, and the rest
  of the batch is drawn from the new epoch excluding those just taken (which stay unused in
  the new epoch). O(B).
- ``never_used_first`` (the paper's "at least once"): never-used rollouts first (uniformly
  among them), the rest of the batch uniformly among the used ones. Never-used rows come
  first in the batch. O(B).
- ``recency``: successive sampling without replacement with weights exp(-age / tau), age =
  step - created_step, tau = ``buffer.recency_tau`` (steps). Rows are bucketed by created_step;
  a draw picks a bucket by its total weight, then a row uniformly: O(#distinct ages + B).
  (If the i.i.d. draws stall, because fewer than B rows hold nearly all the weight, an exact
  one-draw-at-a-time fallback finishes the batch in O(B (#ages + bucket size)).)
- ``prioritized``: successive sampling without replacement with weights priority ** alpha
  (``buffer.priority``, ``buffer.priority_alpha``; alpha = 0 is uniform) through a sum tree,
  O(B log N). Rows of weight 0 (e.g. |advantage| = 0) are drawn only once every positive-weight
  row is in the batch, then uniformly.
"Successive sampling": draw one row with probability proportional to its weight, remove it,
repeat; implemented exactly as the first k distinct rows of i.i.d. weighted draws.
"""

from __future__ import annotations

import abc
import bisect

import numpy as np

from replay_exp.buffer.base import EMPTY
from replay_exp.buffer.store import RolloutStore, SlotSet, _grown, swap_remove, to_numpy, to_tensor


class Sampler(abc.ABC):
    """Picks the slots of a batch. Hooks keep its own index structures in sync."""

    def __init__(self, store: RolloutStore, spec):
        self.store = store

    def on_add(self, slots: np.ndarray, step: int) -> None:
        """``slots`` were just written."""
        return None

    def on_use(self, slots: np.ndarray) -> None:
        """``slots`` were just used once more (the store's ``uses`` already counts it)."""
        return None

    def on_remove(self, slots: np.ndarray) -> None:
        """``slots`` are about to be freed (still readable in the store)."""
        return None

    @abc.abstractmethod
    def sample(self, k: int, step: int, rng: np.random.Generator) -> np.ndarray:
        """k DISTINCT stored slots, 1 <= k <= len(store)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None


def _take_first_distinct(draws: np.ndarray, taken: set[int], out: list[int], k: int) -> None:
    """Append to ``out`` the draws not yet taken, in draw order, until it holds k."""
    for s in draws.tolist():
        if len(out) == k:
            return
        if s not in taken:
            taken.add(s)
            out.append(s)


def _uniform_excluding(
    pool: np.ndarray, m: int, exclude: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """m distinct members of ``pool`` outside ``exclude``, uniformly (m <= what is left)."""
    rest = pool[~np.isin(pool, exclude)] if len(pool) <= 4 * (len(exclude) + m) + 64 else None
    if rest is not None:
        return rest[rng.choice(len(rest), size=m, replace=False)]
    taken, out = set(exclude.tolist()), []
    while len(out) < m:
        _take_first_distinct(pool[rng.integers(0, len(pool), size=2 * m)], taken, out, m)
    return np.array(out, dtype=np.int64)


class Uniform(Sampler):
    def sample(self, k: int, step: int, rng: np.random.Generator) -> np.ndarray:
        return self.store.live.sample(k, rng)


class WithoutReplacement(Sampler):
    def __init__(self, store: RolloutStore, spec):
        super().__init__(store, spec)
        self.pending, self.done = SlotSet(), SlotSet()  # not yet / already used this epoch

    def on_add(self, slots: np.ndarray, step: int) -> None:
        self.pending.add(slots)

    def on_remove(self, slots: np.ndarray) -> None:
        self.pending.discard(slots)
        self.done.discard(slots)

    def sample(self, k: int, step: int, rng: np.random.Generator) -> np.ndarray:
        first = self.pending.sample(min(k, len(self.pending)), rng)
        self.pending.remove(first)
        if len(first) == k:
            self.done.add(first)
            return first
        # The epoch is over: everything becomes unused again, except that this batch cannot
        # repeat `first`, which rejoins the new epoch's unused rows afterwards.
        self.pending, self.done = self.done, self.pending
        rest = self.pending.sample(k - len(first), rng)
        self.pending.remove(rest)
        self.done.add(rest)
        self.pending.add(first)
        return np.concatenate([first, rest])

    def state_dict(self) -> dict:
        return {"pending": self.pending.state_dict(), "done": self.done.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.pending.load_state_dict(state["pending"])
        self.done.load_state_dict(state["done"])


class NeverUsedFirst(Sampler):
    def __init__(self, store: RolloutStore, spec):
        super().__init__(store, spec)
        self.unused, self.used = SlotSet(), SlotSet()

    def on_add(self, slots: np.ndarray, step: int) -> None:
        self.unused.add(slots)

    def on_use(self, slots: np.ndarray) -> None:
        first = slots[self.unused.contains(slots)]
        self.unused.remove(first)
        self.used.add(first)

    def on_remove(self, slots: np.ndarray) -> None:
        self.unused.discard(slots)
        self.used.discard(slots)

    def sample(self, k: int, step: int, rng: np.random.Generator) -> np.ndarray:
        a = min(k, len(self.unused))
        return np.concatenate([self.unused.sample(a, rng), self.used.sample(k - a, rng)])

    def state_dict(self) -> dict:
        return {"unused": self.unused.state_dict(), "used": self.used.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.unused.load_state_dict(state["unused"])
        self.used.load_state_dict(state["used"])


class Recency(Sampler):
    """Buckets: sorted created_step ``keys``, their ``counts`` and member arrays."""

    def __init__(self, store: RolloutStore, spec):
        super().__init__(store, spec)
        self.tau = float(spec.recency_tau)
        self.keys: list[int] = []
        self.counts = np.zeros(0, dtype=np.int64)
        self.members: list[np.ndarray] = []
        self.where = np.zeros(0, dtype=np.int64)  # slot -> index in its bucket

    def _bucket(self, key: int) -> int:
        i = bisect.bisect_left(self.keys, key)
        if i == len(self.keys) or self.keys[i] != key:
            self.keys.insert(i, key)
            self.counts = np.insert(self.counts, i, 0)
            self.members.insert(i, np.zeros(16, dtype=np.int64))
        return i

    def on_add(self, slots: np.ndarray, step: int) -> None:
        self.where = _grown(self.where, int(slots.max()) + 1, -1) if len(slots) else self.where
        cs = self.store.rows["created_step"][slots]
        for key in np.unique(cs).tolist():
            grp = slots[cs == key]
            i = self._bucket(key)
            c = int(self.counts[i])
            self.members[i] = arr = _grown(self.members[i], c + len(grp), 0)
            arr[c : c + len(grp)] = grp
            self.where[grp] = np.arange(c, c + len(grp))
            self.counts[i] += len(grp)

    def on_remove(self, slots: np.ndarray) -> None:
        cs = self.store.rows["created_step"][slots]
        for key in np.unique(cs).tolist():
            i = bisect.bisect_left(self.keys, key)
            self.counts[i] = swap_remove(
                self.members[i], int(self.counts[i]), self.where, slots[cs == key]
            )
            if self.counts[i] == 0:
                del self.keys[i], self.members[i]
                self.counts = np.delete(self.counts, i)

    def _log_weights(self, counts: np.ndarray, step: int) -> np.ndarray:
        age = step - np.array(self.keys, dtype=np.float64)
        with np.errstate(divide="ignore"):
            return np.log(counts.astype(np.float64)) - age / self.tau

    def sample(self, k: int, step: int, rng: np.random.Generator) -> np.ndarray:
        logw = self._log_weights(self.counts, step)
        cdf = np.cumsum(np.exp(logw - logw.max()))
        out: list[int] = []
        taken: set[int] = set()
        for _ in range(8):  # i.i.d. draws; keep the first distinct ones
            m = max(2 * (k - len(out)), 16)
            b = np.minimum(
                np.searchsorted(cdf, rng.random(m) * cdf[-1], side="right"), len(cdf) - 1
            )
            j = rng.integers(0, self.counts[b])
            _take_first_distinct(
                np.array([self.members[x][y] for x, y in zip(b, j, strict=False)]), taken, out, k
            )
            if len(out) == k:
                return np.array(out, dtype=np.int64)
        # Rare (the remaining mass is tiny): continue exactly, one draw at a time.
        chosen = np.array(out, dtype=np.int64)
        left = self.counts.copy()
        created = self.store.rows["created_step"][chosen].tolist()
        np.subtract.at(left, [bisect.bisect_left(self.keys, c) for c in created], 1)
        while len(out) < k:
            logw = self._log_weights(left, step)
            w = np.exp(logw - logw.max())
            i = int(np.searchsorted(np.cumsum(w), rng.random() * w.sum(), side="right"))
            i = min(i, len(w) - 1)
            cand = self.members[i][: self.counts[i]]
            cand = cand[~np.isin(cand, np.array(out, dtype=np.int64))]
            out.append(int(cand[rng.integers(0, len(cand))]))
            left[i] -= 1
        return np.array(out, dtype=np.int64)

    def state_dict(self) -> dict:
        return {
            "keys": to_tensor(np.array(self.keys, dtype=np.int64)),
            "counts": to_tensor(self.counts),
            "members": to_tensor(
                np.concatenate(
                    [m[:c] for m, c in zip(self.members, self.counts, strict=False)] + [EMPTY]
                )
            ),
        }

    def load_state_dict(self, state: dict) -> None:
        self.keys = to_numpy(state["keys"]).tolist()
        self.counts = to_numpy(state["counts"])
        flat = to_numpy(state["members"])
        ends = np.cumsum(self.counts)
        self.members = [flat[e - c : e].copy() for c, e in zip(self.counts, ends, strict=False)]
        self.where = np.full(int(flat.max()) + 1 if len(flat) else 0, -1, dtype=np.int64)
        for m in self.members:
            self.where[m] = np.arange(len(m))


class SumTree:
    """Weights over slots in a binary tree of ``L`` (a power of two) leaves: node i holds the
    sum of its children, always recomputed from them (no drift; zeroing and restoring a leaf
    gives back bit-identical sums). Grows by doubling."""

    def __init__(self):
        self.L = 0
        self.t = np.zeros(0, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self.t[1]) if self.L else 0.0

    def _rebuild(self, L: int, leaves: np.ndarray) -> None:
        self.L = L
        self.t = np.zeros(2 * L, dtype=np.float64)
        self.t[L : L + len(leaves)] = leaves
        w = L // 2
        while w >= 1:
            self.t[w : 2 * w] = self.t[2 * w : 4 * w : 2] + self.t[2 * w + 1 : 4 * w : 2]
            w //= 2

    def set(self, slots: np.ndarray, w: np.ndarray) -> None:
        if len(slots) == 0:
            return
        need = int(slots.max()) + 1
        if need > self.L:
            L = max(16, self.L)
            while need > L:
                L *= 2
            self._rebuild(L, self.t[self.L : 2 * self.L])
        i = slots + self.L
        self.t[i] = w
        while i[0] > 1:  # all of i on one level; duplicates just write the same sum twice
            i = i >> 1
            self.t[i] = self.t[2 * i] + self.t[2 * i + 1]

    def leaf(self, slots: np.ndarray) -> np.ndarray:
        return self.t[slots + self.L]

    def draw(self, m: int, rng: np.random.Generator) -> np.ndarray:
        """m i.i.d. slots with probability weight / total (total must be > 0)."""
        u = rng.random(m) * self.t[1]
        i = np.ones(m, dtype=np.int64)
        while i[0] < self.L:
            left, right = self.t[2 * i], self.t[2 * i + 1]
            go_right = (u >= left) & (right > 0)  # float slack never lands on a 0 subtree
            u = np.where(go_right, u - left, np.minimum(u, np.nextafter(left, 0)))
            i = 2 * i + go_right
        return i - self.L


class Prioritized(Sampler):
    def __init__(self, store: RolloutStore, spec):
        super().__init__(store, spec)
        self.alpha = float(spec.priority_alpha)
        self.tree = SumTree()

    def _weights(self, slots: np.ndarray) -> np.ndarray:
        return np.power(self.store.rows["priority"][slots].astype(np.float64), self.alpha)

    def on_add(self, slots: np.ndarray, step: int) -> None:
        self.tree.set(slots, self._weights(slots))

    def on_remove(self, slots: np.ndarray) -> None:
        self.tree.set(slots, np.zeros(len(slots)))

    def sample(self, k: int, step: int, rng: np.random.Generator) -> np.ndarray:
        out: list[int] = []
        zeroed = EMPTY
        while self.tree.total > 0:
            # i.i.d. draws, first distinct ones kept; before another round the rows taken so
            # far are zeroed, so the rounds continue one i.i.d. sequence that skips them
            _take_first_distinct(self.tree.draw(k - len(out), rng), set(out), out, k)
            if len(out) == k:
                break
            new = np.array(out[len(zeroed) :], dtype=np.int64)
            self.tree.set(new, np.zeros(len(new)))
            zeroed = np.concatenate([zeroed, new])
        self.tree.set(zeroed, self._weights(zeroed))
        chosen = np.array(out, dtype=np.int64)
        if len(out) < k:  # only weight-0 rows are left
            rest = _uniform_excluding(self.store.live.members(), k - len(out), chosen, rng)
            chosen = np.concatenate([chosen, rest])
        return chosen

    def state_dict(self) -> dict:
        return {"leaves": self.tree.L}

    def load_state_dict(self, state: dict) -> None:
        live = self.store.live.members()
        w = np.zeros(int(state["leaves"]))
        w[live] = self._weights(live)
        self.tree._rebuild(int(state["leaves"]), w)


SAMPLERS: dict[str, type[Sampler]] = {
    "uniform": Uniform,  # the paper's default
    "without_replacement": WithoutReplacement,  # epochs: each used once before any reuse
    "never_used_first": NeverUsedFirst,  # the paper's "at least once"
    "recency": Recency,  # weights exp(-age / tau)
    "prioritized": Prioritized,  # weights priority ** alpha
}
