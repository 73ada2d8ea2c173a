"""Sharded buffers: whole groups dealt round-robin, B/T per shard, one buffer to the trainer."""

from __future__ import annotations

import pytest

from replay_exp.buffer import EmptyBufferError, ShardedBuffer


def shard_uids(buf) -> list[list[int]]:
    return [sorted(s.store.live_values("uid").tolist()) for s in buf.shards]


def test_groups_are_dealt_round_robin_across_adds(build, tiny):
    buf = build(8, name="fifo", shards=2)
    assert isinstance(buf, ShardedBuffer) and [s.store.capacity for s in buf.shards] == [4, 4]
    # 3 groups of 2 (group id = uid // 2): groups 0, 2 -> shard 0, group 1 -> shard 1
    buf.add(tiny([0, 1, 2, 3, 4, 5], 0, group=[0, 0, 1, 1, 2, 2]), 0)
    assert shard_uids(buf) == [[0, 1, 4, 5], [2, 3]]
    # the cursor carries over: the next group goes to shard 1, then shard 0
    buf.add(tiny([6, 7, 8, 9], 1, group=[3, 3, 4, 4]), 1)
    assert shard_uids(buf) == [[4, 5, 8, 9], [2, 3, 6, 7]]  # shard 0 (N/T = 4) evicted 0, 1
    assert len(buf) == 8
    s = buf.stats()
    assert (s["size"], s["capacity"], s["added_total"], s["evicted_total"]) == (8, 8, 10, 2)


def test_sample_takes_b_over_t_from_each_shard(build, tiny):
    buf = build(8, name="fifo", shards=2, seed=3)
    buf.add(tiny([0, 1, 2, 3, 4, 5], 0, group=[0, 0, 1, 1, 2, 2]), 0)
    for _ in range(20):
        uids = buf.sample(4, 0).uid_B.tolist()
        assert len(set(uids)) == 4
        assert set(uids[:2]) <= {0, 1, 4, 5} and set(uids[2:]) == {2, 3}  # shard order
    assert buf.stats()["batch_size"] == 4 and buf.stats()["sampled_total"] == 80
    with pytest.raises(ValueError, match="multiple of 2 shards"):
        buf.sample(3, 0)
    # shard 1's two rows are in every batch (20 uses each), shard 0's four share 40 uses
    assert buf.shards[1].store.live_values("uses").tolist() == [20, 20]
    assert buf.shards[0].store.live_values("uses").sum() == 40
    tel = buf.telemetry()
    assert sum(tel["age"]) == 80 and tel["replay_count_live"][20] >= 2


def test_empty_shards(build, tiny):
    buf = build(8, name="fifo", shards=2)
    with pytest.raises(EmptyBufferError):
        buf.sample(4, 0)
    buf.add(tiny([0, 1], 0, group=[0, 0]), 0)  # one group: shard 1 stays empty
    assert sorted(buf.sample(4, 0).uid_B.tolist()) == [0, 1]  # a smaller batch, no error


def test_shards_draw_independent_streams(build, tiny):
    buf = build(16, name="fifo", shards=2, seed=0)
    states = [s.rng.bit_generator.state["state"]["state"] for s in buf.shards]
    assert states[0] != states[1]
