"""``PolicyBuffer``: one store, one eviction policy, one sampling policy, a reuse cap, telemetry.

One step of the buffer (the loop calls ``add`` then ``sample``):

    add(rollouts, step):   write rows -> sampler.on_add -> eviction.on_add -> remove its victims
    sample(B, step):       remove eviction.before_sample victims (max_age)
                           k = min(B, stored); none stored -> EmptyBufferError
                           slots = eviction.select(k) (on_policy) or sampler.sample(k)
                           gather -> record telemetry -> count the use
                           remove rows that reached max_reuse uses (on_policy: 1)

Every removal goes through ``_remove``: it records the rows' lifetime replay counts, counts
them (``evicted_*`` when the eviction policy chose them, ``retired_total`` when they reached
their last allowed use), tells the sampler and the eviction policy, then frees the slots.
The buffer owns a ``numpy.random.Generator(PCG64(seed))``; its state is part of
``state_dict``, so a restored buffer draws the same future batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from replay_exp.buffer.base import EmptyBufferError, Eviction, ReplayBuffer
from replay_exp.buffer.priority import PRIORITIES
from replay_exp.buffer.sampling import Sampler
from replay_exp.buffer.store import RolloutStore
from replay_exp.buffer.telemetry import HISTS, Telemetry, histogram
from replay_exp.types import RolloutBatch

COUNTERS = (
    "added_total",
    "evicted_total",  # removed by the eviction policy (incl. rows dropped on arrival)
    "evicted_unused_total",  # ... of which never sampled
    "retired_total",  # removed after their buffer.max_reuse-th use (on_policy: consumed)
    "sampled_total",
    "dropped_stale_total",  # refused on arrival: more than buffer.max_staleness versions old
)


class PolicyBuffer(ReplayBuffer):
    def __init__(
        self,
        spec,
        eviction: type[Eviction],
        sampler: type[Sampler],
        *,
        capacity: int,
        max_prompt_len: int,
        max_completion_len: int,
        seed: int | np.random.SeedSequence,
    ):
        self.name = f"{spec.name}/{spec.sampling}"
        self.store = RolloutStore(capacity, max_prompt_len, max_completion_len)
        self.eviction = eviction(self.store, spec)
        self.sampler = sampler(self.store, spec)
        self.max_reuse = 1 if self.eviction.consumes else spec.max_reuse
        self.priority_fn = PRIORITIES[spec.priority]
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.tele = Telemetry()
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.max_staleness = spec.max_staleness

    def add(self, rollouts: RolloutBatch, step: int) -> None:
        if self.max_staleness is not None:  # admission: refuse (and count) over-stale rows
            fresh = (step - rollouts.version_B) <= self.max_staleness
            if not bool(fresh.all()):
                self.counters["dropped_stale_total"] += int((~fresh).sum())
                rollouts = rollouts.index(torch.nonzero(fresh).flatten())
        slots = self.store.append(rollouts, self.priority_fn(rollouts))
        self.counters["added_total"] += len(slots)
        self.sampler.on_add(slots, step)
        self._remove(self.eviction.on_add(slots, step), evicted=True)

    def sample(self, batch_size: int, step: int) -> RolloutBatch:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self._remove(self.eviction.before_sample(step), evicted=True)
        n = len(self.store)
        if n == 0:
            raise EmptyBufferError(f"sample() on an empty buffer ({self.name}): add rollouts first")
        k = min(batch_size, n)
        slots = self.eviction.select(k, step)
        if slots is None:
            slots = self.sampler.sample(k, step, self.rng)
        batch = self.store.gather(slots)
        r = self.store.rows
        self.tele.record_uses(
            step, r["version"][slots], r["created_step"][slots], r["uses"][slots],
            r["last_used_step"][slots],
        )  # fmt: skip
        self.store.record_use(slots, step)
        self.counters["sampled_total"] += len(slots)
        self.sampler.on_use(slots)
        if self.max_reuse is not None:
            self._remove(slots[r["uses"][slots] >= self.max_reuse], evicted=False)
        return batch

    def set_capacity(self, capacity: int) -> None:
        """Keep at most ``capacity`` rows from now on (``Eviction.resize``: FIFO only); the
        oldest beyond it are evicted now, and counted as evictions."""
        self._remove(self.eviction.resize(capacity), evicted=True)

    @property
    def capacity(self) -> int:
        """N now: the eviction's when it can change it, else the store's."""
        return getattr(self.eviction, "capacity", self.store.capacity)

    def _remove(self, slots: np.ndarray, evicted: bool) -> None:
        if len(slots) == 0:
            return
        uses = self.store.rows["uses"][slots]
        self.tele.record_departures(uses)
        if evicted:
            self.counters["evicted_total"] += len(slots)
            self.counters["evicted_unused_total"] += int((uses == 0).sum())
        else:
            self.counters["retired_total"] += len(slots)
        self.sampler.on_remove(slots)
        self.eviction.on_remove(slots)
        self.store.free(slots)

    def __len__(self) -> int:
        return len(self.store)

    def newest_version(self) -> int:
        """The policy version of the newest stored rollout (-1 if empty). O(N)."""
        versions = self.store.live_values("version")
        return int(versions.max()) if len(versions) else -1

    def stats(self) -> dict[str, float]:
        return collect_stats([self])

    def telemetry(self) -> dict[str, list[int]]:
        return collect_telemetry([self])

    def nbytes(self) -> int:
        """Bytes of the store's arrays (the bulk of the memory)."""
        return self.store.nbytes()

    def view(self) -> BufferView:
        return BufferView(
            self.store.live_values("uses"), self.store.live_values("reward"),
            self.capacity, dict(self.counters), self.tele,
        )  # fmt: skip

    def state_dict(self) -> dict:
        return {
            "policy": self.name,
            "store": self.store.state_dict(),
            "eviction": self.eviction.state_dict(),
            "sampler": self.sampler.state_dict(),
            "telemetry": self.tele.state_dict(),
            "counters": dict(self.counters),
            "rng": self.rng.bit_generator.state,  # python ints/strings: weights_only-safe
        }

    def load_state_dict(self, state: dict) -> None:
        if state["policy"] != self.name:
            raise ValueError(f"state is for buffer {state['policy']}, this one is {self.name}")
        self.store.load_state_dict(state["store"])  # first: the others read the store
        self.eviction.load_state_dict(state["eviction"])
        self.sampler.load_state_dict(state["sampler"])
        self.tele.load_state_dict(state["telemetry"])
        self.counters = {k: int(state["counters"].get(k, 0)) for k in COUNTERS}
        self.rng.bit_generator.state = state["rng"]


