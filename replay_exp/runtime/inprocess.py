"""``runtime=inprocess``: the loop's rollouts are generated in the training process.

Under ``schedule=sync`` each step generates R rollouts (R/G prompts x G samples) from the
generator's weights, which follow the trainer every ``schedule.sync_every`` steps,
``schedule.sync_lag`` versions late; under ``schedule=async`` the emulated node's arrivals
(``replay_exp.runtime.schedule.AsyncArrivals``: W workers, T trainers, cost ratio mu; fractional
arrivals accumulate deterministically, so reuse emerges as in the paper's cluster). One process
shares nothing: the node's ledger is this one, and a snapshot holds every component by name.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from replay_exp.checkpoint import Checkpointer, GeneratorState, RNGState, Snapshot
from replay_exp.config.seeding import derive_seed
from replay_exp.rollout import SamplingParams, engine_model_dir, make_generator
from replay_exp.rollout.collect import generate_rollouts, with_trainer_logp
from replay_exp.runtime.accounting import buffer_views, runtime_metrics
from replay_exp.runtime.base import Arrival
from replay_exp.runtime.schedule import Every, WeightHistory, make_arrivals

# Files a snapshot covers (fsynced before it is committed).
LOG_FILES = ("metrics.jsonl", "eval_details.jsonl")


class InProcess:
    """The rollout source and (trivial) collective of the single-process loop."""

    def __init__(self, cfg, d, run_dir: Path, parts, snapshot: Snapshot | None):
        s, g = cfg.schedule, cfg.generation
        self.cfg, self.d, self.p = cfg, d, parts
        policy, tokenizer = parts.plain, parts.tokenizer
        # The generator samples the trainer's own weights when it follows them at every step.
        self.share = s.sync_every == 1 and s.sync_lag == 0
        model_dir = engine_model_dir(
            cfg, parts.source, policy, tokenizer, run_dir / "generator_model"
        )
        self.generator = make_generator(
            g, policy, tokenizer, share_weights=self.share, model_dir=model_dir,
            max_model_len=d.max_prompt_len + d.max_new_tokens, dtype=d.dtype,
            seed=derive_seed(cfg.seed, "engine"), device=d.device,
        )  # fmt: skip
        if model_dir is not None and Path(model_dir).parent == run_dir:
            shutil.rmtree(model_dir)  # the engine holds its weights now; the copy is not needed
        # Evaluation samples the trainer's current weights: through the engine when it follows
        # the trainer at every step (synced right before each eval), else the trainer's module.
        self.engine_evaluates = g.backend != "hf" and self.share
        self.arrivals = make_arrivals(s, d, cfg.compute.mu, cfg.algo.group_size)
        self.history = WeightHistory(s.sync_lag)  # weights of recent versions, for a sync lag
        self.history.push(0, policy)
        self.sync = Every(s.sync_every)
        self.sampling = SamplingParams(g.temperature, g.top_p, d.max_new_tokens)
        self.syncs, self.t_start = 0, time.perf_counter()
        # Everything a resumed run needs to continue bit-identically, by name: new stateful
        # parts (state_dict / load_state_dict) go here. The eval dicts travel as JSON.
        self.snapshots = Checkpointer(
            run_dir / "checkpoints",
            {
                "policy": policy,
                "optimizer": parts.optimizer,
                "generator": GeneratorState(self.generator),
                "weight_history": self.history,
                "buffer": parts.buffer,
                "ledger": parts.ledger,
                "rng": RNGState(),
            },
            keep=cfg.checkpoint.keep,
            sync_files=[run_dir / name for name in LOG_FILES],
        )
        self.resumed = None
        self.can_wait = False
        if snapshot is not None:
            state = self.snapshots.restore(snapshot)
            self.resumed = (snapshot.step, state["first_eval"], state["last_eval"])
            self.syncs = state["runtime"]["pushes"]

    def take(self, step: int, wait: bool) -> list[Arrival]:
        """Sync the generator if due, then generate the step's groups (scored, advantages
        frozen; under ``generation.behaviour_logp=trainer`` the trainer's log-probs, under
        ``generation.store_trainer_logp`` the engine mismatch beside the engine's)."""
        cfg, p, a, gen = self.cfg, self.p, self.cfg.algo, self.generator
        if self.sync(step) and not (self.share and gen.version == step):
            gen.sync_weights(*reversed(self.history.weights_for(step, p.plain)))
            self.syncs += 1
        n_groups, first_group = self.arrivals.groups_at(step), self.arrivals.groups_before(step)
        if not n_groups:  # the async emulation delivers nothing at some steps
            return []
        t0 = time.perf_counter()
        prompts = p.task.sample_train(
            np.random.default_rng(derive_seed(cfg.seed, "prompts", step)), n_groups
        )
        fresh = generate_rollouts(
            gen, p.tokenizer, p.task, prompts, a.group_size, self.sampling,
            seed=derive_seed(cfg.seed, "gen", step), step=step,
            first_uid=first_group * a.group_size, first_group=first_group,
            normalize_std=a.adv_normalize_std, chat=p.chat,
        )  # fmt: skip
        stats, g = {}, cfg.generation
        if g.behaviour_logp == "trainer" or g.store_trainer_logp:  # the generating weights'
            source = "behaviour" if g.behaviour_logp == "trainer" else "gap"
            fresh, stats = with_trainer_logp(
                p.plain, fresh, g.temperature, source, a.micro_batch_size
            )
        return [Arrival(fresh, time.perf_counter() - t0, stats)]

    def stop_now(self, step: int) -> bool:
        return False

    def after_update(self, version: int, need_weights: bool) -> None:
        self.history.push(version, self.p.plain)

    def node_ledger(self):
        return self.p.ledger

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
        if self.engine_evaluates:
            if self.generator.version != version:
                self.generator.sync_weights(self.p.plain, version)  # the engine then holds it
            return self.generator, self.p.plain
        return self.p.evaluator, self.p.plain

    def save(self, step: int, **evals: Any) -> None:
        self.snapshots.save(step, **evals, runtime={"pushes": self.syncs})

    def finish(self, final_step: int, store) -> dict[str, Any]:
        n = self.p.ledger.rollouts
        # No generator processes, so no generator reports (runtime/generator.py writes them).
        return {"buffers": buffer_views(self.p.buffer), "sent": n, "received": n, "dead": [],
                "generators": []}  # fmt: skip

    def final_model(self):
        return self.p.plain

    def close(self) -> None:
        if hasattr(self.generator, "close"):
            self.generator.close()
