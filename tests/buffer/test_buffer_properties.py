"""Property-based checks (hypothesis) for every (eviction, sampling) combination.

Each example: a random small buffer (N, shards, max_reuse, the policy's own knob) and a random
stream of steps (prompt groups of 2 arriving with some version lag, then one batch of random
B). Invariants checked at every step: size <= N; batches hold distinct stored rollouts, as many
as min(B/T, eligible) per shard; max_reuse and max_age are respected; on_policy uses each
rollout once; with one shard and no reuse cap the kept set matches the policy's definition
(fifo, positive_bias, priority). Midway the state goes through torch.save/torch.load
(weights_only=True) into a buffer built with another seed, and both must then agree exactly.
"""

from __future__ import annotations

import io
import math
from dataclasses import fields

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replay_exp.buffer import BUFFERS, PRIORITIES, SAMPLERS, EmptyBufferError, make_buffer
from replay_exp.rollout.synthetic import rollout_batch
from replay_exp.types import RolloutBatch

COMBOS = [
    (name, sampling)
    for name in sorted(BUFFERS)
    for sampling in sorted(SAMPLERS)
    if name != "on_policy" or sampling == "uniform"
]
G = 2  # rollouts per prompt group


@st.composite
def scenarios(draw, name: str, sampling: str):
    T = 1 if name == "on_policy" else draw(st.sampled_from([1, 2]))
    spec = {
        "name": name,
        "sampling": sampling,
        "shards": T,
        "capacity": T * draw(st.integers(1, 6)),
    }
    if name != "on_policy":
        spec["max_reuse"] = draw(st.sampled_from([None, None, 1, 2, 3]))
    if name == "max_age":
        spec["max_age"] = draw(st.integers(0, 3))
    if name == "positive_bias":
        spec["delta"] = draw(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]))
    spec["priority"] = draw(st.sampled_from(sorted(PRIORITIES)))
    if sampling == "prioritized":
        spec["priority_alpha"] = draw(st.sampled_from([0.0, 0.5, 1.0, 2.0]))
    if sampling == "recency":
        spec["recency_tau"] = draw(st.sampled_from([0.3, 1.0, 5.0]))
    # per step: (prompt groups arriving, version lag of the generator, B / T)
    steps = draw(
        st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(1, 4)),
                 min_size=1, max_size=10)
    )  # fmt: skip
    return spec, steps, draw(st.integers(0, len(steps))), draw(st.integers(0, 2**16))


def arrivals(steps, seed: int) -> list[RolloutBatch | None]:
    """The rollouts of each step: groups of G with binary rewards, advantages frozen."""
    rng = np.random.default_rng(seed)
    out, uid = [], 0
    for t, (groups, lag, _) in enumerate(steps):
        n = groups * G
        if n == 0:
            out.append(None)
            continue
        reward = (rng.random(n) < 0.5).astype(np.float32)
        r = reward.reshape(groups, G)
        adv = ((r - r.mean(1, keepdims=True)) / (r.std(1, keepdims=True) + 1e-6)).ravel()
        uids = torch.arange(uid, uid + n)
        out.append(
            rollout_batch(
                uids.view(n, 1),
                uids.view(n, 1) + 1,
                reward=torch.from_numpy(reward),
                advantage=torch.from_numpy(adv.astype(np.float32)),
                version=t - lag,
                created_step=t,
                group=uids // G,
                uid=uids,
            )  # fmt: skip
        )
        uid += n
    return out


def build(spec: dict, seed: int):
    return make_buffer(spec, max_prompt_len=2, max_completion_len=2, seed=seed)


def stored(buf) -> dict[int, tuple[int, int]]:
    """uid -> (version, uses) of every stored rollout."""
    out = {}
    for s in getattr(buf, "shards", [buf]):
        for u, v, n in zip(
            *(s.store.live_values(k).tolist() for k in ("uid", "version", "uses")), strict=False
        ):
            out[u] = (v, n)
    return out


def expected_kept(spec: dict, added: list[RolloutBatch]) -> set[int] | None:
    """The policy's definition over the whole stream (one shard, no reuse cap)."""
    if spec["shards"] != 1 or spec.get("max_reuse") or spec["name"] in ("on_policy", "max_age"):
        return None
    N = spec["capacity"]
    uid = torch.cat([b.uid_B for b in added]).tolist()
    if spec["name"] == "fifo":
        return set(uid[-N:])
    reward = torch.cat([b.reward_B for b in added]).tolist()
    if spec["name"] == "positive_bias":
        n_correct = math.floor(spec["delta"] * N + 0.5)
        fresh = uid[-(N - n_correct) :] if n_correct < N else []
        older = [u for u, r in zip(uid, reward, strict=True) if r > 0 and u not in fresh]
        return set(fresh) | set(older[-n_correct:] if n_correct else [])
    prio = np.concatenate([PRIORITIES[spec["priority"]](b) for b in added]).astype(np.float32)
    order = sorted(range(len(uid)), key=lambda i: (float(prio[i]), uid[i]))  # ties: older first
    return {uid[i] for i in order[-N:]}


