"""What the stale-data corrections cost per update (run by hand, ~1 min).

    python bench/corrections_cost.py [--reps 100] [--threads N] [--micro M] [--smoke]

Times one update (``policy_update``: forward, backward, Adam) of the embedded default on a
replay-shaped batch (64 rollouts of 8 prompts, rows shuffled, behaviour log-probs of a slightly
perturbed policy so the ratios are not 1) for each arm, alternating arm by arm in one process,
and prints the median seconds of each and its ratio to plain GRPO (``algo.proximal=none``).
``proximal=recompute`` pays one no-grad forward of the whole batch; ``m2po`` micro-batched
pays the same; the masks and ``loglinear`` only elementwise work. ``--smoke`` (2 updates per arm
after 1 warm-up: seconds) only checks that it all runs.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import numpy as np
import torch
from omegaconf import OmegaConf

from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.models import load_policy
from replay_exp.rollout import HFGenerator, SamplingParams
from replay_exp.rollout.collect import generate_rollouts
from replay_exp.tasks import make_task
from replay_exp.update import policy_logprobs, policy_update

ARMS = {
    "grpo (proximal=none)": [],
    "grpo proximal=recompute": ["algo.proximal=recompute"],
    "grpo proximal=loglinear": ["algo.proximal=loglinear"],
    "grpo mask=icepop": ["algo.mask=icepop"],
    "m2po": ["algo=m2po"],
    "cispo": ["algo=cispo"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--smoke", action="store_true", help="2 updates after 1 warm-up")
    ap.add_argument("--threads", type=int, default=None, help="default: the trainer's default")
    ap.add_argument("--micro", type=int, default=None, help="algo.micro_batch_size")
    args = ap.parse_args()
    warmup = 10  # warm-up repetitions, not timed
    if args.smoke:
        args.reps, warmup = 2, 1
    common = [] if args.threads is None else [f"threads={args.threads}"]
    if args.micro is not None:
        common.append(f"algo.micro_batch_size={args.micro}")
    cfg, d = resolve(compose(common))
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
    with torch.no_grad():  # behaviour = the policy's own log-probs plus noise: ratios spread
        logp, _ = policy_logprobs(policy, batch)
    noise = 0.1 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(1))
    batch.behaviour_logp_BxC = torch.where(batch.completion_mask_BxC, logp + noise, 0.0)

    algos = {name: resolve(compose([*common, *o]))[0].algo for name, o in ARMS.items()}
    models = {name: copy.deepcopy(policy) for name in ARMS}
    opts = {
        name: torch.optim.AdamW(m.parameters(), lr=0.0, weight_decay=0.0)  # lr 0: same batch
        for name, m in models.items()
    }
    times: dict[str, list[float]] = {name: [] for name in ARMS}
    extra = {}
    for rep in range(args.reps + warmup):
        for name in ARMS:
            t0 = time.perf_counter()
            stats = policy_update(
                models[name], opts[name], batch, algos[name], 1.0, d.max_new_tokens, version=4
            )
            if rep >= warmup:
                times[name].append(time.perf_counter() - t0)
            extra[name] = stats["extra_forwards"]
    micro = OmegaConf.select(cfg, "algo.micro_batch_size")
    tokens = int(batch.completion_mask_BxC.sum())
    print(f"threads {d.threads}, {args.reps} updates each, B = 64 (8 prompts x 8, shuffled), "
          f"micro_batch_size {micro}, completion tokens {tokens}")  # fmt: skip
    base = statistics.median(times["grpo (proximal=none)"])
    for name in ARMS:
        t = statistics.median(times[name])
        print(f"  {name:26s} median {1e3 * t:7.2f} ms/update  ratio {t / base:5.3f}  "
              f"extra forwards {extra[name]}")  # fmt: skip


if __name__ == "__main__":
    main()