@dataclass
class BufferView:
    """What ``collect_stats`` / ``collect_telemetry`` read of a buffer: uses and rewards of the
    stored rows, capacity, counters, telemetry. Small (O(N) ints): the distributed runtime's
    trainer ranks send theirs to rank 0, which reports the union of the shards."""

    uses: np.ndarray
    reward: np.ndarray
    capacity: int
    counters: dict[str, int]
    tele: Telemetry


def _view(p: PolicyBuffer | BufferView) -> BufferView:
    return p if isinstance(p, BufferView) else p.view()


def collect_stats(parts: list[PolicyBuffer | BufferView]) -> dict[str, float]:
    """The stats of one buffer or of several shards taken together. O(N).

    size / capacity; over the stored rows: uses_mean, uses_max, frac_never_used, frac_correct
    (reward > 0); the counters; ``batch_*`` (last batch) and ``run_*`` (whole run) telemetry.
    Aggregates over an empty buffer are 0.0; ``batch_*`` are NaN until the first sample.
    """
    views = [_view(p) for p in parts]
    uses = np.concatenate([v.uses for v in views])
    reward = np.concatenate([v.reward for v in views])
    n = len(uses)
    out = {
        "size": float(n),
        "capacity": float(sum(v.capacity for v in views)),
        "uses_mean": float(uses.mean()) if n else 0.0,
        "uses_max": float(uses.max()) if n else 0.0,
        "frac_never_used": float((uses == 0).mean()) if n else 0.0,
        "frac_correct": float((reward > 0).mean()) if n else 0.0,
    }
    out.update({k: float(sum(v.counters[k] for v in views)) for k in COUNTERS})
    out.update(Telemetry.merged([v.tele for v in views]).stats())
    return out


def collect_telemetry(parts: list[PolicyBuffer | BufferView]) -> dict[str, list[int]]:
    views = [_view(p) for p in parts]
    t = Telemetry.merged([v.tele for v in views])
    out = {k: t.hist[k].tolist() for k in HISTS}
    live = np.concatenate([v.uses for v in views])
    out["replay_count_live"] = histogram(live).tolist()
    return out
