"""A trainer rank of ``runtime=distributed``: data-parallel updates from its own buffer shard.
T of them, each running the one loop (``replay_exp.loop.train``) with a ``TrainerRank`` as its
runtime; what is here is only what is distributed:

- the source: the rollouts the W generator ranks delivered to this rank's inbox (stamped
  created_step = step; with an empty shard the rank waits for some), drained at the end;
- the collective: gradients all-reduced (DDP) or sharded (FSDP) by the wrapper; ledgers, buffer
  views and step records gathered on rank 0; a generator death agreed on by every trainer; the
  snapshot (``checkpoint.RUN_LAYOUT``, as in process) gathered on rank 0: every shard, every
  ledger, and as the rollout source's state the per-generator counts;
- rank 0 pushes the weights (version step + 1) to the generators every ``sync_every`` steps.

How a run differs from the single-process loop:
1. Arrivals are real: what the generators delivered by the time the step starts, not the
   emulated schedule; reuse, off-policiness and the cost ratio mu are measured, not set.
2. The loss is normalised per rank (``algo.loss_agg`` over the rank's B/T rollouts) and the
   gradients are averaged over ranks: with ``token_mean`` every rank's tokens weigh the same
   only when ranks hold equally many tokens.
3. Compute is still charged as the node's time, gamma = (1 + W/T)/(1 + mu) per step (paper
   units), so runs compare with the emulation on the same x axis; wall seconds are logged too.
4. A resumed run restarts the generators from the snapshot's weights (version = its step);
   rollouts that were in flight are regenerated (same seeds), never counted twice.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from replay_exp.checkpoint import RunSnapshots, read_snapshot
from replay_exp.compute import gencost
from replay_exp.compute.ledger import Ledger
from replay_exp.models.precision import compute_dtype, param_dtype
from replay_exp.runlog import LOG_FILES
from replay_exp.runtime.accounting import buffer_views, merged_ledger, runtime_metrics
from replay_exp.runtime.base import Arrival
from replay_exp.runtime.channels import (
    HeartbeatMonitor,
    RolloutReceiver,
    WeightPusher,
    flatten,
    weight_keys,
)
from replay_exp.runtime.generator import PAUSE_KEY, batch_from_dict, report_key
from replay_exp.runtime.schedule import Every

log = logging.getLogger("replay_exp")


def wrap(policy: torch.nn.Module, wrapper: str, group, device: str) -> torch.nn.Module:
    """The data-parallel module: torch DDP, or fully_shard on each decoder layer and the root
    (FSDP2) over the trainers' ``group``.

    Mixed precision (``models.precision``: float32 master weights, a lower compute dtype): DDP
    all-reduces the float32 gradients of the autocast forward; FSDP gets its own policy on top
    of the autocast hooks: the float32 shards are gathered in the compute dtype (half the
    traffic) and the gradients reduced in float32 into the float32 shards Adam updates."""
    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [torch.device(device).index] if device.startswith("cuda") else None
        return DistributedDataParallel(policy, device_ids=ids, process_group=group)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, "cuda" if device.startswith("cuda") else "cpu")
    kwargs = {}
    if compute_dtype(policy) != param_dtype(policy):
        from torch.distributed.fsdp import MixedPrecisionPolicy

        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=compute_dtype(policy), reduce_dtype=torch.float32
        )
    for layer in policy.model.layers:
        fully_shard(layer, mesh=mesh, **kwargs)
    fully_shard(policy, mesh=mesh, **kwargs)
    return policy


def full_state(model: torch.nn.Module, wrapper: str) -> dict[str, torch.Tensor]:
    """The whole model's state on CPU: every rank under ddp; rank 0 under fsdp (a collective:
    every trainer rank must call it)."""
    if wrapper == "ddp":
        return {k: v.detach().cpu() for k, v in model.module.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=opts)


def optimizer_state(model, optimizer, wrapper: str) -> dict:
    """The optimizer's whole state (rank 0; a collective under fsdp)."""
    if wrapper == "ddp":
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, optimizer, options=opts)


