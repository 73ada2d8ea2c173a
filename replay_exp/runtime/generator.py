"""A generator rank: generate, score and send rollouts, forever, picking up weights between
calls. One per inference worker (W of them).

    while not stopped:
        take the newest weights pushed by trainer rank 0, if any (never mid-generation);
            modelled cost with runtime.cost_model.load_cost: the load lasts that many trained
            samples' time
        wait while trainer rank 0 evaluates or snapshots (the node stands still)
        prompts = the next groups_per_batch problems of this generator's own stream
        rollouts = G samples each, rewards, advantages frozen, behaviour log-probs: the
            generation step the in-process source runs too (runtime.base.generate_groups)
        runtime.generation_cost=modelled: wait until the call has lasted what a GPU node
            would spend on it (replay_exp/compute/gencost.py)
        send each prompt group to its trainer's buffer shard (global group id mod T)

Batch ``j`` of generator ``w`` (w = 0..W-1) holds the global prompt groups
``(j W + w) P .. (j W + w) P + P - 1`` (P = groups per batch), so group ids and rollout uids
are unique over the run, and its prompts and sampling seeds are ``derive_seed(seed,
"prompts"|"gen", w, j)``: a relaunch regenerates exactly the batches that were in flight.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from replay_exp.checkpoint import Snapshot, read_snapshot
from replay_exp.compute import gencost
from replay_exp.compute.lengthmodel import quantile_level
from replay_exp.models.build import build_engine, build_policy
from replay_exp.runtime.base import generate_groups
from replay_exp.runtime.channels import (
    STOP,
    Heartbeat,
    RolloutSender,
    WeightReceiver,
    flatten,
    unflatten_into,
    weight_keys,
)
from replay_exp.types import RolloutBatch

log = logging.getLogger("replay_exp")


def run_generator(
    cfg, d, rank: int, store, links, run_dir: Path, snapshot_path: str | None
) -> dict:
    """The loop of generator rank ``rank`` (global rank T + w), talking to the trainers over
    ``links`` (channels.open_links) and the rendezvous ``store`` (a TCPStore). Returns its
    counters."""
    w = rank - d.trainers
    heartbeat = Heartbeat(store, rank)
    # The snapshot first: the trainers wait for this key before their first step, since two
    # saves later they prune it (a generator that starts slowly, e.g. importing vLLM, would
    # otherwise find it gone).
    snap = read_snapshot(snapshot_path) if snapshot_path is not None else None
    store.set(snapshot_read_key(w), "1")
    me = GeneratorRank(cfg, d, w, store, links, run_dir, snap)
    del snap
    log.info("generator %d (rank %d): %d groups of %d per call, from version %d", w, rank,
             d.groups_per_batch, cfg.algo.group_size, me.engine.version)  # fmt: skip
    while me.take_weights():
        me.counters["paused_seconds"] += wait_while_paused(store)  # an evaluation or snapshot
        me.generate_and_send()
    counters = me.close()
    heartbeat.stop()
    log.info("generator %d done: %s", w, counters)
    return counters


class GeneratorRank:
    """Generator ``w``'s policy copy, engine, channels and counters (module docstring)."""

    def __init__(self, cfg, d, w: int, store, links, run_dir: Path, snap: Snapshot | None):
        T = d.trainers
        self.cfg, self.d, self.w, self.store = cfg, d, w, store
        self.built = build_policy(cfg, d)
        policy = self.built.policy.eval()
        self.keys = weight_keys(policy.state_dict())
        version, self.j, self.sent_base = 0, 0, dict.fromkeys(range(T), 0)
        if snap is not None:  # start from the snapshot's weights and source counts
            policy.load_state_dict(snap.states["policy"])
            source = snap.states["source"]
            version, self.j = snap.step, int(source["next_batch"][w])
            self.sent_base = {t: int(source["received"][t][w]) for t in range(T)}
        # hf samples this process's own module; vllm runs an engine fed from it at every push.
        self.engine = build_engine(
            cfg, d, self.built, share_weights=cfg.generation.backend == "hf",
            copy_to=run_dir / f"generator_model_{w}", seed_tags=(w,),
        )  # fmt: skip
        self.engine.sync_weights(policy, version)
        numel = flatten(policy.state_dict(), self.keys).numel()
        self.weights = WeightReceiver(store, links, w, numel, policy.dtype)
        self.sender = RolloutSender(store, links, w, list(range(T)), cfg.runtime.max_in_flight)
        self.counters = {"batches": 0, "rollouts": 0, "weight_updates": 0, "gen_seconds": 0.0,
                         "slept_seconds": 0.0, "overruns": 0, "weight_loads": 0,
                         "weight_load_seconds": 0.0, "engine_checks": 0,
                         "engine_logp_absdiff_max": 0.0, "engine_logp_absdiff_mean": 0.0,
                         "engine_versions_checked": 0, "modelled_units": 0.0,
                         "modelled_per_sample": 0.0, "paused_seconds": 0.0,
                         "lockstep_wait_seconds": 0.0}  # fmt: skip
        self.checked: set[int] = set()  # versions whose engine log-probs were checked
        self.absdiff_sum = 0.0  # of the checked calls' mean |engine - pushed weights| log-prob
        rc = cfg.runtime
        self.modelled = rc.generation_cost == "modelled"
        self.cost = gencost.ModelledCost(cfg.compute.mu, rc.cost_model.length_sigma)
        self.reference = rc.cost_model.reference_s_per_sample
        self.load_cost = rc.cost_model.load_cost
        self.calibrated = None  # this generator's own estimate, until the trainers publish theirs

    def take_weights(self) -> bool:
        """Load the newest weights trainer rank 0 pushed, if any (between calls, never
        mid-generation); under ``runtime.lockstep`` first wait for the push of the version the
        next call is for (:meth:`lockstep_version`). False once the trainers say stop."""
        policy, c = self.built.policy, self.counters
        need = self.lockstep_version()
        t_wait = time.perf_counter()
        news = self.weights.poll()
        while news is None and need is not None and self.engine.version < need:
            time.sleep(0.002)  # the trainers are still on the step before
            news = self.weights.poll()
        t_load, loaded = time.perf_counter(), False
        c["lockstep_wait_seconds"] += t_load - t_wait
        while news is not None:  # the newest push wins
            new_version, flat = news
            if new_version == STOP:
                break
            unflatten_into(policy, flat, self.keys)
            self.engine.sync_weights(policy, new_version)
            c["weight_updates"] += 1
            loaded = True
            news = self.weights.poll()
            while news is None and need is not None and self.engine.version < need:
                time.sleep(0.002)
                news = self.weights.poll()
        if loaded and self.modelled and self.load_cost > 0:  # a GPU node's weight load, once
            # per take (gencost.py): pushes that arrive during the pause wait for the next
            # call, as they would on a node (pausing per push would livelock once a load
            # outlasts a step)
            per_sample = self.reference or gencost.published_seconds(self.store) or 0.0
            time.sleep(max(0.0, self.load_cost * per_sample - (time.perf_counter() - t_load)))
        if loaded:
            c["weight_loads"] += 1
            c["weight_load_seconds"] += time.perf_counter() - t_load
        return news is None or news[0] != STOP

    def lockstep_version(self) -> int | None:
        """Under ``runtime.lockstep``, the version the next call must generate with: the
        step it feeds, call c = j W + w of ``calls_per_step`` = B / (P G) a step, feeds step
        c // calls_per_step, whose weights are that version (pushed after every step);
        None otherwise."""
        if not self.cfg.runtime.lockstep:
            return None
        d = self.d
        calls_per_step = self.cfg.schedule.batch_size // (
            d.groups_per_batch * self.cfg.algo.group_size
        )
        return (self.j * d.workers + self.w) // calls_per_step

    def generate_and_send(self) -> None:
        """Batch ``j``: its prompt groups generated (``runtime.base.generate_groups``), the
        engine checked against the pushed weights, the call paced under the modelled cost, each
        group sent to its trainer's buffer shard."""
        d, w, j, c = self.d, self.w, self.j, self.counters
        P = d.groups_per_batch
        t0 = time.perf_counter()
        arrival = generate_groups(
            self.cfg, d, self.built, self.engine, n_groups=P, first_group=(j * d.workers + w) * P,
            version=self.engine.version, seed_tags=(w, j),
        )  # fmt: skip
        fresh = arrival.batch
        if self.cfg.generation.store_trainer_logp:  # the engine mismatch, at generating weights
            self._count_check(arrival.stats)
        seconds = time.perf_counter() - t0
        if self.modelled:  # sleep until the batch has taken what a GPU node would spend on it
            seconds = self._pace(fresh, t0)
        c["gen_seconds"] += seconds
        for t, part in split_by_trainer(fresh, d.trainers):
            payload = {"batch": batch_to_dict(part), "generator": w, "j": j,
                       "seconds": seconds * len(part) / len(fresh)}  # fmt: skip
            self.sender.send(t, payload, len(part))
        c["batches"] += 1
        c["rollouts"] += len(fresh)
        self.j += 1

    def _count_check(self, check: dict[str, float]) -> None:
        """The engine against this process's copy of the policy, which holds exactly the
        weights trainer rank 0 pushed for the engine's version: the push landed in the engine
        iff they agree (to the engine's own rounding)."""
        c = self.counters
        self.absdiff_sum += check["behaviour_logp_absdiff_mean"]
        c["engine_logp_absdiff_max"] = max(
            c["engine_logp_absdiff_max"], check["behaviour_logp_absdiff_max"]
        )
        c["engine_checks"] += 1
        self.checked.add(self.engine.version)

    def _pace(self, fresh: RolloutBatch, t0: float) -> float:
        """``runtime.generation_cost=modelled``: sleep until the call started at ``t0`` has
        lasted what a GPU node would spend on it (``compute/gencost.py``); its seconds."""
        cfg, c = self.cfg, self.counters
        per_sample = self.reference or gencost.published_seconds(self.store)
        if per_sample is None:
            if self.calibrated is None:
                self.calibrated = gencost.time_training(
                    self.built.policy, fresh, cfg.generation.temperature, cfg.algo.micro_batch_size
                )
            per_sample = self.calibrated
        u = quantile_level(cfg.seed, self.w, self.j)
        elapsed = time.perf_counter() - t0  # the generation (and a first calibration)
        seconds, own = self.cost.next_call(len(fresh), u, per_sample, elapsed)  # revalued
        if seconds > elapsed:
            time.sleep(seconds - elapsed)
            c["slept_seconds"] += seconds - elapsed
        if elapsed > own:  # the real generation outlasted the call's own model
            c["overruns"] += 1
        c["modelled_units"], c["modelled_per_sample"] = self.cost.units, per_sample
        return seconds

    def close(self) -> dict:
        """Publish the counters, send DONE with the rollouts sent to each trainer over the
        run, stop the engine; the counters."""
        c = self.counters
        c["stall_seconds"] = self.sender.stall_seconds
        c["engine_logp_absdiff_mean"] = self.absdiff_sum / max(1, c["engine_checks"])
        c["engine_versions_checked"] = len(self.checked)
        # Published before DONE, so trainer rank 0 finds it when it sees DONE (summary.json's
        # runtime.generators; this launch's counts only after a resume).
        self.store.set(report_key(self.w), json.dumps(c))
        T = self.d.trainers
        self.sender.close({t: self.sent_base[t] + self.sender.sent[t] for t in range(T)})
        if hasattr(self.engine, "close"):
            self.engine.close()
        return c


