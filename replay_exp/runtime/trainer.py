"""A trainer rank: data-parallel updates from its own buffer shard. T of them.

The loop of every trainer rank (rank 0 also evaluates, logs, snapshots and pushes weights):

    for step until budget:
        take every rollout that has arrived from the generators into this rank's shard
            (stamped created_step = step; if the shard is empty, wait for some)
        agree with the other trainers that no generator died (else: snapshot, stop)
        batch = shard.sample(B / T, step)      # the same sampling policy as the single loop
        one policy update; the wrapper all-reduces the gradients (ddp) or reduce-scatters
            them (fsdp), so every rank takes the same optimizer step
        rank 0: every k steps push the weights (version step + 1) to the generators
        rank 0: log the union of the shards' stats, evaluate on the grid, snapshot
    stop the generators, drain what they still send into the shards, write the accounting

How it differs from the single-process loop (``replay_exp.train``):
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

import copy
import dataclasses
import hashlib
import json
import logging
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from replay_exp.buffer import as_spec, make_buffer
from replay_exp.buffer.replay import COUNTERS, collect_stats, collect_telemetry
from replay_exp.checkpoint import Checkpointer, atomic_write_text, read_snapshot
from replay_exp.compute import Ledger, flop_params, sequence_lengths
from replay_exp.config import EVAL_UNITS
from replay_exp.evaluate import encode_details, evaluate
from replay_exp.logging import (
    MetricsWriter,
    format_eval,
    make_logger,
    prefixed,
    update_metrics,
    write_telemetry,
)
from replay_exp.models import load_policy
from replay_exp.rollout import HFGenerator
from replay_exp.rollout.collect import prompt_lengths
from replay_exp.runtime.channels import (
    HeartbeatMonitor,
    RolloutReceiver,
    WeightPusher,
    flatten,
    weight_keys,
)
from replay_exp.runtime.generator import batch_from_dict
from replay_exp.schedule import Every, OnGrid, derive_seed
from replay_exp.tasks import make_task
from replay_exp.update import policy_update

log = logging.getLogger("replay_exp")

# Ledger fields that add up over ranks (the rest: steps and the fixed sizes).
ADDITIVE = ("rollouts", "samples_trained", "gen_tokens", "train_tokens", "sample_units",
            "flops_gen", "flops_train", "seconds_gen", "seconds_train")  # fmt: skip


class GeneratorDied(RuntimeError):
    """A generator rank stopped beating; the trainers snapshot and stop."""


@dataclasses.dataclass
class _Value:
    """A checkpoint component that is a value already gathered on rank 0."""

    value: Any

    def state_dict(self) -> Any:
        return self.value


def wrap(policy: torch.nn.Module, wrapper: str, group, device: str) -> torch.nn.Module:
    """The data-parallel module: torch DDP, or fully_shard on each decoder layer and the root
    (FSDP2) over the trainers' ``group``."""
    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [torch.device(device).index] if device.startswith("cuda") else None
        return DistributedDataParallel(policy, device_ids=ids, process_group=group)
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, "cuda" if device.startswith("cuda") else "cpu")
    for layer in policy.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(policy, mesh=mesh)
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


def merged_ledger(base: Ledger, states: list[dict]) -> Ledger:
    """The node's ledger: rank 0's with every additive field summed over the ranks."""
    out = dataclasses.replace(base)
    for k in ADDITIVE:
        setattr(out, k, sum(s[k] for s in states))
    out._normalise()
    return out