def load_optimizer_state(model, optimizer, state: dict, wrapper: str) -> None:
    if wrapper == "ddp":
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=opts)


def params_digest(model: torch.nn.Module) -> int:
    """A 63-bit hash of the parameters' bytes (to check that replicas are identical)."""
    h = hashlib.blake2b(digest_size=8)
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return int.from_bytes(h.digest(), "little") >> 1


def controlled_knobs(parts) -> tuple | None:
    """What controller=adaptive set on this rank: (R, N, lr scale, this shard's capacity,
    each parameter group's lr); None under controller=fixed."""
    c = parts.controller
    if c is None:
        return None
    k = c.knobs
    lrs = tuple(g["lr"] for g in parts.optimizer.param_groups)
    return (k.rollouts_per_step, k.capacity, k.lr_scale, parts.buffer.capacity, lrs)


def check_replicas_agree(every: list[tuple], version: int) -> None:
    """Every trainer rank's (weights digest, controller knobs) after the update to ``version``
    must be one value: the DDP replicas bitwise equal, every rank on the knobs rank 0 decided.
    For example [(7, None), (7, None)] passes; [(7, (8, 64, 1.0, 32, (3e-5,))),
    (7, (8, 256, 1.0, 128, (3e-5,)))] raises, naming the knobs."""
    digests = {d for d, _ in every}
    if len(digests) != 1:
        raise RuntimeError(f"version {version}: trainer replicas differ after the update")
    knobs = [k for _, k in every]
    if any(k != knobs[0] for k in knobs):
        raise RuntimeError(
            f"version {version}: the trainer ranks' controller knobs differ (R, N, lr scale, "
            f"shard capacity, lr per rank): {knobs}"
        )


def run_trainer(
    cfg, d, rank: int, group, store, links, run_dir: Path, snapshot_path: str | None, loaded=None
):
    """Trainer rank ``rank`` (0..T-1): the one loop with this rank's inbox and collectives
    (``group``: the trainers'; ``links``: the channels' group of every rank; ``store``: the
    rendezvous TCPStore). Rank 0 returns the run's summary. ``loaded``: (policy, tokenizer,
    origin), if loaded."""
    from replay_exp.loop import build_parts, train

    snap = read_snapshot(snapshot_path) if snapshot_path else None
    lead, r = rank == 0, cfg.runtime

    def wrapped(policy):  # fsdp shards in place: rank 0 keeps a plain copy to evaluate
        evaluated = policy if r.wrapper == "ddp" else (copy.deepcopy(policy) if lead else None)
        return wrap(policy, r.wrapper, group, d.device), evaluated

    parts = build_parts(
        cfg, d, run_dir, rank=rank, loaded=loaded, wrap=wrapped,
        policy_state=None if snap is None else snap.states["policy"],
    )  # fmt: skip
    runtime = TrainerRank(cfg, d, rank, group, store, links, run_dir, parts, snap)
    del snap
    return train(cfg, d, run_dir, parts, runtime)


