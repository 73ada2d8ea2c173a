"""``runtime=inprocess``: the loop's rollouts are generated in the training process.

Under ``schedule=sync`` each step generates R rollouts (R/G prompts x G samples) from the
generator's weights, which follow the trainer every ``schedule.sync_every`` steps,
``schedule.sync_lag`` versions late; under ``schedule=async`` the emulated node's arrivals
(``replay_exp.runtime.schedule.AsyncArrivals``: W workers, T trainers, cost ratio mu; fractional
arrivals accumulate deterministically, so reuse emerges as in the paper's cluster). One process
shares nothing: the node's ledger is this one; its snapshot (``checkpoint.RUN_LAYOUT``, as
under ``runtime=distributed``) holds one buffer and one ledger, and its rollout source's state
is the generator, the weight history and the random streams.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from replay_exp.checkpoint import GeneratorState, RNGState, RunSnapshots, Snapshot
from replay_exp.models.build import build_engine
from replay_exp.runlog import LOG_FILES
from replay_exp.runtime.accounting import buffer_views, runtime_metrics
from replay_exp.runtime.base import Arrival, generate_groups
from replay_exp.runtime.schedule import Every, WeightHistory, make_arrivals


class InProcess:
    """The rollout source and (trivial) collective of the single-process loop."""

    def __init__(self, cfg, d, run_dir: Path, parts, snapshot: Snapshot | None):
        s, g = cfg.schedule, cfg.generation
        self.cfg, self.d, self.p = cfg, d, parts
        policy = parts.built.policy
        # The generator samples the trainer's own weights when it follows them at every step.
        self.share = s.sync_every == 1 and s.sync_lag == 0
        self.generator = build_engine(
            cfg, d, parts.built, share_weights=self.share, copy_to=run_dir / "generator_model",
            remove_copy=True,  # the engine holds its weights once built
        )  # fmt: skip
        # Evaluation samples the trainer's current weights: through the engine when it follows
        # the trainer at every step (synced right before each eval), else the trainer's module.
        self.engine_evaluates = g.backend != "hf" and self.share
        # controller=adaptive sets R step by step under sync (it counts the groups); else the
        # schedule's (under async R emerges from W, T and mu, whatever the controller sets)
        c = parts.controller
        self.arrivals = (c if c is not None and c.sets_arrivals
                         else make_arrivals(s, d, cfg.compute.mu, cfg.algo.group_size))  # fmt: skip
        self.history = WeightHistory(s.sync_lag)  # weights of recent versions, for a sync lag
        self.history.push(0, policy)
        self.sync = Every(s.sync_every)
        self.syncs, self.t_start = 0, time.perf_counter()
        self.snapshots = RunSnapshots(run_dir, cfg.checkpoint.keep, LOG_FILES)
        self.resumed = None
        self.can_wait, self.whole_step = False, 0
        if snapshot is not None:
            p = parts
            state = self.snapshots.restore(
                snapshot, 0, policy=policy.load_state_dict, optimizer=p.optimizer.load_state_dict,
                buffers=p.buffer.load_state_dict, ledgers=p.ledger.load_state_dict,
                source=self._load_source,
            )  # fmt: skip
            self.resumed = (snapshot.step, state["first_eval"], state["last_eval"])
            self.syncs = state["runtime"]["pushes"]

    def _source_state(self) -> dict[str, Any]:
        """What a resumed run needs to generate bit-identically: the generator (version,
        private weights), the weight history of a sync lag, the global random streams. New
        state of the in-process source goes here; controller=adaptive's state too (it sets R,
        and the buffer's N and the lr, which it re-applies on load)."""
        state = {
            "generator": GeneratorState(self.generator).state_dict(),
            "weight_history": self.history.state_dict(),
            "rng": RNGState().state_dict(),
        }
        if self.p.controller is not None:
            state["controller"] = self.p.controller.state_dict()
        return state

    def _load_source(self, state: dict[str, Any]) -> None:
        GeneratorState(self.generator).load_state_dict(state["generator"])
        self.history.load_state_dict(state["weight_history"])
        RNGState().load_state_dict(state["rng"])
        if self.p.controller is not None:
            self.p.controller.load_state_dict(state["controller"])

    def take(self, step: int, wait: bool) -> list[Arrival]:
        """Sync the generator if due, then generate the step's groups (``generate_groups``)."""
        p, gen = self.p, self.generator
        if self.sync(step) and not (self.share and gen.version == step):
            gen.sync_weights(*reversed(self.history.weights_for(step, p.built.policy)))
            self.syncs += 1
        n_groups, first_group = self.arrivals.groups_at(step), self.arrivals.groups_before(step)
        if not n_groups:  # the async emulation delivers nothing at some steps
            return []
        arrival = generate_groups(
            self.cfg, self.d, p.built, gen, n_groups=n_groups, first_group=first_group,
            version=step, seed_tags=(step,),
        )  # fmt: skip
        return [arrival]

    def stop_now(self, step: int) -> bool:
        return False

    def after_update(self, version: int, need_weights: bool) -> None:
        self.history.push(version, self.p.built.policy)

    def node_ledger(self):
        return self.p.ledger

    def gather(self, obj: Any) -> list:
        return [obj]  # one process: the lead, alone

    def broadcast(self, obj: Any) -> Any:
        return obj

    def gather_step(self, record: dict[str, Any]) -> dict[str, Any]:
        return {"ranks": [record], "buffers": buffer_views(self.p.buffer)}

    def metrics(self, led) -> dict[str, Any]:
        return {
            "policy/generator_version": self.generator.version,
            **runtime_metrics(
                led, self.d, pushes=self.syncs, skipped=0, wait_seconds=0.0, replica_checks=0,
                wall=time.perf_counter() - self.t_start,
            ),
        }  # fmt: skip

    def paused(self):
        return contextlib.nullcontext()  # one process: nothing else runs while it evaluates

    def evaluator(self, version: int):
        policy = self.p.built.policy
        if self.engine_evaluates:
            if self.generator.version != version:
                self.generator.sync_weights(policy, version)  # the engine then holds it
            return self.generator, policy
        return self.p.evaluator, policy

    def save(self, step: int, **evals: Any) -> None:
        p = self.p
        values = {
            "policy": p.built.policy.state_dict(),
            "optimizer": p.optimizer.state_dict(),
            "buffers": [p.buffer.state_dict()],
            "ledgers": [p.ledger.state_dict()],
            "source": self._source_state(),
        }
        self.snapshots.save(step, values, **evals, runtime={"pushes": self.syncs})

    def finish(self, final_step: int, add_arrivals) -> dict[str, Any]:
        n = self.p.ledger.rollouts
        # No generator processes, so no generator reports (runtime/generator.py writes them).
        return {"buffers": buffer_views(self.p.buffer), "sent": n, "received": n, "dead": [],
                "generators": []}  # fmt: skip

    def final_model(self):
        return self.p.built.policy

    def close(self) -> None:
        if hasattr(self.generator, "close"):
            self.generator.close()
