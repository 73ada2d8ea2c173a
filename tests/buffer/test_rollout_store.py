"""RolloutStore: encoding round trip, widths, ring eviction, lazy growth, telemetry."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest
import torch

from replay_exp.buffer.base import RolloutStore
from replay_exp.types import RolloutBatch


def assert_same(a: RolloutBatch, b: RolloutBatch) -> None:
    for f in fields(RolloutBatch):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert x.dtype == y.dtype, f.name
        assert torch.equal(x, y), f.name


def stored_uids(store: RolloutStore) -> list[int]:
    return store.state_dict()["rows"]["uid"].tolist()


def test_round_trip_mixed_widths_is_bit_identical(make_rollouts):
    store = RolloutStore(64, max_prompt_len=10, max_completion_len=9)
    a = make_rollouts(5, 0, 0, p_width=3, c_width=9)
    b = make_rollouts(4, 0, 5, p_width=10, c_width=2)
    store.append(a)
    store.append(b)
    out = store.gather(torch.arange(9), step=0)
    # cat() pads with 0 like the store does beyond a batch's own width; PAD_ID is kept inside it
    assert_same(out, RolloutBatch.cat([a, b]).trimmed())
    assert out.prompt_ids_BxP.dtype == torch.int64 and out.prompt_mask_BxP.dtype == torch.bool
    # a subset is trimmed to its own widths: rows 1..4 of `a` never reach prompt width 3
    sub = store.gather(torch.tensor([3, 1]), step=0)
    assert_same(sub, a.index(torch.tensor([3, 1])).trimmed())


def test_storage_dtypes_are_compact(make_rollouts):
    store = RolloutStore(8, 4, 4)
    store.append(make_rollouts(3, 0, 0, p_width=4, c_width=4))
    rows = store.state_dict()["rows"]
    assert rows["prompt_ids"].dtype == torch.int32
    assert rows["completion_ids"].dtype == torch.int32
    assert rows["behaviour_logp"].dtype == torch.float32
    assert "prompt_mask" not in rows and rows["prompt_len"].shape == (3,)


def test_rows_wider_than_store_raise(make_rollouts):
    store = RolloutStore(8, max_prompt_len=4, max_completion_len=3)
    with pytest.raises(ValueError, match="max_prompt_len=4"):
        store.append(make_rollouts(2, 0, 0, p_width=5, c_width=3))
    with pytest.raises(ValueError, match="max_completion_len=3"):
        store.append(make_rollouts(2, 0, 0, p_width=4, c_width=4))
    assert len(store) == 0


def test_wide_tensors_with_short_rows_are_accepted(make_rollouts):
    store = RolloutStore(8, max_prompt_len=4, max_completion_len=3)
    b = make_rollouts(3, 0, 0, p_width=4, c_width=3).pad_to(7, 6)  # all-pad extra columns
    store.append(b)
    assert_same(store.gather(torch.arange(3), 0), b.trimmed())


def test_non_contiguous_masks_and_big_ids_raise(make_rollouts):
    store = RolloutStore(8, 6, 5)
    b = make_rollouts(2, 0, 0)
    b.completion_mask_BxC = b.completion_mask_BxC.clone()
    b.completion_mask_BxC[1, 0] = False  # a hole at the start of a right-padded completion
    with pytest.raises(ValueError, match="right-padded"):
        store.append(b)
    b = make_rollouts(2, 0, 0)
    b.prompt_mask_BxP = b.prompt_mask_BxP.flip(1)
    with pytest.raises(ValueError, match="left-padded"):
        store.append(b)
    b = make_rollouts(2, 0, 0)
    b.prompt_ids_BxP[0, -1] = 2**31
    with pytest.raises(ValueError, match="int32"):
        store.append(b)


def test_ring_evicts_oldest_and_counts(make_rollouts):
    store = RolloutStore(10, 6, 5)
    uid = 0
    expected: list[int] = []
    for step, R in enumerate([4, 3, 7, 1, 12, 5]):  # 12 > capacity: only its last 10 stay
        store.append(make_rollouts(R, step, uid))
        expected = (expected + list(range(uid, uid + R)))[-10:]
        uid += R
        assert stored_uids(store) == expected
        assert len(store) == len(expected)
    s = store.stats()
    assert s["added_total"] == uid == 32
    assert s["evicted_total"] == s["evicted_unused_total"] == 22
    # full-width rows are overwritten when a slot is reused: logical order reads back exactly
    assert store.gather(torch.arange(10), 6).uid_B.tolist() == expected


def test_lazy_growth_by_doubling(make_rollouts):
    store = RolloutStore(559_872, max_prompt_len=512, max_completion_len=1024)
    sizes = []
    for i in range(10):
        store.append(make_rollouts(10, i, 10 * i))
        sizes.append(store.allocated)
    assert len(store) == 100
    assert sizes == [16, 32, 32, 64, 64, 64, 128, 128, 128, 128]
    nbytes = sum(t.numel() * t.element_size() for t in store._rows.values())
    # 128 rows x (ids + log-probs, 4 bytes each + 64 bytes of metadata): ~1.3 MB, not ~5.7 GB
    assert nbytes == 128 * ((512 + 2 * 1024) * 4 + 64)


def test_growth_preserves_wrapped_order(make_rollouts):
    store = RolloutStore(40, 6, 5)
    uid, expected = 0, []
    for step, R in enumerate([16, 16, 6, 11, 9, 30, 3]):
        store.append(make_rollouts(R, step, uid))
        expected = (expected + list(range(uid, uid + R)))[-40:]
        uid += R
        assert stored_uids(store) == expected
    assert store.allocated == 40


def test_telemetry_and_stats(make_rollouts):
    store = RolloutStore(8, 6, 5)
    b = make_rollouts(4, 0, 0)
    b.reward_B = torch.tensor([1.0, 0.0, 0.0, 1.0])
    store.append(b)
    store.append(make_rollouts(2, 2, 4, version=1))  # created at step 2 by version 1
    s = store.stats()
    assert math.isnan(s["batch_age_mean"])
    store.gather(torch.tensor([0, 4]), step=3)  # ages 3 and 1; lags 3 and 2
    store.gather(torch.tensor([0, 1, 5]), step=4)  # ages 4, 4, 2; lags 4, 4, 3; prev uses 1,0,0
    s = store.stats()
    assert s["batch_age_mean"] == pytest.approx(10 / 3)
    assert s["batch_age_max"] == 4
    assert s["batch_version_lag_mean"] == pytest.approx(11 / 3)
    assert s["batch_version_lag_max"] == 4
    assert s["batch_prev_uses_mean"] == pytest.approx(1 / 3)
    assert s["batch_frac_fresh"] == 0
    rows = store.state_dict()["rows"]
    assert rows["uses"].tolist() == [2, 1, 0, 0, 1, 1]
    assert rows["last_used_step"].tolist() == [4, 4, -1, -1, 3, 4]
    assert s["uses_mean"] == pytest.approx(5 / 6) and s["uses_max"] == 2
    assert s["frac_never_used"] == pytest.approx(2 / 6)
    assert s["frac_correct"] == pytest.approx((2 + int(rows["reward"][4:].gt(0).sum())) / 6)
    assert s["sampled_total"] == 5 and s["size"] == 6 and s["capacity"] == 8
    store.gather(torch.tensor([3]), step=4)  # created at step 0 -> age 4, not fresh
    assert store.stats()["batch_frac_fresh"] == 0
    store.gather(torch.tensor([5]), step=2)
    assert store.stats()["batch_frac_fresh"] == 1
    # evict all six: row 2 was never used (row 3 was used just above)
    store.append(make_rollouts(8, 5, 6))
    s = store.stats()
    assert s["evicted_total"] == 6 and s["evicted_unused_total"] == 1