class TrainerRank:
    """The rollout source and the collective of one trainer rank (module docstring)."""

    def __init__(self, cfg, d, rank: int, group, store, links, run_dir: Path, parts, snap):
        T, W = d.trainers, d.workers
        self.cfg, self.d, self.p, self.rank, self.group = cfg, d, parts, rank, group
        self.T, self.W, self.lead, self.wrapper = T, W, rank == 0, cfg.runtime.wrapper
        # Where the group's tensor collectives run: NCCL reduces only CUDA tensors, gloo CPU ones.
        self.collective_device = d.device if dist.get_backend(group) == "nccl" else "cpu"
        self.generators = list(range(T, T + W))
        # Per generator: rollouts received here, the newest batch index seen.
        self.received = dict.fromkeys(self.generators, 0)
        self.newest = dict.fromkeys(self.generators, -1)
        self.wait_seconds, self.replica_checks, self.dead, self.stopping = 0.0, 0, [], False
        # The node's own seconds before this launch, and those it stood still in this one.
        self.node_before, self.paused_seconds, self.pause_start = 0.0, 0.0, None
        self.resumed, self.pushes_before = None, (0, 0)
        self.can_wait = True
        self.whole_step = d.batch_per_trainer if cfg.runtime.lockstep else 0
        # Every rank restores its parts from the snapshot; rank 0 alone writes them.
        self.snapshots = RunSnapshots(run_dir, cfg.checkpoint.keep, LOG_FILES)
        if snap is not None:
            state = self.snapshots.restore(
                snap, rank, policy=lambda _: None,  # loaded before wrapping (build_parts)
                optimizer=lambda opt: load_optimizer_state(
                    parts.model, parts.optimizer, opt, self.wrapper
                ),
                buffers=parts.buffer.load_state_dict, ledgers=parts.ledger.load_state_dict,
                source=self._load_source,
            )  # fmt: skip
            self.replica_checks = int(state["runtime"]["replica_checks"])
            # the pushes of the launches before (counted over the run, as the replica checks)
            self.pushes_before = tuple(int(state["runtime"].get(k, 0))
                                       for k in ("pushes", "pushes_skipped"))  # fmt: skip
            self.node_before = float(state["runtime"].get("node_seconds", 0.0))
            self.resumed = (snap.step, state["first_eval"], state["last_eval"])
        self.store = store
        self.publish_cost = self.lead and cfg.runtime.generation_cost == "modelled"
        beat = cfg.runtime.heartbeat_timeout_s  # also the longest wait on a generator's bytes
        self.inbox = RolloutReceiver(store, links, rank, self.generators, first=T, wait_s=beat)
        self.monitor = HeartbeatMonitor(store, self.generators, beat)
        self.pusher = (WeightPusher(store, links, self.generators, first=T, wait_s=beat)
                       if self.lead else None)  # fmt: skip
        self.keys = weight_keys(parts.built.policy.state_dict()) if self.lead else None
        self.sync = Every(cfg.schedule.sync_every)
        self.weights = full_state(parts.model, self.wrapper)  # of the current version (rank 0)
        self.pushed_version = 0 if self.resumed is None else self.resumed[0]
        self.t_start = time.perf_counter()

    # --- the source -------------------------------------------------------------------------

    def _poll(self, step: int) -> list[Arrival]:
        out = []
        for gen_rank, msg in self.inbox.poll():
            batch = batch_from_dict(msg["batch"])
            batch.created_step_B = torch.full_like(batch.created_step_B, step)
            self.received[gen_rank] += len(batch)
            self.newest[gen_rank] = max(self.newest[gen_rank], int(msg["j"]))
            out.append(Arrival(batch, msg["seconds"]))
        return out

    def _find_dead(self) -> list[int]:
        """Generators whose connection broke mid-message or under a weight push (rank 0), or
        whose heartbeat stopped."""
        gone = self.pusher.gone if self.lead else set()
        return sorted(self.inbox.broken | gone | set(self.monitor.dead(self.inbox.open)))

    def take(self, step: int, wait: bool) -> list[Arrival]:
        out = self._poll(step)
        t0 = time.perf_counter()
        while wait and not out and not self.dead:  # nothing to train on: wait for a generator
            time.sleep(0.002)
            out = self._poll(step)
            self.dead = self._find_dead()
        self.wait_seconds += time.perf_counter() - t0
        return out

    # --- the collective ---------------------------------------------------------------------

    def stop_now(self, step: int) -> bool:
        self.dead = self.dead or self._find_dead()
        flag = torch.tensor([len(self.dead)], dtype=torch.long, device=self.collective_device)
        dist.all_reduce(flag, group=self.group)  # every trainer stops if any saw a death
        self.stopping = bool(int(flag))
        if self.stopping and self.lead:
            names = ", ".join(f"rank {g} (generator {g - self.T})" for g in self.dead)
            names = names or "seen by a peer"
            log.error("generator died: %s; snapshot at step %d, stopping", names, step)
        return self.stopping

    def after_update(self, version: int, need_weights: bool) -> None:
        # The DDP replicas' weights (an FSDP rank holds a shard: no digest) and the knobs
        # controller=adaptive set, compared across the trainer ranks.
        if self.cfg.runtime.check_replicas and (self.wrapper == "ddp" or self.p.controller):
            digest = params_digest(self.p.built.policy) if self.wrapper == "ddp" else None
            mine = (digest, controlled_knobs(self.p))
            every = [None] * self.T
            dist.all_gather_object(every, mine, group=self.group)
            check_replicas_agree(every, version)
            self.replica_checks += 1
        led = self.p.ledger
        if self.publish_cost and led.samples_trained:  # what modelled generation is timed by
            self.store.set(gencost.STORE_KEY, repr(led.seconds_train / led.samples_trained))
        push = self.sync(version) or version == self.d.total_steps
        if push or need_weights:
            self.weights = full_state(self.p.model, self.wrapper)
        if self.lead and push and version < self.d.total_steps:
            self.pusher.push(version, flatten(self.weights, self.keys))
            self.pushed_version = version

    def node_ledger(self) -> Ledger:
        """The node's ledger, on every trainer (so each decides the eval grid alike)."""
        states = [None] * self.T
        dist.all_gather_object(states, dataclasses.asdict(self.p.ledger), group=self.group)
        return merged_ledger(self.p.ledger, states)

    def gather(self, obj: Any) -> list | None:
        out = [None] * self.T if self.lead else None
        dist.gather_object(obj, out, dst=0, group=self.group)
        return out

    def broadcast(self, obj: Any) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def gather_step(self, record: dict[str, Any]) -> dict[str, Any] | None:
        every = self.gather((record, buffer_views(self.p.buffer)))
        if not self.lead:
            return None
        return {"ranks": [e[0] for e in every], "buffers": [v for e in every for v in e[1]]}

    def metrics(self, led: Ledger) -> dict[str, Any]:
        if not self.lead:
            return {}
        return {
            "policy/generator_version": self.pushed_version,
            **runtime_metrics(
                led, self.d, pushes=self.pushes_before[0] + self.pusher.pushed,
                skipped=self.pushes_before[1] + self.pusher.skipped,
                wait_seconds=self.wait_seconds, replica_checks=self.replica_checks,
                wall=time.perf_counter() - self.t_start,
                node_seconds=self.node_seconds(),
            ),
        }  # fmt: skip

    @contextlib.contextmanager
    def paused(self):
        """The lead evaluates or snapshots: the generators start no call meanwhile (they
        finish the one they are in), and the seconds are not the node's (``node_seconds``)."""
        self.pause_start = time.perf_counter()
        if self.lead:
            self.store.set(PAUSE_KEY, "1")
        try:
            yield
        finally:
            if self.lead:
                self.store.set(PAUSE_KEY, "0")
            self.paused_seconds += time.perf_counter() - self.pause_start
            self.pause_start = None

    def node_seconds(self) -> float:
        """The node's own seconds over the run (every launch): wall minus pauses."""
        now = time.perf_counter()
        ongoing = 0.0 if self.pause_start is None else now - self.pause_start
        return self.node_before + now - self.t_start - self.paused_seconds - ongoing

    def evaluator(self, version: int):
        if self.wrapper == "fsdp":
            self.p.evaluator.model.load_state_dict(self.weights)
        return self.p.evaluator, self.p.evaluator.model

    def _load_source(self, state: dict) -> None:
        """This rank's rollouts received from each generator, the newest batch index seen
        (the generators restart at the snapshot's next batch) and its controller's state."""
        T, rank = self.T, self.rank
        self.received = {g: int(state["received"][rank][g - T]) for g in self.generators}
        self.newest = {g: int(state["next_batch"][g - T]) - 1 for g in self.generators}
        if self.p.controller is not None:  # controller=adaptive: this rank's own state
            self.p.controller.load_state_dict(state["controller"][rank])

    def save(self, step: int, **evals: Any) -> None:
        with self.paused():
            self._save(step, **evals)

    def _save(self, step: int, **evals: Any) -> None:
        """Every trainer's buffer, ledger and source counts gathered on rank 0 (per trainer,
        the rollouts received from each generator; per generator, the next batch index, which
        a relaunch regenerates from), the full weights and optimizer state; a collective."""
        T = self.T
        mine = {"buffer": self.p.buffer.state_dict(), "ledger": self.p.ledger.state_dict(),
                "received": {g - T: n for g, n in self.received.items()},
                "newest": {g - T: j for g, j in self.newest.items()}}  # fmt: skip
        if self.p.controller is not None:  # each rank's own (its open window is its own)
            mine["controller"] = self.p.controller.state_dict()
        every = self.gather(mine)
        if self.stopping:  # the weights of this step were not made current (a collective)
            self.weights = full_state(self.p.model, self.wrapper)
        opt = optimizer_state(self.p.model, self.p.optimizer, self.wrapper)
        if not self.lead:
            return
        source = {
            "received": {t: every[t]["received"] for t in range(T)},
            "next_batch": {w: max(e["newest"][w] for e in every) + 1 for w in range(self.W)},
        }
        if self.p.controller is not None:
            source["controller"] = [e["controller"] for e in every]
        values = {
            "policy": self.weights, "optimizer": opt,
            "buffers": [e["buffer"] for e in every], "ledgers": [e["ledger"] for e in every],
            "source": source,
        }  # fmt: skip
        counters = {"replica_checks": self.replica_checks, "node_seconds": self.node_seconds()}
        if self.lead:  # the pushes so far, every launch's
            counters["pushes"] = self.pushes_before[0] + self.pusher.pushed
            counters["pushes_skipped"] = self.pushes_before[1] + self.pusher.skipped
        self.snapshots.save(step, values, **evals, runtime=counters)

    def finish(self, final_step: int, add_arrivals) -> dict[str, Any]:
        """Stop the generators and drain what is in flight into the shards (at the final
        step). Live generators send DONE last; one that dies now (after the last step) is
        noted, and what it had in flight stays unaccounted for (``dead_generators``)."""
        dead = list(self.dead)
        if self.lead:
            dead = sorted(set(dead) | set(self.pusher.stop(dead=set(dead))))
        while [g for g in self.inbox.open if g not in dead]:
            add_arrivals(self._poll(final_step), final_step)
            dead = sorted(set(dead) | set(self._find_dead()))
            time.sleep(0.002)
        if dead and not self.stopping:
            log.error("generator rank(s) %s died after the last step; the run is complete", dead)
        every = self.gather(
            (buffer_views(self.p.buffer), self.received, dict(self.inbox.done), dead)
        )
        if not self.lead:
            return {}
        return {
            "buffers": [v for e in every for v in e[0]],
            "sent": sum(sum(e[2].values()) for e in every),
            "received": sum(sum(e[1].values()) for e in every),
            "dead": sorted({g - self.T for e in every for g in e[3]}),
            "stopped": f"generator rank(s) {self.dead or '?'} died; snapshot at step {final_step}",
            "generators": self._generator_reports(),
        }

    def _generator_reports(self) -> list[dict[str, Any]]:
        """Each live generator's final counters (its seconds generating, sleeping under the
        modelled cost, blocked on a full queue, loading pushed weights; the engine log-prob
        check), published before its DONE; a generator that died has none."""
        reports = []
        for w in range(self.W):
            key = report_key(w)
            if self.store.check([key]):
                reports.append({"generator": w, **json.loads(self.store.get(key).decode())})
        return reports

    def final_model(self) -> torch.nn.Module | None:
        weights = full_state(self.p.model, self.wrapper)  # a collective under fsdp
        if not self.lead:
            return None
        model = self.p.evaluator.model
        if self.wrapper == "fsdp":
            model.load_state_dict(weights)
        return model

    def close(self) -> None:
        pass