def run_trainer(
    cfg, d, rank: int, group, store, run_dir: Path, snapshot_path: str | None, loaded=None
):
    """The loop of trainer rank ``rank`` (0..T-1). Rank 0 returns the run's summary.
    ``loaded``: the (policy, tokenizer, source) of ``load_policy``, if already loaded."""
    T, W = d.trainers, d.workers
    generators = list(range(T, T + W))
    s, a, g, r = cfg.schedule, cfg.algo, cfg.generation, cfg.runtime
    lead = rank == 0
    task = make_task(cfg.task)
    plain, tokenizer, _ = loaded or load_policy(cfg.model, cfg.task, task, d.device, d.dtype)
    chat = bool(cfg.model.chat_template)
    task.fit_prompts(partial(prompt_lengths, tokenizer, chat=chat), d.max_prompt_len)
    snap = read_snapshot(snapshot_path) if snapshot_path else None
    if snap is not None:
        plain.load_state_dict(snap.states["policy"])
    torch.manual_seed(derive_seed(cfg.seed, "torch", rank))
    # fsdp shards the module in place: rank 0 keeps a plain copy to evaluate and push from.
    evaluated = plain if r.wrapper == "ddp" else (copy.deepcopy(plain) if lead else None)
    model = wrap(plain, r.wrapper, group, d.device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=a.lr, betas=tuple(a.betas), weight_decay=a.weight_decay
    )
    buffer = make_buffer(  # this rank's shard: N/T rollouts
        as_spec(cfg.buffer, shards=1), capacity=d.capacity // T, max_prompt_len=d.max_prompt_len,
        max_completion_len=d.max_new_tokens, seed=derive_seed(cfg.seed, "buffer", rank),
    )  # fmt: skip
    ledger = Ledger(
        mu=cfg.compute.mu, batch_size=s.batch_size, units_per_step=d.paper_units_per_step,
        n_params=flop_params(plain), n_layers=plain.config.num_hidden_layers,
        hidden=plain.config.hidden_size,
    )  # fmt: skip
    # Per generator: rollouts received here, the newest batch index seen.
    received, newest = dict.fromkeys(generators, 0), dict.fromkeys(generators, -1)
    first_eval, last_eval, start = None, {}, 0
    counts = {"wait_seconds": 0.0, "arrived_step": 0, "reward_sum_step": 0.0, "replica_checks": 0}
    if snap is not None:
        st = snap.trainer["runtime"]
        buffer.load_state_dict(snap.states["buffers"][rank])
        ledger.load_state_dict(snap.states["ledgers"][rank])
        load_optimizer_state(model, optimizer, snap.states["optimizer"], r.wrapper)
        received = {gr: int(st["received"][str(rank)][str(gr - T)]) for gr in generators}
        newest = {gr: int(st["next_batch"][str(gr - T)]) - 1 for gr in generators}
        counts["replica_checks"] = int(st["replica_checks"])
        first_eval, last_eval = snap.trainer["first_eval"], snap.trainer["last_eval"]
        start = snap.step
    del snap

    inbox = RolloutReceiver(store, rank, generators, first=T)
    monitor = HeartbeatMonitor(store, generators, r.heartbeat_timeout_s)
    pusher = WeightPusher(store, generators, first=T) if lead else None
    keys = weight_keys(plain.state_dict()) if lead else None
    eval_problems = task.eval_problems()[: cfg.eval.n_problems]
    eval_due, log_due = OnGrid(cfg.eval.every), Every(cfg.logger.log_every)
    sync = Every(s.sync_every)
    snapshot_due = Every(cfg.checkpoint.every) if cfg.checkpoint.every else (lambda step: False)
    B_rank = s.batch_size // T

    logger = details_log = snapshots = evaluator = None
    if lead:
        logger = make_logger(
            cfg, run_dir, {**OmegaConf.to_container(cfg), "derived": dataclasses.asdict(d)}
        )
        details_log = MetricsWriter(run_dir / "eval_details.jsonl")
        evaluator = HFGenerator(
            evaluated, tokenizer.pad_token_id, tokenizer.eos_token_id,
            chunk_size=g.chunk_size, sampler=g.sampler,
        )  # fmt: skip
        snapshots = Checkpointer(
            run_dir / "checkpoints",
            {k: _Value(None) for k in ("policy", "optimizer", "buffers", "ledgers")},
            keep=cfg.checkpoint.keep,
            sync_files=[run_dir / "metrics.jsonl", run_dir / "eval_details.jsonl"],
        )

    def node_ledger() -> Ledger:
        """The node's ledger, on every trainer (so each decides the eval grid alike)."""
        states = [None] * T
        dist.all_gather_object(states, dataclasses.asdict(ledger), group=group)
        return merged_ledger(ledger, states)

    def eval_x(led: Ledger) -> float:
        return getattr(led, EVAL_UNITS[cfg.eval.unit])

    def run_eval(step: int, led: Ledger) -> dict[str, float]:
        t0 = time.perf_counter()
        if r.wrapper == "fsdp":
            evaluated.load_state_dict(weights)
        out, details = evaluate(
            evaluator, evaluated, tokenizer, task, eval_problems, cfg.eval, d.max_new_tokens,
            derive_seed(cfg.seed, "eval", step), chat=chat, micro_batch_size=a.micro_batch_size,
        )  # fmt: skip
        ledger.add_eval(time.perf_counter() - t0)
        x = {"compute/paper_units": led.paper_units, "compute/rollouts": led.rollouts}
        details_log.write({"step": step, **x, **encode_details(details)})
        return {f"eval/{k}": v for k, v in out.items()}

    def take_arrivals(step: int) -> None:
        for gen_rank, msg in inbox.poll():
            batch = batch_from_dict(msg["batch"])
            batch.created_step_B = torch.full_like(batch.created_step_B, step)
            received[gen_rank] += len(batch)
            newest[gen_rank] = max(newest[gen_rank], int(msg["j"]))
            tokens = int(batch.completion_mask_BxC.sum())
            ledger.add_generation(sequence_lengths(batch), tokens, msg["seconds"])
            counts["arrived_step"] += len(batch)
            counts["reward_sum_step"] += float(batch.reward_B.sum())
            buffer.add(batch, step)

    def runtime_state() -> dict:
        """What a relaunch needs beyond the components: per trainer, rollouts received from
        each generator; per generator, the next batch index (gathered on rank 0)."""
        mine = {"received": {str(gr - T): n for gr, n in received.items()},
                "newest": {str(gr - T): j for gr, j in newest.items()}}  # fmt: skip
        every = [None] * T if lead else None
        dist.gather_object(mine, every, dst=0, group=group)
        if not lead:
            return {}
        return {
            "received": {str(t): every[t]["received"] for t in range(T)},
            "next_batch": {str(w): max(e["newest"][str(w)] for e in every) + 1 for w in range(W)},
            "replica_checks": counts["replica_checks"],
        }

    def save(step: int) -> None:
        pieces = [None] * T if lead else None
        mine = {"buffer": buffer.state_dict(), "ledger": ledger.state_dict()}
        dist.gather_object(mine, pieces, dst=0, group=group)
        opt = optimizer_state(model, optimizer, r.wrapper)
        state = runtime_state()
        if lead:
            snapshots.components.update(
                policy=_Value(weights), optimizer=_Value(opt),
                buffers=_Value([p["buffer"] for p in pieces]),
                ledgers=_Value([p["ledger"] for p in pieces]),
            )  # fmt: skip
            snapshots.save(step, first_eval=first_eval, last_eval=last_eval, runtime=state)

    weights = full_state(model, r.wrapper)  # the policy of the current version (rank 0)
    led = node_ledger()
    if snapshot_path is None:
        if cfg.eval.at_start and lead:
            first_eval = run_eval(0, led)
            logger.log({"step": 0, **first_eval, **prefixed("compute", led.metrics())})
            log.info("step 0 | %s", format_eval(first_eval))
        last_eval = dict(first_eval or {})
        if snapshot_due(0):
            save(0)

    t_start = time.perf_counter()
    stopped_at, dead = None, []

    def find_dead() -> list[int]:
        """Generators whose connection broke mid-message or whose heartbeat stopped."""
        return sorted(inbox.broken | set(monitor.dead(inbox.open)))

    for step in range(start, d.total_steps):
        x_before = eval_x(led)
        counts["arrived_step"], counts["reward_sum_step"] = 0, 0.0
        take_arrivals(step)
        t0 = time.perf_counter()
        while len(buffer) == 0 and not dead:  # nothing to train on yet: wait for a generator
            time.sleep(0.002)
            take_arrivals(step)
            dead = find_dead()
        counts["wait_seconds"] += time.perf_counter() - t0
        dead = dead or find_dead()
        flag = torch.tensor([len(dead)], dtype=torch.long)
        dist.all_reduce(flag, group=group)  # every trainer stops if any saw a death
        if int(flag):
            stopped_at = step
            break
        t0 = time.perf_counter()
        batch = buffer.sample(B_rank, step)
        newest_version = int(batch.version_B.max())
        if newest_version > step:  # an invariant of the runtime, checked on every batch
            raise RuntimeError(
                f"rank {rank} step {step}: a rollout of version {newest_version} is newer "
                "than the trainer"
            )
        stats = policy_update(
            model, optimizer, batch, a, g.temperature, d.max_new_tokens,
            version=step if cfg.logger.diagnostics else None,
        )  # fmt: skip
        seconds = time.perf_counter() - t0 - stats.get("diag/seconds", 0.0)
        ledger.add_training(sequence_lengths(batch), stats.get("tokens", 0), seconds)
        version = step + 1
        if r.check_replicas and r.wrapper == "ddp":
            digests = [None] * T
            dist.all_gather_object(digests, params_digest(plain), group=group)
            if len(set(digests)) != 1:
                raise RuntimeError(f"step {step}: trainer replicas differ after the update")
            counts["replica_checks"] += 1
        push = sync(version) or version == d.total_steps
        led = node_ledger()
        is_eval = eval_due(x_before, eval_x(led)) or version == d.total_steps
        if push or is_eval or snapshot_due(version):
            weights = full_state(model, r.wrapper)
        if lead and push and version < d.total_steps:
            pusher.push(version, flatten(weights, keys))
        views = [None] * T if lead else None
        wanted = log_due(version) or is_eval or version == d.total_steps
        step_counts = [counts["arrived_step"], counts["reward_sum_step"], newest_version]
        if wanted:
            dist.gather_object((buffer.view(), step_counts), views, dst=0, group=group)
        if lead and wanted:
            row = {"step": version, "policy/version": version}
            arrived = sum(v[1][0] for v in views)
            row.update(
                {
                    "train/fresh_rollouts": arrived,
                    "train/reward": sum(v[1][1] for v in views) / arrived if arrived else None,
                    "train/batch_reward": float(batch.reward_B.mean()),
                    # the newest policy version in any rank's batch (<= step - 1 = this step)
                    "runtime/batch_version_max": max(v[1][2] for v in views),
                    **update_metrics(stats),
                    **prefixed("buffer", collect_stats([v[0] for v in views])),
                    **runtime_metrics(led, pusher, T, W, counts, time.perf_counter() - t_start),
                }
            )
            if is_eval:
                last_eval = run_eval(version, led)
                write_telemetry(run_dir, version, collect_telemetry([v[0] for v in views]), logger)
                row.update(last_eval)
                log.info("step %d | %s", version, format_eval(last_eval))
            row.update(prefixed("compute", led.metrics()))
            logger.log(row)
        if snapshot_due(version):
            save(version)

    # Reuse and rates over the training steps, then: stop the generators, drain what is in
    # flight into the shards (at the final step), account for every rollout.
    measured = (
        runtime_metrics(led, pusher, T, W, counts, time.perf_counter() - t_start) if lead else {}
    )
    final_step = d.total_steps if stopped_at is None else stopped_at
    if stopped_at is not None:
        names = ", ".join(f"rank {gr} (generator {gr - T})" for gr in dead) or "seen by a peer"
        log.error("generator died: %s; snapshot at step %d, stopping", names, stopped_at)
        weights = full_state(model, r.wrapper)
        save(stopped_at)
    if lead:
        dead = sorted(set(dead) | set(pusher.stop(dead=set(dead))))
    # Live generators send DONE last; one that dies now (after the last step) is noted, and
    # whatever it had in flight stays unaccounted for (summary.json: dead_generators).
    while [gr for gr in inbox.open if gr not in dead]:
        take_arrivals(final_step)
        dead = sorted(set(dead) | set(find_dead()))
        time.sleep(0.002)
    if dead and stopped_at is None:
        log.error("generator rank(s) %s died after the last step; the run is complete", dead)
    views = [None] * T if lead else None
    mine = (buffer.view(), received, dict(inbox.done), dead)
    dist.gather_object(mine, views, dst=0, group=group)
    led = node_ledger()
    if not lead:
        return None
    if stopped_at is not None:
        logger.close({"status": "stopped", "step": stopped_at})
        raise GeneratorDied(f"generator rank(s) {dead or '?'} died; snapshot at step {stopped_at}")
    accounting = account(views, T, W)
    telemetry = collect_telemetry([v[0] for v in views])
    write_telemetry(run_dir, final_step, telemetry, None)
    summary = {
        "status": "finished",
        "steps": d.total_steps,
        "initial": first_eval,
        "final": last_eval,
        "compute": led.metrics(),
        "runtime": {
            **accounting,
            **{k.removeprefix("runtime/"): v for k, v in measured.items()},
            "off_policiness_hist": telemetry["off_policiness"],
        },
    }
    logger.close(summary)
    details_log.close()
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2))
    log.info("done: %s", format_eval(last_eval))
    return summary


