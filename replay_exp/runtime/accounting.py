"""Pure bookkeeping of a run's rollouts and compute, the same for both runtimes: the node's
ledger merged from the trainers' ledgers, the balance of every rollout generated, and the
measured reuse against the compute model's first-order prediction."""

from __future__ import annotations

import dataclasses
from typing import Any

from replay_exp.buffer.replay import COUNTERS, BufferView
from replay_exp.compute import costmodel
from replay_exp.compute.ledger import Ledger

# Ledger fields that add up over trainer ranks (the rest: steps and the fixed sizes).
ADDITIVE = ("rollouts", "samples_trained", "gen_tokens", "train_tokens", "sample_units",
            "gen_units", "flops_gen", "flops_train", "seconds_gen", "seconds_train",
            "extra_forwards", "reward_gen_sum", "pass_gen_sum", "reward_train_sum",
            "pass_train_sum")  # fmt: skip


def buffer_views(buffer) -> list[BufferView]:
    """The views of a buffer's shards (one for an unsharded buffer)."""
    return [s.view() for s in getattr(buffer, "shards", [buffer])]


def merged_ledger(base: Ledger, states: list[dict]) -> Ledger:
    """The node's ledger: ``base`` (rank 0's) with every additive field summed over the
    ranks' ``states`` (``dataclasses.asdict`` of each rank's ledger)."""
    out = dataclasses.replace(base)
    for k in ADDITIVE:
        setattr(out, k, sum(s[k] for s in states))
    out._normalise()
    return out


def account(ended: dict[str, Any]) -> dict[str, Any]:
    """Every rollout generated is trained on, still buffered, or gone: the rollouts the
    generators say they sent = received by the trainers = added to the buffer (shards) +
    refused as over-stale (``buffer.max_staleness``), and added = stored + evicted +
    retired. ``ended``: ``sent`` and ``received`` (counts), ``buffers`` (views of every
    shard) and ``dead`` (generator indices that died)."""
    views = ended["buffers"]
    c = {k: sum(v.counters[k] for v in views) for k in COUNTERS}
    stored = sum(len(v.uses) for v in views)
    sent, received = ended["sent"], ended["received"]
    return {
        "generated": sent,
        "received": received,
        "added": c["added_total"],
        "buffered": stored,
        "evicted": c["evicted_total"],
        "evicted_unused": c["evicted_unused_total"],
        "retired": c["retired_total"],
        "samples_trained": c["sampled_total"],
        "dropped_stale": c["dropped_stale_total"],
        "dead_generators": sorted(ended["dead"]),
        "balanced": sent == received == c["added_total"] + c["dropped_stale_total"]
        and c["added_total"] == stored + c["evicted_total"] + c["retired_total"],
    }


def runtime_metrics(
    led: Ledger, d, *, pushes: int, skipped: int, wait_seconds: float, replica_checks: int,
    wall: float, node_seconds: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Measured reuse y = samples trained / rollouts generated; under schedule=async the
    paper's estimate of mu from it, (K_train / T) / (K_inf / W) = y W / T, beside the first
    order prediction mu T / W (``costmodel.first_order_reuse``); under sync (and
    ``runtime.lockstep``, whose steps are synchronous) the configured y = B / R stands for the
    prediction and there is no mu estimate (NaN).

    ``node_seconds`` (runtime=distributed; NaN in process): the node's own seconds so far,
    its wall-clock less the evaluations and snapshots it stood still for. Then
    ``runtime/node_time`` is that over t, one trainer rank's seconds per trained sample (the
    ledger's training seconds over samples trained, both summed over ranks): the node's time
    in units of one GPU training one sample, the unit of ``generation_cost=modelled``."""
    nan = float("nan")
    y = led.samples_trained / led.rollouts if led.rollouts else nan
    W, T = d.workers, d.trainers
    asynchronous = W is not None and T is not None and not getattr(d, "lockstep", False)
    t = led.seconds_train / led.samples_trained if led.samples_trained else nan
    node_time = node_seconds / t if node_seconds is not None and t > 0 else nan
    return {
        # NaN in process (no node clock: the analysis models one, analysis/node_time.py)
        "runtime/node_seconds": nan if node_seconds is None else node_seconds,
        "runtime/node_time": node_time,
        "runtime/reuse": y,
        "runtime/mu_estimate": y * W / T if asynchronous else nan,
        "runtime/first_order_reuse": (
            costmodel.first_order_reuse(W, T, led.mu) if asynchronous else d.reuse_ratio
        ),
        "runtime/steps_per_second": led.steps / wall if wall > 0 else nan,
        "runtime/pushes": pushes,
        "runtime/pushes_skipped": skipped,
        "runtime/wait_seconds": wait_seconds,
        "runtime/replica_checks": replica_checks,
    }
