"""FIFOBuffer: the paper's replay buffer, checked on long synthetic streams."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from replay_exp.buffer import EmptyBufferError, FIFOBuffer

R, B, STEPS = 16, 64, 400


@pytest.mark.parametrize("N", [256, 200])  # 200 is not a multiple of R
def test_long_stream_statistics(make_rollouts, stored_uses, N):
    buf = FIFOBuffer(capacity=N, max_prompt_len=4, max_completion_len=3, seed=0)
    horizon = math.ceil(N / R)  # steps during which a rollout is trainable
    uses: Counter[int] = Counter()
    age_hist: Counter[int] = Counter()
    max_age = 0
    for t in range(STEPS):
        buf.add(make_rollouts(R, t, t * R, p_width=4, c_width=3), t)
        assert len(buf) == min(N, (t + 1) * R)
        batch = buf.sample(B, t)
        uids = batch.uid_B.tolist()
        assert len(batch) == min(B, (t + 1) * R)  # before the buffer holds B: all of it
        assert len(set(uids)) == len(uids)  # no duplicates within a batch
        assert set(uids) <= set(range(max(0, (t + 1) * R - N), (t + 1) * R))  # only stored
        age = t - batch.created_step_B
        max_age = max(max_age, int(age.max()))
        s = buf.stats()
        assert s["batch_age_max"] == int(age.max())
        assert s["batch_age_mean"] == pytest.approx(float(age.double().mean()))
        assert s["batch_frac_fresh"] == pytest.approx(float((age == 0).double().mean()))
        assert s["batch_prev_uses_mean"] == pytest.approx(sum(uses[u] for u in uids) / len(uids))
        uses.update(uids)
        if t >= horizon:
            age_hist.update(age.tolist())
    assert max_age == horizon - 1

    # Steady state: rollouts generated once the buffer is full and since evicted are each used
    # B/R = 4 times on average. Per rollout uses ~ Binomial(~N/R, B/N), var ~3; the mean of
    # ~5800 of them has sd ~0.02 (0.6%), so 5% is ~8 sd and a broken sampler still fails it.
    n_added = STEPS * R
    steady_evicted = range(horizon * R, n_added - N)
    mean_uses = sum(uses[u] for u in steady_evicted) / len(steady_evicted)
    assert mean_uses == pytest.approx(B / R, rel=0.05)

    # Uniform sampling: the share of uses at age a equals the share of stored rows of age a
    # (R rows per age, fewer for the partially evicted oldest step). ~1600 uses per age
    # (sd ~2.5%), tolerance 15%. Recency-biased sampling would fail this.
    total = sum(age_hist.values())
    for a in range(horizon):
        expected = min(R, N - a * R) / N
        assert age_hist[a] / total == pytest.approx(expected, rel=0.15), a

    # Internal counters agree with what the test saw.
    s = buf.stats()
    assert s["added_total"] == n_added
    assert s["evicted_total"] == n_added - N
    assert s["evicted_unused_total"] == sum(uses[u] == 0 for u in range(n_added - N))
    assert s["sampled_total"] == sum(uses.values())
    stored = stored_uses(buf)
    assert sorted(stored) == list(range(n_added - N, n_added))
    assert stored == {u: uses[u] for u in stored}
    assert s["uses_mean"] == pytest.approx(sum(stored.values()) / N)
    assert s["uses_max"] == max(stored.values())


def test_partial_fill_and_empty(make_rollouts):
    buf = FIFOBuffer(64, 6, 5, seed=1)
    with pytest.raises(EmptyBufferError, match="empty"):
        buf.sample(B, 0)
    buf.add(make_rollouts(10, 0, 0), 0)
    first = buf.sample(B, 0).uid_B.tolist()
    assert sorted(first) == list(range(10))
    assert len(buf) == 10  # nothing removed
    again = buf.sample(4, 1).uid_B.tolist()  # reuse across steps
    s = buf.stats()
    assert s["uses_max"] == 2 and s["sampled_total"] == 14 and s["batch_prev_uses_mean"] == 1
    assert s["frac_never_used"] == 0 and s["uses_mean"] == pytest.approx(14 / 10)
    assert len(set(again)) == 4


def test_seeded_and_random_order(make_rollouts):
    def draws(seed):
        buf = FIFOBuffer(100, 6, 5, seed=seed)
        buf.add(make_rollouts(100, 0, 0), 0)
        return [buf.sample(20, 0).uid_B.tolist() for _ in range(5)]

    a, b, c = draws(3), draws(3), draws(4)
    assert a == b and a != c
    assert any(batch != sorted(batch) for batch in a)  # order within a batch is random
