"""Micro-benchmark of the replay buffers at the paper's sizes (run by hand, not a test).

    python bench/buffer_scale.py [--sizes 1000 100000 559872] [--repeats 50] [--smoke]

For each (policy, N) it fills a buffer to N with synthetic rollouts of the embedded default's
widths (prompt + completion as resolved from ``compose([])``), then times at steady state
(full buffer, so every add evicts) the median of ``--repeats`` calls of ``add`` of R = 64
rollouts and ``sample`` of B = 64, and measures bytes per stored rollout (everything the buffer
allocated, numpy and Python objects, via tracemalloc). Next to it: the median time of one
training step of the embedded default model (warm_start.steps=0: the random init, same cost)
on a batch of 64 rollouts of the same width (forward, token log-probs, backward, Adam), and
the ratios buffer time / training-step time. ``--smoke`` (N = 1,000, 3 repeats: seconds) only
checks that it all runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

import numpy as np
import torch

from replay_exp.buffer import make_buffer
from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.models import load_policy
from replay_exp.tasks import make_task
from replay_exp.types import RolloutBatch

R = B = 64


def rollouts(n: int, step: int, uid0: int, P: int, C: int, rng: np.random.Generator):
    """n rollouts of at most (P, C) tokens, random lengths, binary rewards, groups of 8."""
    pl = torch.from_numpy(rng.integers(P // 2, P + 1, n))
    cl = torch.from_numpy(rng.integers(1, C + 1, n))
    uid = torch.arange(uid0, uid0 + n)
    return RolloutBatch(
        prompt_ids_BxP=torch.from_numpy(rng.integers(3, 50, (n, P))),
        prompt_mask_BxP=torch.arange(P) >= (P - pl)[:, None],
        completion_ids_BxC=torch.from_numpy(rng.integers(3, 50, (n, C))),
        completion_mask_BxC=torch.arange(C) < cl[:, None],
        behaviour_logp_BxC=-torch.rand(n, C),
        reward_B=torch.from_numpy((rng.random(n) < 0.4).astype(np.float32)),
        advantage_B=torch.randn(n),
        version_B=torch.full((n,), step),
        created_step_B=torch.full((n,), step),
        group_id_B=uid // 8,
        uid_B=uid,
        group_reward_B=torch.zeros(n),
        engine_gap_BxC=torch.zeros(n, C),
    )


def median_us(fn, repeats: int) -> float:
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def bench_buffer(spec: dict, N: int, P: int, C: int, repeats: int) -> tuple[float, float, float]:
    rng = np.random.default_rng(0)
    pool = [rollouts(4096, 0, 0, P, C, rng) for _ in range(4)]  # reused to fill quickly
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    buf = make_buffer(spec, capacity=N, max_prompt_len=P, max_completion_len=C, seed=0)
    step, uid = 0, 0
    while len(buf) < N:  # fill: 4096 per add; uids stay unique, steps advance every 64
        b = pool[step % 4]
        n = min(4096, N - len(buf))
        chunk = b.index(slice(0, n))
        chunk.uid_B, chunk.group_id_B = chunk.uid_B + uid, chunk.group_id_B + uid // 8
        chunk.version_B = chunk.created_step_B = torch.full((n,), step)
        buf.add(chunk, step)
        uid += n
        step += 1
    nbytes = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    per_rollout = nbytes / len(buf)
    fresh = [rollouts(R, 0, 0, P, C, rng) for _ in range(repeats)]
    for i, f in enumerate(fresh):
        f.uid_B, f.group_id_B = f.uid_B + uid + i * R, f.group_id_B + (uid + i * R) // 8
        f.version_B = f.created_step_B = torch.full((R,), step + i)

    def add(i: int) -> None:
        buf.add(fresh[i], step + i)

    def sample(i: int) -> None:
        buf.sample(B, step + repeats + i)

    add_us = median_us(add, repeats)
    sample_us = median_us(sample, repeats)
    return add_us, sample_us, per_rollout


def train_step_us(repeats: int = 5) -> tuple[float, int, int]:
    cfg, d = resolve(compose(["model.warm_start.steps=0"]))
    task = make_task(cfg.task)
    policy, _, _ = load_policy(cfg.model, cfg.task, task, "cpu")
    opt = torch.optim.Adam(policy.parameters(), lr=1e-4)
    P, C = d.max_prompt_len, d.max_new_tokens
    batch = rollouts(B, 0, 0, P, C, np.random.default_rng(1))
    ids = torch.cat([batch.prompt_ids_BxP, batch.completion_ids_BxC], 1)
    mask = torch.cat([batch.prompt_mask_BxP, batch.completion_mask_BxC], 1).long()

    def step(_: int) -> None:
        logits = policy(input_ids=ids, attention_mask=mask).logits[:, P - 1 : -1]
        logp = torch.log_softmax(logits.float(), -1)
        tok = logp.gather(-1, batch.completion_ids_BxC[..., None])[..., 0]
        loss = -(tok * batch.completion_mask_BxC).sum() / batch.completion_mask_BxC.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()

    step(0)  # warm-up
    return median_us(step, repeats), P, C


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 100_000, 559_872])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--smoke", action="store_true", help="N = 1,000 only, 3 repeats")
    args = ap.parse_args()
    if args.smoke:
        args.sizes, args.repeats = [1_000], 3
    t_train, P, C = train_step_us(min(5, args.repeats))
    print(
        f"embedded default: one training step on B={B} rollouts of width {P}+{C} tokens "
        f"(forward + backward + Adam, {torch.get_num_threads()} threads): {t_train / 1e3:.1f} ms"
    )
    big = max(args.sizes)
    runs = [("fifo/uniform", {"name": "fifo"}, n) for n in args.sizes] + [
        ("positive_bias(0.5)/uniform", {"name": "positive_bias", "delta": 0.5}, big),
        ("fifo/prioritized", {"name": "fifo", "sampling": "prioritized"}, big),
        ("priority/prioritized", {"name": "priority", "sampling": "prioritized"}, big),
        ("fifo/recency(tau=8)", {"name": "fifo", "sampling": "recency", "recency_tau": 8.0}, big),
    ]
    head = f"{'buffer':28s} {'N':>8s} {'add R=64':>10s} {'sample B=64':>12s} {'B/rollout':>10s}"
    print(head + f" {'add/step':>9s} {'sample/step':>12s}")
    for label, spec, n in runs:
        add_us, sample_us, per = bench_buffer(spec, n, P, C, args.repeats)
        print(
            f"{label:28s} {n:8,d} {add_us:8.0f}us {sample_us:10.0f}us {per:10.0f}"
            f" {add_us / t_train:9.2%} {sample_us / t_train:12.2%}"
        )


if __name__ == "__main__":
    main()
