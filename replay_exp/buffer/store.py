"""Compact slot storage for rollouts, and the index structures the policies build on.

``RolloutStore`` keeps each rollout in one fixed-width row addressed by a SLOT id (no
per-rollout or per-token Python object): token ids as int32, behaviour log-probs as float32,
per-row lengths instead of masks, and per-row metadata (reward, advantage, priority, version,
created_step, group_id, uid, an insertion number ``seq``) plus per-use state (uses,
last_used_step). Removing any row frees its slot for a later rollout, so eviction and sampling
policies can drop arbitrary rows. Memory is allocated lazily and grows by doubling; it reaches
capacity + (one add's rollouts) at most, because a policy evicts after the new rows are written.

Index structures, all over slot ids and all O(changed rows) to update:
- ``SlotSet``: a set as a dense array of members plus each member's position (swap-remove),
  so k distinct members are drawn uniformly in O(k).
- ``SlotQueue``: slots in insertion order; pops from either end skip entries that were
  discarded behind its back (lazy deletion), and it compacts itself when mostly stale.

Costs: ``append`` of R rows O(R) (+ amortised growth), ``gather`` of B rows O(B), ``free`` of m
rows O(m). Only ``live_values`` (used by stats) and ``state_dict`` are O(N).
"""

from __future__ import annotations

import numpy as np
import torch

from replay_exp.types import RolloutBatch

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1

# Per-row arrays of the store: name -> dtype; the _WIDE ones have P or C columns.
_ROW_FIELDS: dict[str, type] = {
    "prompt_ids": np.int32,  # [S, P] left-padded (real tokens in the last prompt_len cols)
    "completion_ids": np.int32,  # [S, C] right-padded
    "behaviour_logp": np.float32,  # [S, C]
    "engine_gap": np.float32,  # [S, C]
    "prompt_len": np.int32,
    "completion_len": np.int32,
    "reward": np.float32,
    "group_reward": np.float32,
    "advantage": np.float32,
    "priority": np.float32,  # buffer.priority of the row, computed when it was added
    "version": np.int64,
    "created_step": np.int64,
    "group_id": np.int64,
    "uid": np.int64,
    "seq": np.int64,  # insertion number over the store's life: order and index staleness
    "uses": np.int64,  # times sampled so far
    "last_used_step": np.int64,  # -1 if never sampled
}
_WIDE = {"prompt_ids": "P", "completion_ids": "C", "behaviour_logp": "C", "engine_gap": "C"}


def to_tensor(a: np.ndarray) -> torch.Tensor:
    """A torch copy of ``a`` (state dicts hold tensors: ``torch.load(weights_only=True)``)."""
    return torch.from_numpy(np.array(a, copy=True))


def to_numpy(t: torch.Tensor, dtype=np.int64) -> np.ndarray:
    return np.array(t.numpy(), dtype=dtype, copy=True)


def _grown(a: np.ndarray, n: int, fill) -> np.ndarray:
    """``a`` extended to length >= n (doubling), new entries ``fill``."""
    if len(a) >= n:
        return a
    out = np.full(max(n, 2 * len(a), 16), fill, dtype=a.dtype)
    out[: len(a)] = a
    return out


def swap_remove(dense: np.ndarray, n: int, pos: np.ndarray, slots: np.ndarray) -> int:
    """Remove the distinct members ``slots`` from ``dense[:n]`` (``pos[slot]`` = its index):
    members from the tail fill the holes. O(len(slots)). Returns the new size."""
    m = len(slots)
    if m == 0:
        return n
    p = pos[slots]
    n_new = n - m
    tail_removed = np.zeros(m, dtype=bool)
    tail_removed[p[p >= n_new] - n_new] = True
    holes = p[p < n_new]
    movers = dense[n_new + np.flatnonzero(~tail_removed)]
    dense[holes] = movers
    pos[movers] = holes
    pos[slots] = -1
    return n_new


