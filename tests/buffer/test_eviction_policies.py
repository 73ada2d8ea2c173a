"""Eviction policies on small hand-computed streams: exactly which rollouts stay."""

from __future__ import annotations

import pytest

from replay_exp.buffer.positive_bias import correct_slots


def kept(buf) -> list[int]:
    return sorted(buf.store.live_values("uid").tolist())


def test_fifo_keeps_the_n_freshest(build, tiny):
    buf = build(4, name="fifo")
    buf.add(tiny([0, 1, 2], 0), 0)
    assert kept(buf) == [0, 1, 2]
    buf.add(tiny([3, 4, 5], 1), 1)  # 6 > 4: the two oldest leave
    assert kept(buf) == [2, 3, 4, 5]
    buf.add(tiny(list(range(6, 12)), 2), 2)  # one add larger than N keeps its last 4
    assert kept(buf) == [8, 9, 10, 11]
    s = buf.stats()
    assert s["evicted_total"] == s["evicted_unused_total"] == 8 and s["size"] == 4


def test_max_age_drops_rollouts_older_than_a_versions(build, tiny):
    buf = build(100, name="max_age", max_age=1)
    buf.add(tiny([0, 1], 0), 0)
    buf.add(tiny([2, 3], 1), 1)
    assert kept(buf) == [0, 1, 2, 3]  # step 1 - version 0 = 1 <= A
    buf.add(tiny([4, 5], 2), 2)  # version 0 is now 2 > A versions old
    assert kept(buf) == [2, 3, 4, 5]
    # sampling at a later step first evicts what has become too old: versions 2 and 3 stay
    buf.add(tiny([6, 7], 3), 3)
    batch = buf.sample(10, 4)
    assert sorted(batch.uid_B.tolist()) == [6, 7] and kept(buf) == [6, 7]
    assert buf.stats()["batch_version_lag_max"] == 1
    # versions need not arrive in order (async): at step 5, version 3 is out at once
    buf.add(tiny([8, 9, 10], 5, version=[5, 3, 4]), 5)
    assert kept(buf) == [8, 10]
    s = buf.stats()
    # evicted: 0, 1 | 2..5 | 6, 7 (used once) and 9 on arrival
    assert s["evicted_total"] == 9 and s["evicted_unused_total"] == 7


def test_max_age_with_a_capacity_is_also_fifo(build, tiny):
    buf = build(3, name="max_age", max_age=10)
    buf.add(tiny([0, 1], 0), 0)
    buf.add(tiny([2, 3], 1), 1)
    assert kept(buf) == [1, 2, 3]
    buf.add(tiny([4], 12), 12)  # age evicts 1, 2, 3 (versions 0, 1 < 12 - 10)
    assert kept(buf) == [4]


def reference_positive_bias(rewards: dict[int, float], n_fresh: int, n_correct: int) -> list:
    """The paper's definition over the whole stream (uids in arrival order)."""
    uids = sorted(rewards)
    fresh = uids[-n_fresh:] if n_fresh else []
    older_correct = [u for u in uids if u not in fresh and rewards[u] > 0]
    return sorted(fresh + (older_correct[-n_correct:] if n_correct else []))


def test_positive_bias_papers_example(build, tiny):
    # N = 8, delta = 0.75: the 2 freshest plus the 6 freshest older correct ones.
    assert correct_slots(0.75, 8) == 6
    buf = build(8, name="positive_bias", delta=0.75)
    rewards = {u: 0.0 if u % 3 == 2 else 1.0 for u in range(16)}  # 2, 5, 8, 11, 14 wrong
    for step in range(4):
        uids = list(range(4 * step, 4 * step + 4))
        buf.add(tiny(uids, step, reward=[rewards[u] for u in uids]), step)
        seen = {u: rewards[u] for u in range(4 * step + 4)}
        assert kept(buf) == reference_positive_bias(seen, 2, 6), step
    # freshest 2: 14, 15; older correct, freshest first: 13, 12, 10, 9, 7, 6
    assert kept(buf) == [6, 7, 9, 10, 12, 13, 14, 15]
    assert buf.stats()["frac_correct"] == 7 / 8  # only 14 is wrong


def test_positive_bias_edges(build, tiny):
    assert [correct_slots(d, 8) for d in (0.0, 0.2, 0.5, 1.0)] == [0, 2, 4, 8]  # 1.6 -> 2
    # delta = 0 is FIFO
    a, b = build(5, name="positive_bias", delta=0.0), build(5, name="fifo")
    for step in range(4):
        batch = tiny(list(range(3 * step, 3 * step + 3)), step, reward=[1.0, 0.0, 1.0])
        a.add(batch, step)
        b.add(batch, step)
        assert kept(a) == kept(b)
    # no correct rollout at all: only the freshest (1 - delta) N stay
    buf = build(8, name="positive_bias", delta=0.5)
    buf.add(tiny(list(range(20)), 0), 0)
    assert kept(buf) == [16, 17, 18, 19]


def test_priority_keeps_highest_abs_advantage_ties_by_recency(build, tiny):
    buf = build(3, name="priority")
    buf.add(tiny([0, 1, 2, 3, 4, 5], 0, advantage=[0.5, -2.0, 0.1, 1.0, -0.5, 0.0]), 0)
    # |adv| = .5, 2, .1, 1, .5, 0: keep 2 (u1), 1 (u3) and the newer of the two 0.5s (u4)
    assert kept(buf) == [1, 3, 4]
    buf.add(tiny([6], 1, advantage=[0.5]), 1)  # ties u4 at 0.5: the older (u4) leaves
    assert kept(buf) == [1, 3, 6]
    buf.add(tiny([7], 2, advantage=[0.4]), 2)  # below every stored one: evicted on arrival
    assert kept(buf) == [1, 3, 6]
    s = buf.stats()
    assert s["evicted_total"] == s["evicted_unused_total"] == 5


def test_priority_group_reward_variance(build, tiny):
    buf = build(8, name="priority", priority="group_reward_var")
    group = [0] * 4 + [1] * 4 + [2] * 4
    reward = [1, 1, 1, 1] + [1, 0, 0, 0] + [1, 1, 0, 0]  # variances 0, 3/16, 1/4
    buf.add(tiny(list(range(12)), 0, reward=reward, group=group), 0)
    assert kept(buf) == list(range(4, 12))
    prio = dict(
        zip(buf.store.live_values("uid").tolist(), buf.store.live_values("priority"), strict=False)
    )
    assert prio[4] == pytest.approx(3 / 16) and prio[11] == pytest.approx(1 / 4)


def test_max_reuse_retires_after_k_uses(build, tiny):
    buf = build(10, name="fifo", max_reuse=2)
    buf.add(tiny([0, 1, 2, 3], 0), 0)
    buf.sample(4, 0)
    assert len(buf) == 4
    buf.sample(4, 1)  # second use of all four: they leave
    assert len(buf) == 0
    s = buf.stats()
    assert s["retired_total"] == 4 and s["evicted_total"] == 0
    assert buf.telemetry()["replay_count"][2] == 4
    buf.add(tiny([4, 5], 2), 2)
    assert sorted(buf.sample(4, 2).uid_B.tolist()) == [4, 5]  # fewer than B: all of them
