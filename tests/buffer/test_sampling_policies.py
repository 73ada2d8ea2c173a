"""Sampling policies on tiny buffers: exact support and frequencies (chi-square, fixed seeds).

Randomized samplers are checked against hand-computed probabilities of each possible batch.
"Successive sampling" without replacement: P(i then j) = w_i / W * w_j / (W - w_i).
The chi-square thresholds are the 0.999 quantiles, so a correct sampler fails with
probability 1e-3 per check at a random seed, and never with the fixed seeds used here.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest

CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 5: 20.52, 7: 24.32, 9: 27.88}


def chi_square(counts: Counter, probs: dict, n: int) -> float:
    assert set(counts) <= {k for k, p in probs.items() if p > 0}, "draw outside the support"
    return sum((counts[k] - n * p) ** 2 / (n * p) for k, p in probs.items() if p > 0)


def assert_frequencies(counts: Counter, probs: dict, n: int) -> None:
    assert sum(probs.values()) == pytest.approx(1.0)
    support = {k for k, p in probs.items() if p > 0}
    assert set(counts) == support  # exact support: every possible batch seen, no other
    df = len(support) - 1
    assert chi_square(counts, probs, n) < CHI2_999[df], (counts, probs)


def pair_probs(w: dict[int, float]) -> dict[frozenset, float]:
    W = sum(w.values())
    out: dict[frozenset, float] = {}
    for i, j in itertools.permutations(w, 2):
        p = w[i] / W * w[j] / (W - w[i])
        out[frozenset((i, j))] = out.get(frozenset((i, j)), 0.0) + p
    return out


def draw(buf, B: int, step: int, n: int, ordered: bool = False) -> Counter:
    c: Counter = Counter()
    for _ in range(n):
        uids = buf.sample(B, step).uid_B.tolist()
        assert len(uids) == len(set(uids)) == B
        c[tuple(uids) if ordered else frozenset(uids) if B > 1 else uids[0]] += 1
    return c


def test_uniform_pairs_are_equally_likely(build, tiny):
    buf = build(5, name="fifo", seed=1)
    buf.add(tiny([0, 1, 2, 3, 4], 0), 0)
    n = 3000
    counts = draw(buf, 2, 0, n)
    assert_frequencies(counts, {frozenset(p): 0.1 for p in itertools.combinations(range(5), 2)}, n)
    assert len(buf) == 5 and buf.stats()["uses_mean"] == 2 * n / 5  # nothing removed


def test_without_replacement_runs_epochs(build, tiny):
    buf = build(10, name="fifo", sampling="without_replacement", seed=2)
    buf.add(tiny([0, 1, 2, 3, 4, 5], 0), 0)
    b1 = buf.sample(4, 0).uid_B.tolist()
    b2 = buf.sample(4, 1).uid_B.tolist()
    # the epoch's last two first, then two of the new epoch, not repeating those two
    assert set(b1) | set(b2[:2]) == set(range(6)) and len(set(b2)) == 4
    for t in range(2, 30):
        buf.sample(4, t)
    # 120 draws = 20 epochs of 6: every rollout used exactly 20 times
    assert buf.stats()["uses_max"] == buf.store.live_values("uses").min() == 20
    # a new arrival joins the current epoch
    buf.add(tiny([6], 30), 30)
    epoch = [buf.sample(1, 30).uid_B.item() for _ in range(7)]
    assert sorted(epoch) == list(range(7))


def test_never_used_first(build, tiny):
    buf = build(16, name="fifo", sampling="never_used_first", seed=3)
    buf.add(tiny([0, 1, 2, 3], 0), 0)
    first = buf.sample(3, 0).uid_B.tolist()
    (unused,) = set(range(4)) - set(first)
    buf.add(tiny([4, 5, 6, 7], 1), 1)
    batch = buf.sample(6, 1).uid_B.tolist()
    assert set(batch[:5]) == {unused, 4, 5, 6, 7}  # every never-used one, first
    assert batch[5] in first
    # then uniform among the used ones once none is left unused
    n = 2000
    counts = draw(buf, 1, 2, n)
    assert_frequencies(counts, {u: 1 / 8 for u in range(8)}, n)


def recency_buffer(build, tiny, tau: float, seed: int = 4):
    buf = build(16, name="fifo", sampling="recency", recency_tau=tau, seed=seed)
    buf.add(tiny([0, 1], 0), 0)  # two rows in the step-0 bucket
    buf.add(tiny([2], 1), 1)
    buf.add(tiny([3], 2), 2)
    return buf


def test_recency_weights(build, tiny):
    # at step 2, tau = 1: ages 2, 2, 1, 0 -> weights e^-2, e^-2, e^-1, 1
    w = {0: math.exp(-2), 1: math.exp(-2), 2: math.exp(-1), 3: 1.0}
    W = sum(w.values())
    buf = recency_buffer(build, tiny, tau=1.0)
    n = 2000
    assert_frequencies(draw(buf, 1, 2, n), {u: x / W for u, x in w.items()}, n)
    assert_frequencies(draw(buf, 2, 2, n), pair_probs(w), n)
    # one step later every age grows by 1: relative weights are unchanged
    assert_frequencies(draw(buf, 1, 3, n), {u: x / W for u, x in w.items()}, n)


def test_recency_extreme_tau_falls_back_exactly(build, tiny):
    # tau = 0.001: e^-1000 per step of age; the i.i.d. draws only ever see uid 3, so the
    # exact fallback must continue: 3, then 2, then 0 and 1 in random order
    buf = recency_buffer(build, tiny, tau=0.001)
    orders = Counter(tuple(buf.sample(4, 2).uid_B.tolist()) for _ in range(200))
    assert set(orders) == {(3, 2, 0, 1), (3, 2, 1, 0)}
    assert min(orders.values()) > 60


def prioritized_buffer(build, tiny, alpha: float, seed: int = 5):
    buf = build(8, name="fifo", sampling="prioritized", priority_alpha=alpha, seed=seed)
    buf.add(tiny([0, 1, 2, 3], 0, advantage=[1.0, -2.0, 3.0, 0.0]), 0)
    return buf


def test_prioritized_weights(build, tiny):
    buf = prioritized_buffer(build, tiny, alpha=1.0)
    n = 2000
    w = {0: 1.0, 1: 2.0, 2: 3.0, 3: 0.0}  # |advantage|; uid 3 has weight 0
    assert_frequencies(draw(buf, 1, 0, n), {u: x / 6 for u, x in w.items()}, n)
    assert_frequencies(draw(buf, 2, 0, n), pair_probs({0: 1.0, 1: 2.0, 2: 3.0}), n)
    # the weight-0 rollout comes only once every positive one is in the batch
    assert all(buf.sample(4, 0).uid_B.tolist()[3] == 3 for _ in range(50))
    # alpha = 0.5: weights sqrt(|advantage|); alpha = 0: uniform, even for priority 0
    buf = prioritized_buffer(build, tiny, alpha=0.5)
    ws = {u: math.sqrt(x) for u, x in w.items()}
    assert_frequencies(draw(buf, 1, 0, n), {u: x / sum(ws.values()) for u, x in ws.items()}, n)
    buf = prioritized_buffer(build, tiny, alpha=0.0)
    assert_frequencies(draw(buf, 1, 0, n), {u: 0.25 for u in range(4)}, n)


def test_prioritized_tracks_removals(build, tiny):
    buf = build(3, name="fifo", sampling="prioritized", seed=6)
    buf.add(tiny([0, 1, 2], 0, advantage=[5.0, 1.0, 1.0]), 0)
    buf.add(tiny([3], 1, advantage=[1.0]), 1)  # evicts uid 0, the heavy one
    n = 1500
    assert_frequencies(draw(buf, 1, 1, n), {1: 1 / 3, 2: 1 / 3, 3: 1 / 3}, n)
