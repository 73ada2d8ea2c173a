"""Registry, interface, and resume equivalence for every registered buffer."""

from __future__ import annotations

import io
import math
from dataclasses import fields

import pytest
import torch

from replay_exp.buffer import BUFFERS, FIFOBuffer, OnPolicyBuffer, ReplayBuffer, make_buffer
from replay_exp.types import RolloutBatch


def test_registry():
    assert {"on_policy": OnPolicyBuffer, "fifo": FIFOBuffer} == BUFFERS
    for name, cls in BUFFERS.items():
        buf = make_buffer(name, capacity=8, max_prompt_len=4, max_completion_len=4, seed=0)
        assert type(buf) is cls and isinstance(buf, ReplayBuffer)
    with pytest.raises(ValueError, match=r"'lifo'.*\['fifo', 'on_policy'\]"):
        make_buffer("lifo", capacity=8, max_prompt_len=4, max_completion_len=4, seed=0)
    with pytest.raises(TypeError):
        ReplayBuffer()  # abstract


def _step(buf: ReplayBuffer, make_rollouts, t: int) -> tuple[RolloutBatch, dict]:
    R = 5 + t % 4  # R != B and varying, so on_policy keeps leftovers and fifo reuses
    buf.add(make_rollouts(R, t, 1000 * t, p_width=1 + t % 9, c_width=1 + t % 7), t)
    return buf.sample(6, t), buf.stats()


@pytest.mark.parametrize("name", sorted(BUFFERS))
def test_state_dict_round_trip_gives_same_future(make_rollouts, name):
    kw = dict(capacity=24, max_prompt_len=9, max_completion_len=7)
    buf = make_buffer(name, **kw, seed=0)
    for t in range(30):
        _step(buf, make_rollouts, t)
    blob = io.BytesIO()
    torch.save(buf.state_dict(), blob)
    blob.seek(0)
    restored = make_buffer(name, **kw, seed=12345)  # a different seed: state must override it
    restored.load_state_dict(torch.load(blob, weights_only=True))
    assert len(restored) == len(buf)
    for t in range(30, 50):
        (a, sa), (b, sb) = _step(buf, make_rollouts, t), _step(restored, make_rollouts, t)
        for f in fields(RolloutBatch):
            assert torch.equal(getattr(a, f.name), getattr(b, f.name)), (t, f.name)
        assert sa.keys() == sb.keys()
        for k in sa:
            assert sa[k] == sb[k] or (math.isnan(sa[k]) and math.isnan(sb[k])), k


def test_load_rejects_other_sizes(make_rollouts):
    buf = make_buffer("fifo", capacity=24, max_prompt_len=9, max_completion_len=7, seed=0)
    other = make_buffer("fifo", capacity=25, max_prompt_len=9, max_completion_len=7, seed=0)
    with pytest.raises(ValueError, match="capacity"):
        other.load_state_dict(buf.state_dict())


def test_stats_keys_are_unprefixed_floats(make_rollouts):
    for name in BUFFERS:
        buf = make_buffer(name, capacity=24, max_prompt_len=9, max_completion_len=7, seed=0)
        _, s = _step(buf, make_rollouts, 0)
        assert set(s) == {
            "size", "capacity", "uses_mean", "uses_max", "frac_never_used", "frac_correct",
            "added_total", "evicted_total", "evicted_unused_total", "sampled_total",
            "batch_age_mean", "batch_age_max", "batch_version_lag_mean",
            "batch_version_lag_max", "batch_prev_uses_mean", "batch_frac_fresh",
        }  # fmt: skip
        assert all(isinstance(v, float) for v in s.values())
