"""The replay-buffer seam, and the small internal interface every eviction policy implements.

``ReplayBuffer`` is the whole interface the training loop sees: ``add`` the rollouts generated
at a step, ``sample`` a training batch at that step, ``len``, ``stats``, ``telemetry`` and
``state_dict``/``load_state_dict``. The loop never special-cases a buffer.

Inside the package a buffer is a composition (``replay.PolicyBuffer``): a ``RolloutStore`` of
slots, one ``Eviction`` policy (which rows stay; ``buffer.name``), one ``Sampler`` (which
stored rows form a batch; ``buffer.sampling``), an optional reuse cap (``buffer.max_reuse``)
and ``Telemetry``. ``buffer.shards`` > 1 wraps T of them (``sharded.ShardedBuffer``).

Conventions shared by all buffers:
- ``step`` is the current training step; in the synchronous loop the policy version at step t
  is t, so ``step - version`` is the version lag (off-policiness).
- age of a rollout at a use = ``step - created_step`` (0 when trained on at the step that
  generated it).
- ``sample(B, step)`` returns DISTINCT rollouts; with fewer than B stored (after the policy's
  own evictions at that step) it returns all of them, a smaller batch; with none it raises
  ``EmptyBufferError``.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import numpy as np

from replay_exp.buffer.store import RolloutStore
from replay_exp.types import RolloutBatch


class EmptyBufferError(RuntimeError):
    """``sample`` was called on a buffer that holds no rollout."""


class ReplayBuffer(abc.ABC):
    """What the training loop sees of a buffer."""

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
        """Unprefixed scalar statistics (the trainer prefixes ``buffer/``). O(N)."""

    @abc.abstractmethod
    def telemetry(self) -> dict[str, list[int]]:
        """Cumulative integer histograms over the run (bins 0..63 + one overflow bin):
        ``off_policiness``, ``age``, ``prev_uses``, ``steps_since_last_use`` (per use; first
        uses excluded), ``replay_count`` (per rollout, when it left the buffer) and
        ``replay_count_live`` (uses so far of the rollouts still stored). O(N)."""

    @abc.abstractmethod
    def state_dict(self) -> dict:
        """Everything needed to resume, in ``torch.load(weights_only=True)``-safe types."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Restore from ``state_dict()``."""


EMPTY = np.zeros(0, dtype=np.int64)


class Eviction(abc.ABC):
    """Which stored rows leave (``buffer.name``). One instance per store.

    The buffer calls ``on_add`` after writing new rows and ``before_sample`` before drawing;
    both return the slots to evict, which the buffer then removes (calling ``on_remove`` on
    every removal, including rows removed for another reason: reuse cap, consumption). Index
    structures must be O(changed rows) to update.
    """

    consumes: ClassVar[bool] = False  # rows leave after their first use (on_policy)

    def __init__(self, store: RolloutStore, spec):
        self.store = store

    @abc.abstractmethod
    def on_add(self, slots: np.ndarray, step: int) -> np.ndarray:
        """``slots`` were just written (generation order). Returns the slots to evict."""

    def before_sample(self, step: int) -> np.ndarray:
        """Slots to evict before drawing the batch of ``step``."""
        return EMPTY

    def on_remove(self, slots: np.ndarray) -> None:
        """``slots`` are about to be freed (still readable in the store)."""
        return None

    def resize(self, capacity: int) -> np.ndarray:
        """Keep at most ``capacity`` (<= the store's) rows from now on (a replay controller
        sets it, ``replay_exp.control``). Returns the slots to evict now. Only policies that
        can change their capacity implement it (FIFO)."""
        raise NotImplementedError(f"{type(self).__name__} cannot change its capacity")

    def select(self, k: int, step: int) -> np.ndarray | None:
        """The batch, if this policy dictates it (on_policy); None defers to the sampler."""
        return None

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None
