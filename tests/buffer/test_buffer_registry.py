"""Registry, make_buffer, interface, and resume equivalence for every eviction x sampling."""

from __future__ import annotations

import io
import math
from dataclasses import fields

import pytest
import torch

from replay_exp.buffer import (
    BUFFERS,
    SAMPLERS,
    FIFOBuffer,
    OnPolicyBuffer,
    PolicyBuffer,
    ReplayBuffer,
    ShardedBuffer,
    make_buffer,
)
from replay_exp.buffer.fifo import FIFO
from replay_exp.buffer.max_age import MaxAge
from replay_exp.buffer.on_policy import OnPolicy
from replay_exp.buffer.positive_bias import PositiveBias
from replay_exp.buffer.priority import Priority
from replay_exp.config.schemas import build_node
from replay_exp.types import RolloutBatch

# every valid (eviction, sampling) pair with the extra keys it needs
EXTRA = {"max_age": {"max_age": 2}, "positive_bias": {"delta": 0.5}}
COMBOS = [
    (name, sampling)
    for name in sorted(BUFFERS)
    for sampling in sorted(SAMPLERS)
    if name != "on_policy" or sampling == "uniform"
]


def spec_for(name: str, sampling: str, **kw) -> dict:
    extra = {"recency_tau": 2.0} if sampling == "recency" else {}
    return {"name": name, "sampling": sampling, **EXTRA.get(name, {}), **extra, **kw}


def test_registry():
    assert {
        "on_policy": OnPolicy, "fifo": FIFO, "max_age": MaxAge,
        "positive_bias": PositiveBias, "priority": Priority,
    } == BUFFERS  # fmt: skip
    assert sorted(SAMPLERS) == [
        "never_used_first", "prioritized", "recency", "uniform", "without_replacement",
    ]  # fmt: skip
    assert len(COMBOS) == 21
    for name, sampling in COMBOS:
        buf = make_buffer(
            spec_for(name, sampling), capacity=8, max_prompt_len=4, max_completion_len=4, seed=0
        )
        assert isinstance(buf, PolicyBuffer) and isinstance(buf, ReplayBuffer)
        assert type(buf.eviction) is BUFFERS[name] and type(buf.sampler) is SAMPLERS[sampling]
    with pytest.raises(ValueError, match=r"buffer.name=lifo is unknown.*'on_policy'"):
        make_buffer({"name": "lifo"}, capacity=8, max_prompt_len=4, max_completion_len=4, seed=0)
    with pytest.raises(TypeError):
        ReplayBuffer()  # abstract


def test_make_buffer_from_config_forms():
    kw = dict(max_prompt_len=4, max_completion_len=4, seed=0)
    # The option's schema with its YAML defaults (the only defaults there are) under the values.
    node = build_node("buffer", "fifo", capacity=12, sampling="never_used_first", max_reuse=3)
    assert node.shards == 1 and node.priority == "abs_advantage"  # from conf/buffer/_base.yaml
    for bcfg in (node, {"name": "fifo", "capacity": 12, "sampling": "never_used_first",
                        "max_reuse": 3}):  # fmt: skip
        buf = make_buffer(bcfg, **kw)
        assert buf.store.capacity == 12 and buf.max_reuse == 3
    assert make_buffer(node, capacity=20, **kw).store.capacity == 20  # the resolved N wins
    sharded = make_buffer({"name": "fifo", "capacity": 12, "shards": 3}, **kw)
    assert isinstance(sharded, ShardedBuffer)
    assert [b.store.capacity for b in sharded.shards] == [4, 4, 4]
    assert make_buffer({"name": "fifo"}, **kw).store.capacity == 256  # conf/buffer/fifo.yaml
    with pytest.raises(ValueError, match="capacity=null"):
        make_buffer({"name": "on_policy"}, **kw)  # its YAML leaves N to resolve()
    with pytest.raises(ValueError, match=r"buffer=fifo has no key buffer.capcity"):
        make_buffer({"name": "fifo", "capacity": 4, "capcity": 5}, **kw)
    # An eviction knob belongs to its option: buffer=fifo has no delta.
    with pytest.raises(ValueError, match=r"buffer=fifo has no key buffer.delta"):
        make_buffer({"name": "fifo", "capacity": 4, "delta": 0.5}, **kw)
    assert make_buffer({"name": "positive_bias", "capacity": 4}, **kw).eviction.n_correct == 2
    # the shorthands build the same policies
    assert type(FIFOBuffer(8, 2, 2).eviction) is FIFO
    assert type(OnPolicyBuffer(8, 2, 2).eviction) is OnPolicy


