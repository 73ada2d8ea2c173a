"""The replay-buffer seam and the compact row storage every buffer shares.

``ReplayBuffer`` is the whole interface the training loop sees: ``add`` the rollouts generated
at a step, ``sample`` a training batch at that step, ``len``, ``stats`` and
``state_dict``/``load_state_dict``. Buffers are sibling modules implementing it; the loop never
special-cases one.

``RolloutStore`` keeps rollouts as a ring of fixed-width rows (no per-rollout or per-token
Python objects): token ids as int32, behaviour log-probs as float32, per-row lengths instead of
masks, and per-row metadata (reward, advantage, version, created_step, group_id, uid) plus
per-use telemetry (uses, last_used_step). Rows are kept in insertion (generation) order:
logical row 0 is the oldest. Memory is allocated lazily and grows by doubling up to capacity.

Costs: ``append`` of R rows is O(R) (+ amortised growth), ``gather`` of B rows is O(B);
``stats`` is the only O(N) call (it is called once per logged step).

Conventions shared by all buffers:
- ``step`` is the current training step; in the synchronous loop the policy version at step t
  is t, so ``step - version`` is the version lag.
- age of a rollout at a use = ``step - created_step`` (0 when trained on at the step that
  generated it).
"""

from __future__ import annotations

import abc
import math

import numpy as np
import torch

from replay_exp.types import RolloutBatch

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


class EmptyBufferError(RuntimeError):
    """``sample`` was called on a buffer that holds no rollout."""


class ReplayBuffer(abc.ABC):
    """What the training loop sees of a buffer. Implementations are sibling modules."""

    @abc.abstractmethod
    def add(self, rollouts: RolloutBatch, step: int) -> None:
        """Store the rollouts generated at training step ``step``."""

    @abc.abstractmethod
    def sample(self, batch_size: int, step: int) -> RolloutBatch:
        """A training batch for step ``step`` (records per-use telemetry)."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """Number of rollouts currently stored."""

    @abc.abstractmethod
    def stats(self) -> dict[str, float]:
        """Unprefixed scalar statistics (the trainer prefixes ``buffer/``)."""

    @abc.abstractmethod
    def state_dict(self) -> dict:
        """Everything needed to resume, in ``torch.load(weights_only=True)``-safe types."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Restore from ``state_dict()``."""


# Per-row arrays of the store: name -> dtype; the _WIDE ones have P or C columns.
_ROW_FIELDS: dict[str, torch.dtype] = {
    "prompt_ids": torch.int32,  # [A, P] left-padded (real tokens in the last prompt_len cols)
    "completion_ids": torch.int32,  # [A, C] right-padded
    "behaviour_logp": torch.float32,  # [A, C]
    "prompt_len": torch.int32,
    "completion_len": torch.int32,
    "reward": torch.float32,
    "advantage": torch.float32,
    "version": torch.int64,
    "created_step": torch.int64,
    "group_id": torch.int64,
    "uid": torch.int64,
    "uses": torch.int64,  # times sampled so far
    "last_used_step": torch.int64,  # -1 if never sampled
}
_WIDE = {"prompt_ids": "P", "completion_ids": "C", "behaviour_logp": "C"}
_COUNTERS = ("added_total", "evicted_total", "evicted_unused_total", "sampled_total")
_BATCH_STATS = (
    "batch_age_mean",
    "batch_age_max",
    "batch_version_lag_mean",
    "batch_version_lag_max",
    "batch_prev_uses_mean",
    "batch_frac_fresh",
)


