"""OnPolicyBuffer: the no-buffer baseline (queue, newest first, each rollout used once)."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
import torch

from replay_exp.buffer import EmptyBufferError, OnPolicyBuffer
from replay_exp.types import RolloutBatch


def assert_same(a: RolloutBatch, b: RolloutBatch) -> None:
    for f in fields(RolloutBatch):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert x.dtype == y.dtype, f.name
        assert torch.equal(x, y), f.name


def test_r_equals_b_is_exactly_the_no_buffer_loop(make_rollouts):
    B = 12
    buf = OnPolicyBuffer(capacity=64, max_prompt_len=16, max_completion_len=16)
    torch_rng, np_rng = torch.get_rng_state(), np.random.get_state()
    own_rng = buf.rng.bit_generator.state
    for step in range(20):
        fresh = make_rollouts(B, step, step * B, p_width=1 + step % 16, c_width=16 - step % 7)
        buf.add(fresh, step)
        got = buf.sample(B, step)
        assert_same(got, fresh.trimmed())  # same rows, same order, same bits
        assert len(buf) == 0
        s = buf.stats()
        assert s["batch_age_max"] == 0 and s["batch_version_lag_max"] == 0
        assert s["batch_prev_uses_mean"] == 0 and s["batch_frac_fresh"] == 1
    s = buf.stats()
    assert s["sampled_total"] == s["added_total"] == 20 * B and s["evicted_total"] == 0
    # consumed no random numbers: neither global ones nor the buffer's own generator
    assert torch.equal(torch.get_rng_state(), torch_rng)
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), np_rng, strict=True))
    assert buf.rng.bit_generator.state == own_rng


def test_partial_fill_returns_everything_then_empty_raises(make_rollouts):
    buf = OnPolicyBuffer(64, 6, 5)
    with pytest.raises(EmptyBufferError, match="empty"):
        buf.sample(8, 0)
    fresh = make_rollouts(5, 0, 0)
    buf.add(fresh, 0)
    got = buf.sample(8, 0)
    assert_same(got, fresh.trimmed())
    assert len(buf) == 0
    with pytest.raises(EmptyBufferError):
        buf.sample(8, 1)
    with pytest.raises(ValueError, match="batch_size"):
        buf.sample(0, 1)


def test_newest_first_each_used_once(make_rollouts):
    buf = OnPolicyBuffer(64, 6, 5)
    buf.add(make_rollouts(10, 0, 0), 0)
    assert buf.sample(4, 0).uid_B.tolist() == [6, 7, 8, 9]
    assert len(buf) == 6
    buf.add(make_rollouts(2, 1, 10), 1)
    # the newest 4 not yet used, in generation order
    assert buf.sample(4, 1).uid_B.tolist() == [4, 5, 10, 11]
    assert buf.sample(100, 2).uid_B.tolist() == [0, 1, 2, 3]
    assert len(buf) == 0
    s = buf.stats()
    assert s["sampled_total"] == s["added_total"] == 12
    assert s["batch_age_mean"] == 2  # rows 0..3 were generated at step 0 and used at step 2


def test_unconsumed_overflow_is_evicted_oldest_first(make_rollouts):
    buf = OnPolicyBuffer(capacity=8, max_prompt_len=6, max_completion_len=5)
    buf.add(make_rollouts(6, 0, 0), 0)
    assert buf.sample(2, 0).uid_B.tolist() == [4, 5]  # 0..3 left waiting
    buf.add(make_rollouts(6, 1, 6), 1)  # 10 waiting > 8: 0 and 1 are evicted unused
    s = buf.stats()
    assert s["evicted_total"] == s["evicted_unused_total"] == 2
    assert s["size"] == 8 and s["frac_never_used"] == 1 and s["uses_max"] == 0
    assert buf.sample(8, 1).uid_B.tolist() == [2, 3, 6, 7, 8, 9, 10, 11]
