"""What the one loop (``replay_exp.train.train``) asks of a runtime: where the step's fresh
rollouts come from, and what is shared between trainer processes.

Two runtimes implement it:

- ``InProcess`` (``runtime=inprocess``, ``replay_exp.runtime.inprocess``): the loop generates
  its own rollouts (R per step under the sync schedule, the emulated cluster's deterministic
  arrivals under async); nothing is shared (one process).
- ``TrainerRank`` (``runtime=distributed``, ``replay_exp.runtime.trainer``): the rollouts are
  what W generator ranks delivered to this trainer's inbox; gradients are all-reduced (DDP) or
  sharded (FSDP), and ledgers, buffer views and the snapshot are gathered on trainer rank 0.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from replay_exp.compute.ledger import Ledger
from replay_exp.types import RolloutBatch


@dataclass
class Arrival:
    """Fresh rollouts for this step: scored, advantages frozen, with the seconds their
    generation took and any statistics of their making (``generation/*``)."""

    batch: RolloutBatch
    seconds: float
    stats: dict[str, float] = field(default_factory=dict)


class Runtime(Protocol):
    # (step, first_eval, last_eval) of the snapshot every component was restored from; None
    # for a fresh run.
    resumed: tuple[int, dict | None, dict] | None
    # Whether ``take(step, wait=True)`` blocks for deliveries (the generator ranks of
    # runtime=distributed); in process the arrivals of a step are fixed, nothing to wait for.
    can_wait: bool

    def take(self, step: int, wait: bool) -> list[Arrival]:
        """The rollouts that arrived for ``step`` (``wait``: the buffer is empty, so return
        at least one unless the step must stop)."""

    def stop_now(self, step: int) -> bool:
        """Whether every trainer stops at ``step`` (a generator rank died)."""

    def after_update(self, version: int, need_weights: bool) -> None:
        """After the optimizer step to ``version``: replicas checked, weights made current
        where ``need_weights`` (an eval or snapshot follows) or a push is due, pushed."""

    def node_ledger(self) -> Ledger:
        """The whole node's compute (every trainer rank's ledger merged)."""

    def gather_step(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """On the lead: ``{"ranks": [every trainer's record], "buffers": [buffer views]}``."""

    def metrics(self, led: Ledger) -> dict[str, Any]:
        """``runtime/*`` and ``policy/generator_version`` of a logged row."""

    def evaluator(self, version: int) -> tuple[Any, torch.nn.Module]:
        """(generation backend, module) holding the weights of ``version``, to evaluate."""

    def paused(self) -> AbstractContextManager:
        """A block during which the node stands still (an evaluation): generator ranks start
        no call, and its seconds are left out of ``runtime/node_seconds``."""

    def save(self, step: int, **evals: Any) -> None:
        """Snapshot every component (a collective across trainer ranks)."""

    def finish(self, final_step: int, store: Any) -> dict[str, Any]:
        """Stop the generators, ``store`` what is still in flight; on the lead the counts
        ``account`` balances, ``generators`` (each generator process's report) and
        ``stopped`` (why the run stopped early)."""

    def final_model(self) -> torch.nn.Module | None:
        """The trained policy with its full weights (on the lead; a collective)."""

    def close(self) -> None: ...
