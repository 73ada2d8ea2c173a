"""The distributed runtime's pure parts, with hand-computed numbers: the node's ledger merged
from the trainers' ledgers, the balance of every rollout, the reuse metrics, the split of a
generator's groups by trainer, and the sizes of one rank."""

from __future__ import annotations

import dataclasses
import math
import threading

import numpy as np
import pytest
import torch

from replay_exp.buffer.replay import COUNTERS, BufferView
from replay_exp.buffer.telemetry import Telemetry
from replay_exp.compute.ledger import Ledger
from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.rollout.synthetic import rollout_batch
from replay_exp.runtime.accounting import account, merged_ledger, runtime_metrics
from replay_exp.runtime.generator import PAUSE_KEY, split_by_trainer, wait_while_paused


def _ledger(**kw) -> Ledger:
    base = {"mu": 1.0, "batch_size": 4, "n_params": 10, "n_layers": 1, "hidden": 2}
    return Ledger(**{**base, **kw})


def test_merged_ledger_sums_the_additive_fields_and_keeps_rank0s_steps():
    # Two trainers of an async node, gamma = 0.75 paper units per step (units_per_step).
    a = _ledger(units_per_step=0.75, steps=3, rollouts=8, samples_trained=6, gen_tokens=40,
                train_tokens=30, sample_units=14.0, seconds_gen=1.0, seconds_train=2.0)  # fmt: skip
    b = _ledger(units_per_step=0.75, steps=3, rollouts=4, samples_trained=6, gen_tokens=20,
                train_tokens=36, sample_units=10.0, seconds_gen=0.5, seconds_train=2.5)  # fmt: skip
    node = merged_ledger(a, [dataclasses.asdict(a), dataclasses.asdict(b)])
    # rollouts 8 + 4 = 12, trained 6 + 6 = 12, tokens 40 + 20 = 60 and 30 + 36 = 66
    assert (node.rollouts, node.samples_trained, node.gen_tokens, node.train_tokens) == (
        12, 12, 60, 66,
    )  # fmt: skip
    assert node.sample_units == 24.0 and node.seconds_train == 4.5
    # steps are the node's (rank 0's, the same on every rank): 3 steps x 0.75 = 2.25 units
    assert node.steps == 3 and node.paper_units == 2.25
    assert a.rollouts == 8  # rank 0's own ledger is left alone


def test_merged_ledger_without_a_fixed_step_charge_normalises_the_sum():
    # sync-style charging: paper units = sample units / (B (1 + mu)) = 24 / (4 * 2) = 3
    a, b = _ledger(sample_units=14.0), _ledger(sample_units=10.0)
    assert merged_ledger(a, [dataclasses.asdict(a), dataclasses.asdict(b)]).paper_units == 3.0


def _view(uses, added, evicted, unused, retired, sampled, dropped=0) -> BufferView:
    values = (added, evicted, unused, retired, sampled, dropped)
    counters = dict(zip(COUNTERS, values, strict=True))
    return BufferView(np.array(uses), np.zeros(len(uses)), 8, counters, Telemetry())


def test_account_balances_sent_received_added_and_what_became_of_them():
    # Shard 0: 10 added, 3 stored, 5 evicted (2 never used), 2 retired; shard 1: 6 added,
    # 4 stored, 2 evicted. 16 = 3 + 5 + 2 + 4 + 2.
    views = [_view([1, 0, 2], 10, 5, 2, 2, 9), _view([0, 1, 1, 3], 6, 2, 0, 0, 7)]
    got = account({"buffers": views, "sent": 16, "received": 16, "dead": []})
    assert got == {
        "generated": 16, "received": 16, "added": 16, "buffered": 7, "evicted": 7,
        "evicted_unused": 2, "retired": 2, "samples_trained": 16, "dropped_stale": 0,
        "dead_generators": [], "balanced": True,
    }  # fmt: skip
    # One rollout lost on the way (sent 17, received 16): not balanced.
    assert not account({"buffers": views, "sent": 17, "received": 16, "dead": [0]})["balanced"]
    # A shard that lost track of one (added 10, but 3 + 4 + 2 = 9 accounted): not balanced.
    short = [_view([1, 0, 2], 10, 4, 2, 2, 9), views[1]]
    assert not account({"buffers": short, "sent": 16, "received": 16, "dead": []})["balanced"]
    # buffer.max_staleness refused 3 of 19 received: 19 = 16 added + 3 dropped, balanced.
    stale = [_view([1, 0, 2], 10, 5, 2, 2, 9, dropped=3), views[1]]
    got = account({"buffers": stale, "sent": 19, "received": 19, "dead": []})
    assert got["balanced"] and got["dropped_stale"] == 3 and got["added"] == 16
    # Received 16, but 16 added + 3 refused = 19: one count is wrong, not balanced.
    assert not account({"buffers": stale, "sent": 16, "received": 16, "dead": []})["balanced"]


