"""What the deterministic shared-prompt broadcast costs (run by hand, ~1 min).

    python bench/determinism_cost.py [--reps 200] [--threads N] [--smoke]

The trainer's forward runs each distinct prompt once and broadcasts its KV cache to the rows
that share it (``replay_exp.models.shared_prefix``). It does so with ``index_select``, whose
backward sums rows in a fixed order; transformers' ``cache.batch_select_indices`` (advanced
indexing) has a backward that adds rows with atomics on CPU threads, so runs drifted apart at the
default thread count. This times one update (``policy_update``: forward, backward, Adam) of the
embedded default on a replay-shaped batch (64 rollouts of 8 prompts, rows shuffled) with both
broadcasts, alternating, in one process, and prints the median seconds of each, their ratio,
and whether repeated backward passes give bitwise-equal gradients. ``--smoke`` (2 updates per
broadcast after 1 warm-up: seconds) only checks that it all runs.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import numpy as np
import torch

from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.models import load_policy, shared_prefix
from replay_exp.rollout import HFGenerator, SamplingParams
from replay_exp.rollout.collect import generate_rollouts
from replay_exp.tasks import make_task
from replay_exp.update import policy_logprobs, policy_update


def advanced_indexing_broadcast(cache, index_B: torch.Tensor) -> None:
    """The broadcast before: transformers' own row selection (``keys[index]``)."""
    cache.batch_select_indices(index_B)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--smoke", action="store_true", help="2 updates after 1 warm-up")
    ap.add_argument("--threads", type=int, default=None, help="default: the trainer's default")
    args = ap.parse_args()
    warmup = 10  # warm-up repetitions, not timed
    if args.smoke:
        args.reps, warmup = 2, 1
    cfg, d = resolve(compose([] if args.threads is None else [f"threads={args.threads}"]))
    torch.set_num_threads(d.threads)
    task = make_task(cfg.task)
    policy, tok, _ = load_policy(cfg.model, cfg.task, task)
    gen = HFGenerator(policy, tok.pad_token_id, tok.eos_token_id)
    problems = task.sample_train(np.random.default_rng(0), 8)
    params = SamplingParams(1.0, 1.0, d.max_new_tokens)
    fresh = generate_rollouts(
        gen, tok, task, problems, 8, params, seed=1, step=0, first_uid=0, first_group=0
    )
    batch = fresh.index(torch.randperm(len(fresh), generator=torch.Generator().manual_seed(0)))

    arms = {"index_select (now)": shared_prefix.select_cache_rows,
            "batch_select_indices (before)": advanced_indexing_broadcast}  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in arms}
    models = {name: copy.deepcopy(policy) for name in arms}
    opts = {
        name: torch.optim.AdamW(m.parameters(), lr=cfg.algo.lr, weight_decay=0.0)
        for name, m in models.items()
    }
    for rep in range(args.reps + warmup):
        for name, select in arms.items():
            shared_prefix.select_cache_rows = select
            t0 = time.perf_counter()
            policy_update(models[name], opts[name], batch, cfg.algo, 1.0, d.max_new_tokens)
            if rep >= warmup:
                times[name].append(time.perf_counter() - t0)
    print(f"threads {d.threads}, {args.reps} updates each, B = 64 (8 prompts x 8, shuffled)")
    for name, select in arms.items():
        shared_prefix.select_cache_rows = select
        grads = []
        for _ in range(5):
            policy.zero_grad()
            logp, _ = policy_logprobs(policy, batch)
            logp.sum().backward()
            grads.append(torch.cat([p.grad.flatten() for p in policy.parameters()]))
        same = all(torch.equal(grads[0], g) for g in grads[1:])
        print(f"  {name:30s} median {1e3 * statistics.median(times[name]):6.2f} ms/update, "
              f"5 backward passes bitwise equal: {same}")  # fmt: skip
    now, before = (statistics.median(t) for t in times.values())
    print(f"  ratio now / before: {now / before:.3f}")


if __name__ == "__main__":
    main()