def check_step(spec, buf, t, batch, before, uses_so_far):
    N, K = spec["capacity"], spec.get("max_reuse")
    A = spec.get("max_age")
    uids = batch.uid_B.tolist() if batch is not None else []
    assert len(uids) == len(set(uids))  # distinct within the batch
    assert set(uids) <= set(before)  # only stored rollouts
    if A is not None:
        assert all(t - v <= A for v in batch.version_B.tolist()) if uids else True
        assert all(t - v <= A for v, _ in stored(buf).values())
    for u in uids:
        uses_so_far[u] = uses_so_far.get(u, 0) + 1
        if spec["name"] == "on_policy":
            assert uses_so_far[u] == 1
        if K is not None:
            assert uses_so_far[u] <= K
    now = stored(buf)
    assert len(now) == len(buf) <= N
    for u, (_, n) in now.items():
        assert n == uses_so_far.get(u, 0) and (K is None or n < K)


def expected_batch_len(spec, shard_sizes: list[int], B: int) -> int:
    T = spec["shards"]
    return sum(min(B // T, n) for n in shard_sizes)


def eligible_sizes(spec, buf, t) -> list[int]:
    """Rollouts each shard can hand out at step t (after max_age's own evictions)."""
    A = spec.get("max_age")
    out = []
    for s in getattr(buf, "shards", [buf]):
        v = s.store.live_values("version")
        out.append(int((t - v <= A).sum()) if A is not None else len(v))
    return out


def same(a: RolloutBatch | None, b: RolloutBatch | None) -> None:
    assert (a is None) == (b is None)
    if a is not None:
        for f in fields(RolloutBatch):
            assert torch.equal(getattr(a, f.name), getattr(b, f.name)), f.name


def same_stats(x: dict, y: dict) -> None:
    assert x.keys() == y.keys()
    for k in x:
        assert x[k] == y[k] or (math.isnan(x[k]) and math.isnan(y[k])), k


@pytest.mark.parametrize(("name", "sampling"), COMBOS)
def test_invariants_and_resume(name, sampling):
    # 15 examples x 21 combinations keep the file under ~10 s on 2 cores; no example database
    @settings(
        max_examples=15, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(scenarios(name, sampling))
    def check(scenario):
        spec, steps, split, seed = scenario
        stream = arrivals(steps, seed)
        buf, twin = build(spec, seed), None
        uses: dict[int, int] = {}
        added: list[RolloutBatch] = []
        for t, ((_, _, b_per_shard), fresh) in enumerate(zip(steps, stream, strict=True)):
            if t == split:  # resume: the twin continues from a serialized copy
                blob = io.BytesIO()
                torch.save(buf.state_dict(), blob)
                blob.seek(0)
                twin = build(spec, seed + 1)
                twin.load_state_dict(torch.load(blob, weights_only=True))
            B = b_per_shard * spec["shards"]
            if fresh is not None:
                buf.add(fresh, t)
                added.append(fresh)
                if twin is not None:
                    twin.add(fresh, t)
            assert len(buf) <= spec["capacity"]
            kept = expected_kept(spec, added) if added else None
            if kept is not None:
                assert set(stored(buf)) == kept
            before = stored(buf)
            want = expected_batch_len(spec, eligible_sizes(spec, buf, t), B)
            try:
                batch = buf.sample(B, t)
            except EmptyBufferError:
                batch = None
            assert (0 if batch is None else len(batch)) == want
            check_step(spec, buf, t, batch, before, uses)
            if twin is not None:
                try:
                    twin_batch = twin.sample(B, t)
                except EmptyBufferError:
                    twin_batch = None
                same(batch, twin_batch)
                same_stats(buf.stats(), twin.stats())
        if twin is not None:
            assert buf.telemetry() == twin.telemetry()
        tel = buf.telemetry()
        assert sum(tel["age"]) == sum(uses.values())
        assert sum(tel["replay_count"]) + sum(tel["replay_count_live"]) == sum(
            len(b) for b in added
        )

    check()