class SlotSet:
    """A set of slot ids: dense member array + position map. Add/remove O(m), sample O(k)."""

    def __init__(self):
        self.dense = np.zeros(0, dtype=np.int64)
        self.pos = np.zeros(0, dtype=np.int64)
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def members(self) -> np.ndarray:
        """The members, in the set's internal order (a view)."""
        return self.dense[: self.n]

    def contains(self, slots: np.ndarray) -> np.ndarray:
        inside = slots < len(self.pos)
        out = np.zeros(len(slots), dtype=bool)
        out[inside] = self.pos[slots[inside]] >= 0
        return out

    def add(self, slots: np.ndarray) -> None:
        """Add distinct non-members."""
        m = len(slots)
        if m == 0:
            return
        self.pos = _grown(self.pos, int(slots.max()) + 1, -1)
        self.dense = _grown(self.dense, self.n + m, 0)
        self.dense[self.n : self.n + m] = slots
        self.pos[slots] = np.arange(self.n, self.n + m)
        self.n += m

    def remove(self, slots: np.ndarray) -> None:
        """Remove distinct members."""
        self.n = swap_remove(self.dense, self.n, self.pos, slots)

    def discard(self, slots: np.ndarray) -> None:
        """Remove those of the distinct ``slots`` that are members."""
        self.remove(slots[self.contains(slots)])

    def sample(self, k: int, rng: np.random.Generator) -> np.ndarray:
        """k distinct members, uniformly, in random order (0 <= k <= len).

        ``Generator.choice(replace=False)`` (numpy 2.3) uses Floyd's algorithm, O(k), when
        n > 10000 and k <= n/50, else a partial shuffle of arange(n), O(n) with n small."""
        return self.dense[rng.choice(self.n, size=k, replace=False)]

    def state_dict(self) -> dict:
        return {"members": to_tensor(self.members())}

    def load_state_dict(self, state: dict) -> None:
        self.__init__()
        self.add(to_numpy(state["members"]))


class SlotQueue:
    """Slots in insertion order (front = oldest), with O(1) amortised push/pop per slot.

    ``discard`` removes members anywhere in O(m): their entries go stale and are skipped by
    the pops (an entry is live iff ``mark[slot]`` equals the seq it was pushed with).
    ``len`` counts live members only.
    """

    def __init__(self):
        self.slot = np.zeros(0, dtype=np.int64)
        self.seq = np.zeros(0, dtype=np.int64)
        self.head = self.tail = 0
        self.mark = np.zeros(0, dtype=np.int64)  # slot -> seq of its live entry, or -1
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def push(self, slots: np.ndarray, seqs: np.ndarray) -> None:
        m = len(slots)
        if m == 0:
            return
        if self.tail + m > len(self.slot):
            self._compact(m)
        self.slot[self.tail : self.tail + m] = slots
        self.seq[self.tail : self.tail + m] = seqs
        self.tail += m
        self.mark = _grown(self.mark, int(slots.max()) + 1, -1)
        self.mark[slots] = seqs
        self.n += m

    def _compact(self, extra: int) -> None:
        """Drop stale entries and shift to the start; grow so that >= half stays free."""
        s, q = self.slot[self.head : self.tail], self.seq[self.head : self.tail]
        keep = self.mark[s] == q
        s, q = s[keep], q[keep]
        size = max(16, len(self.slot))
        while size < 2 * (len(s) + extra):
            size *= 2
        self.slot = np.zeros(size, dtype=np.int64)
        self.seq = np.zeros(size, dtype=np.int64)
        self.slot[: len(s)], self.seq[: len(s)] = s, q
        self.head, self.tail = 0, len(s)

    def discard(self, slots: np.ndarray) -> None:
        """Forget the members among ``slots`` (non-members are ignored)."""
        slots = slots[slots < len(self.mark)]
        hit = slots[self.mark[slots] >= 0]
        self.mark[hit] = -1
        self.n -= len(hit)

    def pop_front(self, n: int) -> np.ndarray:
        """The ``n`` oldest members (fewer if fewer), oldest first, removed."""
        out: list[np.ndarray] = []
        need = min(n, self.n)
        while need > 0:
            end = min(self.tail, self.head + max(2 * need, 64))
            s, q = self.slot[self.head : end], self.seq[self.head : end]
            live = np.flatnonzero(self.mark[s] == q)
            if len(live) >= need:
                live = live[:need]
                self.head += int(live[-1]) + 1
            else:
                self.head = end
            out.append(s[live])
            need -= len(live)
        return self._taken(out)

    def pop_back(self, n: int) -> np.ndarray:
        """The ``n`` newest members (fewer if fewer), oldest first, removed."""
        out: list[np.ndarray] = []
        need = min(n, self.n)
        while need > 0:
            start = max(self.head, self.tail - max(2 * need, 64))
            s, q = self.slot[start : self.tail], self.seq[start : self.tail]
            live = np.flatnonzero(self.mark[s] == q)
            if len(live) >= need:
                live = live[len(live) - need :]
                self.tail = start + int(live[0])
            else:
                self.tail = start
            out.insert(0, s[live])
            need -= len(live)
        return self._taken(out)

    def _taken(self, parts: list[np.ndarray]) -> np.ndarray:
        slots = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        self.mark[slots] = -1
        self.n -= len(slots)
        return slots

    def members(self) -> np.ndarray:
        """Live members, oldest first. O(entries)."""
        s, q = self.slot[self.head : self.tail], self.seq[self.head : self.tail]
        return s[self.mark[s] == q]

    def state_dict(self) -> dict:
        s = self.members()
        return {"slots": to_tensor(s), "seqs": to_tensor(self.mark[s])}

    def load_state_dict(self, state: dict) -> None:
        self.__init__()
        self.push(to_numpy(state["slots"]), to_numpy(state["seqs"]))