def account(views: list, T: int, W: int) -> dict[str, Any]:
    """Every rollout generated is trained on, still buffered, or gone: per trainer, the
    rollouts the generators say they sent (DONE messages) = received = added to the shard =
    stored + evicted + retired."""
    sent = sum(sum(done.values()) for _, _, done, _ in views)
    received = sum(sum(rec.values()) for _, rec, _, _ in views)
    c = {k: sum(v[0].counters[k] for v in views) for k in COUNTERS}
    stored = sum(len(v[0].uses) for v in views)
    return {
        "generated": sent,
        "received": received,
        "added": c["added_total"],
        "buffered": stored,
        "evicted": c["evicted_total"],
        "evicted_unused": c["evicted_unused_total"],
        "retired": c["retired_total"],
        "samples_trained": c["sampled_total"],
        "dead_generators": sorted({g - T for *_, gone in views for g in gone}),
        "balanced": sent
        == received
        == c["added_total"]
        == stored + c["evicted_total"] + c["retired_total"],
    }


def runtime_metrics(led: Ledger, pusher, T: int, W: int, counts: dict, wall: float) -> dict:
    """Measured reuse y = samples trained / rollouts generated, the paper's mu estimate
    (K_train / T) / (K_inf / W) = y W / T, and the first-order prediction mu T / W."""
    y = led.samples_trained / led.rollouts if led.rollouts else float("nan")
    return {
        "runtime/reuse": y,
        "runtime/mu_estimate": y * W / T,
        "runtime/first_order_reuse": led.mu * T / W,
        "runtime/steps_per_second": led.steps / wall if wall > 0 else float("nan"),
        "runtime/pushes": pusher.pushed,
        "runtime/pushes_skipped": pusher.skipped,
        "runtime/wait_seconds_rank0": counts["wait_seconds"],
        "runtime/replica_checks": counts["replica_checks"],
    }