@dataclasses.dataclass
class _D:
    workers: int | None
    trainers: int | None
    reuse_ratio: float


def test_runtime_metrics_against_the_compute_model():
    # W = 1 generator, T = 2 trainers, mu = 0.5: first order y = mu T / W = 1.0. Measured:
    # 96 samples trained from 64 rollouts, y = 1.5; the paper's mu estimate y W / T = 0.75.
    led = _ledger(mu=0.5, steps=12, rollouts=64, samples_trained=96)
    got = runtime_metrics(led, _D(1, 2, 1.0), pushes=3, skipped=1, wait_seconds=0.25,
                          replica_checks=12, wall=4.0)  # fmt: skip
    assert got["runtime/reuse"] == 1.5 and got["runtime/mu_estimate"] == 0.75
    assert got["runtime/first_order_reuse"] == 1.0
    assert got["runtime/steps_per_second"] == 3.0  # 12 steps / 4 s
    assert (got["runtime/pushes"], got["runtime/pushes_skipped"]) == (3, 1)
    assert math.isnan(got["runtime/node_time"])  # no node clock given (in process)
    # The node's own 3 s (wall less pauses) over t = seconds_train / samples_trained:
    # 0.5 s of training for the 96 samples, so t = 1/192 s and node time = 3 x 192 = 576
    # trained-sample times.
    timed = _ledger(mu=0.5, steps=12, rollouts=64, samples_trained=96, seconds_train=0.5)
    node = runtime_metrics(timed, _D(1, 2, 1.0), pushes=3, skipped=1, wait_seconds=0.25,
                           replica_checks=12, wall=4.0, node_seconds=3.0)  # fmt: skip
    assert node["runtime/node_seconds"] == 3.0
    assert node["runtime/node_time"] == pytest.approx(576.0)
    # Under schedule=sync the configured y = B / R is the prediction; mu is not estimated.
    sync = runtime_metrics(led, _D(None, None, 2.0), pushes=0, skipped=0, wait_seconds=0.0,
                           replica_checks=0, wall=0.0)  # fmt: skip
    assert sync["runtime/first_order_reuse"] == 2.0 and math.isnan(sync["runtime/mu_estimate"])
    assert math.isnan(sync["runtime/steps_per_second"])


def test_groups_go_to_trainer_group_id_mod_T():
    # 3 groups of 2 (ids 4, 5, 6) for T = 2: groups 4 and 6 -> trainer 0, group 5 -> trainer 1.
    batch = rollout_batch([[1]] * 6, [[2]] * 6, group=[4, 4, 5, 5, 6, 6])
    parts = split_by_trainer(batch, 2)
    assert [(t, b.group_id_B.tolist()) for t, b in parts] == [(0, [4, 4, 6, 6]), (1, [5, 5])]
    assert torch.equal(parts[1][1].uid_B, torch.tensor([2, 3]))
    # T = 4: trainers 0, 1, 2 get one group each; trainer 3 none (it is left out).
    assert [t for t, _ in split_by_trainer(batch, 4)] == [0, 1, 2]


SIZES = ("batch_per_trainer", "capacity_per_trainer", "groups_per_batch", "rank_threads")


@pytest.mark.parametrize(
    ("extra", "want"),
    [
        # B = 64, N = 256, G = 8, T = 2: B/T = 32, N/T = 128, B / (G T) = 4 groups per call;
        # a local rank runs 1 thread unless threads= is set
        ([], (32, 128, 4, 1)),
        (["runtime.groups_per_batch=3", "threads=2"], (32, 128, 3, 2)),
    ],
)
def test_rank_sizes_are_derived_at_resolve(extra, want):
    base = ["runtime=distributed", "schedule=async", "schedule.gpus=null", "schedule.workers=1",
            "schedule.trainers=2", "buffer.shards=2", "buffer.capacity=256"]  # fmt: skip
    _, d = resolve(compose([*base, *extra]))
    assert tuple(getattr(d, k) for k in SIZES) == want


def test_one_process_has_the_whole_run_as_its_rank():
    _, d = resolve(compose(["threads=2"]))
    assert (d.batch_per_trainer, d.capacity_per_trainer) == (64, d.capacity)
    assert d.groups_per_batch is None and d.rank_threads == 2


def test_generators_wait_while_the_node_is_paused():
    """A real TCPStore: no key or "0" lets a generator go at once; "1" holds it until trainer
    rank 0 writes "0" (here a thread, after 0.2 s)."""
    store = torch.distributed.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    assert wait_while_paused(store) < 0.05  # never paused yet
    store.set(PAUSE_KEY, "1")
    threading.Timer(0.2, lambda: store.set(PAUSE_KEY, "0")).start()
    assert 0.2 <= wait_while_paused(store) < 2.0
    assert wait_while_paused(store) < 0.05