class RolloutStore:
    """A ring of at most ``capacity`` fixed-width rows, oldest first, evicting the oldest.

    Logical index i (0 = oldest stored row) lives at physical slot ``(start + i) % allocated``.
    Rows wider than (max_prompt_len, max_completion_len) raise ``ValueError``.
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
        self._start = 0
        self._size = 0
        self._rows: dict[str, torch.Tensor] = self._alloc(0)
        self.counters = dict.fromkeys(_COUNTERS, 0)
        self.last_batch: dict[str, float] = dict.fromkeys(_BATCH_STATS, math.nan)

    # ---------------------------------------------------------------- storage
    def __len__(self) -> int:
        return self._size

    @property
    def allocated(self) -> int:
        return self._rows["uid"].shape[0]

    def _alloc(self, n: int) -> dict[str, torch.Tensor]:
        widths = {"P": self.P, "C": self.C}
        return {
            name: torch.zeros((n, widths[_WIDE[name]]) if name in _WIDE else (n,), dtype=dtype)
            for name, dtype in _ROW_FIELDS.items()
        }

    def _phys(self, logical: torch.Tensor) -> torch.Tensor:
        return (logical + self._start) % max(self.allocated, 1)

    def _logical_order(
        self, names: tuple[str, ...] = tuple(_ROW_FIELDS), copy: bool = False
    ) -> dict[str, torch.Tensor]:
        """Fields ``names`` of the stored rows oldest first: views when contiguous in memory
        (unless ``copy``), else fresh tensors. O(N)."""
        a, s, n = self.allocated, self._start, self._size
        rows = {k: self._rows[k] for k in names}
        if s + n <= a:
            return {k: v[s : s + n].clone() if copy else v[s : s + n] for k, v in rows.items()}
        return {k: torch.cat([v[s:], v[: s + n - a]]) for k, v in rows.items()}

    def _grow(self, needed: int) -> None:
        """Reallocate for ``needed`` rows (doubling, capped at capacity); O(1)/row amortised."""
        new = min(self.capacity, max(needed, 2 * self.allocated, 16))
        rows = self._alloc(new)
        for k, v in self._logical_order().items():
            rows[k][: self._size] = v
        self._rows, self._start = rows, 0

    def _evict_oldest(self, n: int) -> None:
        if n <= 0:
            return
        phys = self._phys(torch.arange(n))
        self.counters["evicted_total"] += n
        self.counters["evicted_unused_total"] += int((self._rows["uses"][phys] == 0).sum())
        self._start = (self._start + n) % self.allocated
        self._size -= n

    def drop_newest(self, n: int) -> None:
        """Remove the ``n`` newest rows (consumed, not evicted: no eviction counters)."""
        if not 0 <= n <= self._size:
            raise ValueError(f"cannot drop {n} rows from a store holding {self._size}")
        self._size -= n

    def append(self, batch: RolloutBatch) -> None:
        """Store ``batch`` as the newest rows, evicting the oldest beyond capacity. O(R)."""
        rows = self._encode(batch)
        n = len(batch)
        self.counters["added_total"] += n
        if n > self.capacity:  # only the newest `capacity` rows of the batch can stay
            dropped = n - self.capacity
            self.counters["evicted_total"] += dropped
            self.counters["evicted_unused_total"] += dropped
            rows = {k: v[dropped:] for k, v in rows.items()}
            n = self.capacity
        if n == 0:
            return
        self._evict_oldest(self._size + n - self.capacity)
        if self._size + n > self.allocated:
            self._grow(self._size + n)
        phys = self._phys(torch.arange(self._size, self._size + n))
        for k, v in rows.items():
            self._rows[k][phys] = v
        self._size += n

    def _encode(self, b: RolloutBatch) -> dict[str, torch.Tensor]:
        """Validate ``b`` and convert it to full-width (P, C) rows with lengths. O(R*(P+C))."""
        R, p, c = len(b), b.prompt_ids_BxP.shape[1], b.completion_ids_BxC.shape[1]
        pmask, cmask = b.prompt_mask_BxP.bool(), b.completion_mask_BxC.bool()
        pl, cl = pmask.sum(dim=1), cmask.sum(dim=1)
        if R and (int(pl.max()) > self.P or int(cl.max()) > self.C):
            raise ValueError(
                f"rollouts of (prompt, completion) length up to ({int(pl.max())}, "
                f"{int(cl.max())}) do not fit the buffer's max_prompt_len={self.P}, "
                f"max_completion_len={self.C}; raise the buffer widths or truncate generation"
            )
        if not torch.equal(pmask, torch.arange(p) >= (p - pl)[:, None]):
            raise ValueError("prompt_mask_BxP must be left-padded (pad columns first, then 1s)")
        if not torch.equal(cmask, torch.arange(c) < cl[:, None]):
            raise ValueError("completion_mask_BxC must be right-padded (1s, then pad columns)")
        for name, ids in (("prompt", b.prompt_ids_BxP), ("completion", b.completion_ids_BxC)):
            if ids.numel() and (int(ids.min()) < _INT32_MIN or int(ids.max()) > _INT32_MAX):
                raise ValueError(f"{name} token ids do not fit in int32")
        # Keep the batch's own values in its padded columns (bit-identical round trip); the
        # columns beyond the batch width are zero (ids) / 0.0 (log-probs).
        prompt = torch.zeros((R, self.P), dtype=torch.int32)
        q = min(p, self.P)
        if q:
            prompt[:, self.P - q :] = b.prompt_ids_BxP[:, p - q :]
        q = min(c, self.C)
        completion = torch.zeros((R, self.C), dtype=torch.int32)
        completion[:, :q] = b.completion_ids_BxC[:, :q]
        logp = torch.zeros((R, self.C), dtype=torch.float32)
        logp[:, :q] = b.behaviour_logp_BxC[:, :q]
        return {
            "prompt_ids": prompt,
            "completion_ids": completion,
            "behaviour_logp": logp,
            "prompt_len": pl.to(torch.int32),
            "completion_len": cl.to(torch.int32),
            "reward": b.reward_B.to(torch.float32),
            "advantage": b.advantage_B.to(torch.float32),
            "version": b.version_B.to(torch.int64),
            "created_step": b.created_step_B.to(torch.int64),
            "group_id": b.group_id_B.to(torch.int64),
            "uid": b.uid_B.to(torch.int64),
            "uses": torch.zeros(R, dtype=torch.int64),
            "last_used_step": torch.full((R,), -1, dtype=torch.int64),
        }

    # ---------------------------------------------------------------- reading
    def gather(self, logical: np.ndarray | torch.Tensor, step: int) -> RolloutBatch:
        """Rows at DISTINCT logical indices, in the given order, as a trimmed RolloutBatch
        (int64 ids, bool masks, fresh tensors). Records one use of each row at ``step``. O(B)."""
        idx = torch.as_tensor(logical, dtype=torch.int64)
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self._size):
            raise IndexError(f"logical indices must lie in [0, {self._size})")
        phys = self._phys(idx)
        r = self._rows
        pl, cl = r["prompt_len"][phys].long(), r["completion_len"][phys].long()
        wp = int(pl.max()) if len(idx) else 0
        wc = int(cl.max()) if len(idx) else 0
        out = RolloutBatch(
            prompt_ids_BxP=r["prompt_ids"][:, self.P - wp :][phys].long(),
            prompt_mask_BxP=torch.arange(wp) >= (wp - pl)[:, None],
            completion_ids_BxC=r["completion_ids"][:, :wc][phys].long(),
            completion_mask_BxC=torch.arange(wc) < cl[:, None],
            behaviour_logp_BxC=r["behaviour_logp"][:, :wc][phys],
            reward_B=r["reward"][phys],
            advantage_B=r["advantage"][phys],
            version_B=r["version"][phys],
            created_step_B=r["created_step"][phys],
            group_id_B=r["group_id"][phys],
            uid_B=r["uid"][phys],
        )
        self._record_use(phys, step)
        return out

    def _record_use(self, phys: torch.Tensor, step: int) -> None:
        r, n = self._rows, len(phys)
        if n == 0:
            return
        age = (step - r["created_step"][phys]).double()
        lag = (step - r["version"][phys]).double()
        self.last_batch = {
            "batch_age_mean": float(age.mean()),
            "batch_age_max": float(age.max()),
            "batch_version_lag_mean": float(lag.mean()),
            "batch_version_lag_max": float(lag.max()),
            "batch_prev_uses_mean": float(r["uses"][phys].double().mean()),
            "batch_frac_fresh": float((age == 0).double().mean()),
        }
        r["uses"][phys] += 1  # indices are distinct, so this adds exactly 1 per row
        r["last_used_step"][phys] = step
        self.counters["sampled_total"] += n

    def stats(self) -> dict[str, float]:
        """Buffer-level and last-batch statistics.

        This is the only O(N) call of the store (a pass over the stored rows' metadata); the
        trainer calls it once per logged step. Aggregates over an empty store are 0.0;
        ``batch_*`` are NaN until the first sample.
        """
        rows = self._logical_order(("uses", "reward"))
        uses, reward = rows["uses"], rows["reward"]
        n = self._size
        out = {
            "size": float(n),
            "capacity": float(self.capacity),
            "uses_mean": float(uses.double().mean()) if n else 0.0,
            "uses_max": float(uses.max()) if n else 0.0,
            "frac_never_used": float((uses == 0).double().mean()) if n else 0.0,
            "frac_correct": float((reward > 0).double().mean()) if n else 0.0,
        }
        out.update({k: float(v) for k, v in self.counters.items()})
        out.update(self.last_batch)
        return out

    # ---------------------------------------------------------------- checkpointing
    def state_dict(self) -> dict:
        """Stored rows oldest first (contiguous copies), sizes and counters. O(N)."""
        return {
            "capacity": self.capacity,
            "max_prompt_len": self.P,
            "max_completion_len": self.C,
            "rows": self._logical_order(copy=True),
            "counters": dict(self.counters),
            "last_batch": dict(self.last_batch),
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
        n = rows["uid"].shape[0]
        self._rows = self._alloc(n)
        for k, v in rows.items():
            self._rows[k][:] = v
        self._start, self._size = 0, n
        self.counters = {k: int(state["counters"][k]) for k in _COUNTERS}
        self.last_batch = {k: float(state["last_batch"][k]) for k in _BATCH_STATS}