class RolloutStore:
    """At most ``capacity`` rows after each policy decision, addressed by slot ids.

    ``live`` is the SlotSet of stored slots. Rows wider than (max_prompt_len,
    max_completion_len) raise ``ValueError``. The store never evicts by itself: ``append``
    writes (possibly beyond capacity), the policy then ``free``s what must leave.
    """

    def __init__(self, capacity: int, max_prompt_len: int, max_completion_len: int):
        if capacity <= 0 or max_prompt_len <= 0 or max_completion_len <= 0:
            raise ValueError(
                f"need capacity, max_prompt_len and max_completion_len > 0; got "
                f"capacity={capacity}, max_prompt_len={max_prompt_len}, "
                f"max_completion_len={max_completion_len}"
            )
        self.capacity = int(capacity)
        self.P = int(max_prompt_len)
        self.C = int(max_completion_len)
        self.rows: dict[str, np.ndarray] = self._alloc(0)
        self.live = SlotSet()
        self._free = np.zeros(0, dtype=np.int64)  # stack of free slots below _high
        self._n_free = 0
        self._high = 0  # slots [0, _high) have been handed out
        self._next_seq = 0

    # ---------------------------------------------------------------- storage
    def __len__(self) -> int:
        return len(self.live)

    @property
    def allocated(self) -> int:
        return self.rows["uid"].shape[0]

    def nbytes(self) -> int:
        """Bytes held by the row arrays and the live set."""
        return (
            sum(v.nbytes for v in self.rows.values())
            + self.live.dense.nbytes
            + (self.live.pos.nbytes + self._free.nbytes)
        )

    def _alloc(self, n: int) -> dict[str, np.ndarray]:
        widths = {"P": self.P, "C": self.C}
        return {
            name: np.zeros((n, widths[_WIDE[name]]) if name in _WIDE else (n,), dtype=dtype)
            for name, dtype in _ROW_FIELDS.items()
        }

    def _grow(self, needed: int) -> None:
        """Reallocate for ``needed`` slots (doubling, capped at max(capacity, needed))."""
        new = min(max(self.capacity, needed), max(needed, 2 * self.allocated, 16))
        rows = self._alloc(new)
        for k, v in self.rows.items():
            rows[k][: len(v)] = v
        self.rows = rows

    def _take_slots(self, n: int) -> np.ndarray:
        k = min(n, self._n_free)
        reused = self._free[self._n_free - k : self._n_free][::-1].copy()
        self._n_free -= k
        fresh = np.arange(self._high, self._high + n - k, dtype=np.int64)
        self._high += n - k
        if self._high > self.allocated:
            self._grow(self._high)
        return np.concatenate([reused, fresh])

    def append(self, batch: RolloutBatch, priority: np.ndarray | None = None) -> np.ndarray:
        """Write ``batch`` into free slots; returns them in generation (row) order. O(R)."""
        rows = self._encode(batch)
        n = len(batch)
        slots = self._take_slots(n)
        for k, v in rows.items():
            self.rows[k][slots] = v
        self.rows["priority"][slots] = 0.0 if priority is None else priority
        self.rows["seq"][slots] = np.arange(self._next_seq, self._next_seq + n)
        self._next_seq += n
        self.rows["uses"][slots] = 0
        self.rows["last_used_step"][slots] = -1
        self.live.add(slots)
        return slots

    def free(self, slots: np.ndarray) -> None:
        """Remove stored rows ``slots`` (distinct); their slots are reused by later appends."""
        self.live.remove(slots)
        self._free = _grown(self._free, self._n_free + len(slots), 0)
        self._free[self._n_free : self._n_free + len(slots)] = slots
        self._n_free += len(slots)

    def current(self, slots: np.ndarray, seqs: np.ndarray) -> np.ndarray:
        """Whether each slot still holds the row inserted with ``seqs`` (index staleness)."""
        return self.live.contains(slots) & (self.rows["seq"][slots] == seqs)

    def _encode(self, b: RolloutBatch) -> dict[str, np.ndarray]:
        """Validate ``b`` and convert it to full-width (P, C) rows with lengths. O(R*(P+C))."""

        def np_(t: torch.Tensor) -> np.ndarray:
            return t.detach().cpu().numpy()

        R, p, c = len(b), b.prompt_ids_BxP.shape[1], b.completion_ids_BxC.shape[1]
        pmask, cmask = np_(b.prompt_mask_BxP).astype(bool), np_(b.completion_mask_BxC).astype(bool)
        pl, cl = pmask.sum(axis=1), cmask.sum(axis=1)
        if R and (int(pl.max()) > self.P or int(cl.max()) > self.C):
            raise ValueError(
                f"rollouts of (prompt, completion) length up to ({int(pl.max())}, "
                f"{int(cl.max())}) do not fit the buffer's max_prompt_len={self.P}, "
                f"max_completion_len={self.C}; raise the buffer widths or truncate generation"
            )
        if not np.array_equal(pmask, np.arange(p) >= (p - pl)[:, None]):
            raise ValueError("prompt_mask_BxP must be left-padded (pad columns first, then 1s)")
        if not np.array_equal(cmask, np.arange(c) < cl[:, None]):
            raise ValueError("completion_mask_BxC must be right-padded (1s, then pad columns)")
        pids, cids = np_(b.prompt_ids_BxP), np_(b.completion_ids_BxC)
        for name, ids in (("prompt", pids), ("completion", cids)):
            if ids.size and (int(ids.min()) < _INT32_MIN or int(ids.max()) > _INT32_MAX):
                raise ValueError(f"{name} token ids do not fit in int32")
        # Keep the batch's own values in its padded columns (bit-identical round trip); the
        # columns beyond the batch width are zero (ids) / 0.0 (log-probs).
        prompt = np.zeros((R, self.P), dtype=np.int32)
        q = min(p, self.P)
        if q:
            prompt[:, self.P - q :] = pids[:, p - q :]
        q = min(c, self.C)
        completion = np.zeros((R, self.C), dtype=np.int32)
        logp = np.zeros((R, self.C), dtype=np.float32)
        gap = np.zeros((R, self.C), dtype=np.float32)
        if q:
            completion[:, :q] = cids[:, :q]
            logp[:, :q] = np_(b.behaviour_logp_BxC.float())[:, :q]
            gap[:, :q] = np_(b.engine_gap_BxC.float())[:, :q]
        return {
            "prompt_ids": prompt,
            "completion_ids": completion,
            "behaviour_logp": logp,
            "engine_gap": gap,
            "prompt_len": pl,
            "completion_len": cl,
            "reward": np_(b.reward_B.float()),
            "group_reward": np_(b.group_reward_B.float()),
            "advantage": np_(b.advantage_B.float()),
            "version": np_(b.version_B),
            "created_step": np_(b.created_step_B),
            "group_id": np_(b.group_id_B),
            "uid": np_(b.uid_B),
        }

    # ---------------------------------------------------------------- reading
    def gather(self, slots: np.ndarray) -> RolloutBatch:
        """Rows ``slots`` in the given order as a trimmed RolloutBatch (int64 ids, bool masks,
        fresh tensors). Reads only; the caller records the use. O(B)."""
        r = self.rows
        pl = r["prompt_len"][slots].astype(np.int64)
        cl = r["completion_len"][slots].astype(np.int64)
        wp = int(pl.max()) if len(slots) else 0
        wc = int(cl.max()) if len(slots) else 0
        # numpy then torch.from_numpy: ~5x less overhead than torch ops on batch-sized arrays
        t = torch.from_numpy
        return RolloutBatch(
            prompt_ids_BxP=t(r["prompt_ids"][slots, self.P - wp :].astype(np.int64)),
            prompt_mask_BxP=t(np.arange(wp) >= (wp - pl)[:, None]),
            completion_ids_BxC=t(r["completion_ids"][slots, :wc].astype(np.int64)),
            completion_mask_BxC=t(np.arange(wc) < cl[:, None]),
            behaviour_logp_BxC=t(r["behaviour_logp"][slots, :wc]),
            reward_B=t(r["reward"][slots]),
            advantage_B=t(r["advantage"][slots]),
            version_B=t(r["version"][slots]),
            created_step_B=t(r["created_step"][slots]),
            group_id_B=t(r["group_id"][slots]),
            uid_B=t(r["uid"][slots]),
            group_reward_B=t(r["group_reward"][slots]),
            engine_gap_BxC=t(r["engine_gap"][slots, :wc]),
        )

    def record_use(self, slots: np.ndarray, step: int) -> None:
        """One more use of each of the distinct ``slots`` at ``step``."""
        self.rows["uses"][slots] += 1
        self.rows["last_used_step"][slots] = step

    def live_values(self, name: str) -> np.ndarray:
        """Field ``name`` of every stored row (internal order). O(N)."""
        return self.rows[name][self.live.members()]

    # ---------------------------------------------------------------- checkpointing
    def state_dict(self) -> dict:
        """Every handed-out slot's row (live or free), the free stack and the live set. O(N)."""
        h = self._high
        return {
            "capacity": self.capacity,
            "max_prompt_len": self.P,
            "max_completion_len": self.C,
            "high": h,
            "next_seq": self._next_seq,
            "rows": {k: to_tensor(v[:h]) for k, v in self.rows.items()},
            "free": to_tensor(self._free[: self._n_free]),
            "live": self.live.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        got = (state["capacity"], state["max_prompt_len"], state["max_completion_len"])
        want = (self.capacity, self.P, self.C)
        if got != want:
            raise ValueError(
                f"state is for (capacity, max_prompt_len, max_completion_len)={got}, "
                f"this store has {want}"
            )
        rows = state["rows"]
        if set(rows) != set(_ROW_FIELDS):
            raise ValueError(f"state rows {sorted(rows)} != expected {sorted(_ROW_FIELDS)}")
        self._high = int(state["high"])
        self._next_seq = int(state["next_seq"])
        self.rows = self._alloc(self._high)
        for k, v in rows.items():
            self.rows[k][:] = v.numpy()
        self._free = to_numpy(state["free"])
        self._n_free = len(self._free)
        self.live.load_state_dict(state["live"])
