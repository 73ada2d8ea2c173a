"""RolloutStore and its index structures: encoding round trip, widths, slots, lazy growth."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
import torch

from replay_exp.buffer.store import RolloutStore, SlotQueue, SlotSet
from replay_exp.types import RolloutBatch


def assert_same(a: RolloutBatch, b: RolloutBatch) -> None:
    for f in fields(RolloutBatch):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert x.dtype == y.dtype, f.name
        assert torch.equal(x, y), f.name


def test_round_trip_mixed_widths_is_bit_identical(make_rollouts):
    store = RolloutStore(64, max_prompt_len=10, max_completion_len=9)
    a = make_rollouts(5, 0, 0, p_width=3, c_width=9)
    b = make_rollouts(4, 0, 5, p_width=10, c_width=2)
    slots = np.concatenate([store.append(a), store.append(b)])
    out = store.gather(slots)
    # cat() pads with 0 like the store does beyond a batch's own width; PAD_ID is kept inside it
    assert_same(out, RolloutBatch.cat([a, b]).trimmed())
    assert out.prompt_ids_BxP.dtype == torch.int64 and out.prompt_mask_BxP.dtype == torch.bool
    # a subset is trimmed to its own widths: rows 1..4 of `a` never reach prompt width 3
    sub = store.gather(slots[[3, 1]])
    assert_same(sub, a.index(torch.tensor([3, 1])).trimmed())


def test_storage_dtypes_are_compact(make_rollouts):
    store = RolloutStore(8, 4, 4)
    store.append(make_rollouts(3, 0, 0, p_width=4, c_width=4))
    assert store.rows["prompt_ids"].dtype == np.int32
    assert store.rows["completion_ids"].dtype == np.int32
    assert store.rows["behaviour_logp"].dtype == np.float32
    assert "prompt_mask" not in store.rows and store.rows["prompt_len"].dtype == np.int32


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
    assert_same(store.gather(store.append(b)), b.trimmed())


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


def test_freed_slots_are_reused_and_rows_overwritten(make_rollouts):
    store = RolloutStore(10, 6, 5)
    s0 = store.append(make_rollouts(4, 0, 0))
    assert s0.tolist() == [0, 1, 2, 3]
    store.free(np.array([1, 2]))
    assert sorted(store.live.members().tolist()) == [0, 3] and len(store) == 2
    b = make_rollouts(3, 1, 4)
    s1 = store.append(b)
    assert s1.tolist() == [2, 1, 4]  # the free stack (last freed first), then a fresh slot
    assert_same(store.gather(s1), b.trimmed())
    assert store.rows["seq"][s1].tolist() == [4, 5, 6]  # insertion numbers keep counting
    assert store.rows["uses"][s1].tolist() == [0, 0, 0]
    assert store.current(s0, np.array([0, 1, 2, 3])).tolist() == [True, False, False, True]


def test_lazy_growth_by_doubling(make_rollouts):
    store = RolloutStore(559_872, max_prompt_len=512, max_completion_len=1024)
    sizes = []
    for i in range(10):
        store.append(make_rollouts(10, i, 10 * i))
        sizes.append(store.allocated)
    assert len(store) == 100
    assert sizes == [16, 32, 32, 64, 64, 64, 128, 128, 128, 128]
    nbytes = sum(v.nbytes for v in store.rows.values())
    # 128 rows x (ids + log-probs + engine gaps, 4 bytes each, + 6 x 4 + 7 x 8 bytes of
    # metadata): ~1.9 MB
    assert nbytes == 128 * ((512 + 3 * 1024) * 4 + 80)


def test_growth_is_capped_at_capacity_plus_one_add(make_rollouts):
    store = RolloutStore(40, 6, 5)
    store.append(make_rollouts(30, 0, 0))
    assert store.allocated == 30  # max(needed, 2 x allocated, 16)
    store.append(make_rollouts(12, 1, 30))  # 42 rows before the policy evicts: beyond N
    assert store.allocated == 42


def test_slot_set_add_remove_sample():
    s, ref = SlotSet(), set()
    rng = np.random.default_rng(0)
    for _ in range(200):
        if ref and rng.random() < 0.45:
            out = rng.choice(sorted(ref), size=rng.integers(1, len(ref) + 1), replace=False)
            s.remove(out)
            ref -= set(out.tolist())
        else:
            new = np.setdiff1d(rng.integers(0, 300, size=5), sorted(ref))
            s.add(new)
            ref |= set(new.tolist())
        assert len(s) == len(ref) and set(s.members().tolist()) == ref
        assert (s.pos[s.members()] == np.arange(len(s))).all()
        probe = np.arange(320)
        assert s.contains(probe).tolist() == [i in ref for i in range(320)]
        k = min(len(ref), 4)
        got = s.sample(k, rng)
        assert len(set(got.tolist())) == k and set(got.tolist()) <= ref


def test_slot_queue_order_discard_and_compaction():
    q = SlotQueue()
    seq = 0
    ref: list[int] = []
    for step in range(60):
        slots = np.arange(step * 3, step * 3 + 3)
        q.push(slots, np.arange(seq, seq + 3))
        seq += 3
        ref += slots.tolist()
        q.discard(np.array([ref[len(ref) // 2]]))  # one from the middle goes stale
        ref.pop(len(ref) // 2)
        if step % 5 == 4:
            assert q.pop_front(4).tolist() == ref[:4]
            ref = ref[4:]
        if step % 7 == 6:
            assert q.pop_back(2).tolist() == ref[-2:]
            ref = ref[:-2]
        assert len(q) == len(ref) and q.members().tolist() == ref
    assert len(q.slot) < 4 * len(ref) + 64  # stale entries were compacted away
    assert q.pop_front(10**6).tolist() == ref and len(q) == 0
    assert q.pop_back(3).tolist() == []