# Store key trainer rank 0 sets to "1" while it evaluates or snapshots (the node stands still:
# no generator starts a call) and back to "0" after.
PAUSE_KEY = "node/paused"


def wait_while_paused(store, poll: float = 0.02) -> float:
    """Block while the node is paused (``PAUSE_KEY``); the seconds waited. Polled every
    ``poll`` seconds: fast polling by W generators would take CPU from the evaluation they
    wait for on a small machine (not measured), and 20 ms is small beside a generator call."""
    t0 = time.perf_counter()
    while store.check([PAUSE_KEY]) and store.get(PAUSE_KEY) == b"1":
        time.sleep(poll)
    return time.perf_counter() - t0


def snapshot_read_key(w: int) -> str:
    """Store key set once generator ``w`` holds its copy of the snapshot it resumes from."""
    return f"snapshot_read/{w}"


def report_key(w: int) -> str:
    """Store key of generator ``w``'s final counters (JSON)."""
    return f"generator_report/{w}"


def split_by_trainer(batch: RolloutBatch, T: int) -> list[tuple[int, RolloutBatch]]:
    """The rows of each trainer's prompt groups (group id mod T), for the trainers that get
    any."""
    owner = batch.group_id_B % T
    out = []
    for t in range(T):
        rows = torch.nonzero(owner == t).flatten()
        if len(rows):
            out.append((t, batch.index(rows)))
    return out


def batch_to_dict(batch: RolloutBatch) -> dict[str, torch.Tensor]:
    return {k: v.cpu() for k, v in vars(batch).items()}


def batch_from_dict(d: dict[str, torch.Tensor]) -> RolloutBatch:
    return RolloutBatch(**d)