def _step(buf: ReplayBuffer, make_rollouts, t: int) -> RolloutBatch:
    R = 4 * (1 + t % 3)  # R != B and varying, so on_policy keeps leftovers and others reuse
    b = make_rollouts(R, t, 1000 * t, p_width=1 + t % 9, c_width=1 + t % 7)
    b.version_B = b.version_B - t % 2  # some one-version lag, for max_age
    buf.add(b, t)
    return buf.sample(6, t)


def _equal_stats(sa: dict, sb: dict) -> None:
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k] == sb[k] or (math.isnan(sa[k]) and math.isnan(sb[k])), k


@pytest.mark.parametrize(("name", "sampling"), COMBOS)
def test_state_dict_round_trip_gives_same_future(make_rollouts, name, sampling):
    # long multi-width streams here; test_buffer_properties adds shards and random streams
    shards = 1 if name == "on_policy" else 2
    kw = dict(capacity=24, max_prompt_len=9, max_completion_len=7)
    spec = spec_for(name, sampling, shards=shards)
    if name != "on_policy":
        spec["max_reuse"] = 3
    buf = make_buffer(spec, **kw, seed=0)
    for t in range(16):
        _step(buf, make_rollouts, t)
    blob = io.BytesIO()
    torch.save(buf.state_dict(), blob)
    blob.seek(0)
    restored = make_buffer(spec, **kw, seed=12345)  # a different seed: state must override it
    restored.load_state_dict(torch.load(blob, weights_only=True))
    assert len(restored) == len(buf)
    _equal_stats(restored.stats(), buf.stats())
    for t in range(16, 26):
        a, b = _step(buf, make_rollouts, t), _step(restored, make_rollouts, t)
        for f in fields(RolloutBatch):
            assert torch.equal(getattr(a, f.name), getattr(b, f.name)), (t, f.name)
        _equal_stats(buf.stats(), restored.stats())
    assert buf.telemetry() == restored.telemetry()


def test_load_rejects_other_sizes_and_policies():
    kw = dict(max_prompt_len=9, max_completion_len=7, seed=0)
    buf = make_buffer({"name": "fifo", "capacity": 24}, **kw)
    other = make_buffer({"name": "fifo", "capacity": 25}, **kw)
    with pytest.raises(ValueError, match="capacity"):
        other.load_state_dict(buf.state_dict())
    other = make_buffer({"name": "fifo", "capacity": 24, "sampling": "never_used_first"}, **kw)
    with pytest.raises(ValueError, match="fifo/uniform"):
        other.load_state_dict(buf.state_dict())


STATS_KEYS = {
    "size", "capacity", "uses_mean", "uses_max", "frac_never_used", "frac_correct",
    "added_total", "evicted_total", "evicted_unused_total", "retired_total", "sampled_total",
    "dropped_stale_total",
    "batch_size", "batch_frac_fresh", "batch_frac_first_use",
    *(f"batch_{s}_{m}" for s in ("age", "version_lag", "prev_uses", "since_last_use")
      for m in ("mean", "max", "p50", "p90")),
    "run_version_lag_mean", "run_age_mean", "run_prev_uses_mean", "run_since_last_use_mean",
    "run_frac_first_use", "run_frac_fresh", "run_replay_count_mean",
}  # fmt: skip


@pytest.mark.parametrize("shards", [1, 2])
def test_stats_and_telemetry_keys(make_rollouts, shards):
    for name, sampling in COMBOS:
        buf = make_buffer(
            spec_for(name, sampling, shards=1 if name == "on_policy" else shards),
            capacity=24, max_prompt_len=9, max_completion_len=7, seed=0,
        )  # fmt: skip
        _step(buf, make_rollouts, 0)
        s = buf.stats()
        assert set(s) == STATS_KEYS
        assert all(isinstance(v, float) for v in s.values())
        tel = buf.telemetry()
        assert set(tel) == {
            "off_policiness", "age", "prev_uses", "steps_since_last_use", "replay_count",
            "replay_count_live",
        }  # fmt: skip
        assert all(len(v) == 65 and all(isinstance(x, int) for x in v) for v in tel.values())
        # one group of 4 arrives: a second shard stays empty, the first gives B/T = 3
        expected = 4 if shards == 1 or name == "on_policy" else 3
        assert sum(tel["age"]) == s["sampled_total"] == s["batch_size"] == expected
