"""Our GRPO loop against TRL's ``GRPOTrainer`` on the embedded default (run by hand, not a test).

    pip install -e '.[bench]'        # trl (and its accelerate / datasets), CPU only
    python bench/vs_trl.py [--reps 3] [--steps 100] [--quick | --smoke] [--out results.json]

Three variants train the SAME warm-started tiny Llama (``load_policy``, as the trainer loads it)
on the SAME embedded arithmetic task and reward, B = 64 completions per optimizer step in groups
of G = 8, the same max prompt / completion lengths, the same number of optimizer steps:

  (a) ours, on-policy:    ``python -m replay_exp.train experiment=on_policy`` (R = B = 64 fresh
                          rollouts = 8 prompts x 8 per step), run in-process through the public
                          entry point ``compose`` / ``resolve`` / ``replay_exp.train.run``;
  (b) TRL ``GRPOTrainer`` configured to match (a) (``trl_config`` says how; beta = 0, clip 0.2,
                          token-mean "dapo" loss, same Adam, constant lr, no vLLM, one
                          generation batch per optimizer step, fed the very same prompts as (a));
  (c) ours, FIFO replay:  ``experiment=replay_reuse4`` (R = 16 fresh rollouts per step, B = 64
                          sampled from a buffer of N = 512: a quarter of (a)'s generation).

Evaluation is off in (a) and (c) (one tiny eval after the last step, outside the timed window),
no per-update diagnostics (``logger.diagnostics=false``: TRL computes none), no checkpoints, no
progress bar, 2 torch threads. Every variant runs in a fresh subprocess (the script re-invokes
itself with ``--variant a|b|c --json-out FILE``), in the order a, b, c, a, b, c, ... so that load
drifts hit all three alike; its peak RSS is ``getrusage(RUSAGE_SELF).ru_maxrss`` of that child.

What is timed, per variant (medians over the repetitions; ratios are the medians of the paired
per-repetition ratios to (b)):
- startup, reported apart: heavy imports; setup + finish (the run's wall time outside its
  optimizer steps: config, model load, buffer or TRL trainer construction, and after the last
  step (a)/(c)'s one-problem evaluation and summary, TRL's end of ``train``); the first step
  (warm-up);
- steady state: steps 2..N, wall clock between consecutive "optimizer step done" points, so a
  step includes everything the loop does (generation, reward, update, buffer, ledger, logging).
  Ours: read from the run's metrics.jsonl, nothing in ``replay_exp`` is wrapped or patched: the
  loop logs one row per step after the update, whose ``runtime/steps_per_second`` is
  ``compute/steps`` over the runtime's wall clock since the loop started, so that clock at step
  s is ``compute/steps / runtime/steps_per_second``. TRL: a ``TrainerCallback``'s
  ``on_step_end``;
  -> seconds per optimizer step, and seconds per 1k generated tokens (completion tokens actually
  generated, up to and including EOS, padding excluded, counted the same way everywhere: ours
  the ledger's ``compute/gen_tokens``).

(d) Where the step goes. Ours, from the ledger's measured seconds in metrics.jsonl:
generation (``compute/seconds_gen``: prompt sampling, tokenisation, the KV-cached sampling loop
whose logits give the behaviour log-probs, reward, advantages), update (``compute/seconds_train``:
the buffer's sample and ``policy_update``: forward, loss, backward, clip, optimizer), and the rest
of the step, "loop, other" (buffer add, ledger, metrics row + metrics.jsonl write, weight push,
the loop itself), reported as the share of the step outside generation and update. TRL: its
trainer's methods, ``Tensor.backward`` and the optimizer step are wrapped with exclusive timers
in its child (TRL's side only).

(e) FLOP/s of our training phase: the ledger's analytic ``compute/flops_train`` (3 forwards per
trained sample) over its ``compute/seconds_train``, against this machine's float32 matmul peak
measured here (1024^2 and 2048^2 matmuls, 2 threads, best of 5, before and after the runs).

Ends with a markdown table (also in ``--out``, with every raw number). On a shared machine the
absolute times are noisy; the alternating order and the paired ratios are what to read.
``--smoke`` (1 repetition of 3 steps, about a minute) only checks that all of it runs.
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

VARIANTS = {
    "a": "ours on-policy",
    "b": "TRL GRPOTrainer",
    "c": "ours FIFO replay y=4",
}
EXPERIMENT = {"a": "on_policy", "c": "replay_reuse4"}


# ---------------------------------------------------------------------------------------------
# Timing helpers (used in the children).
# ---------------------------------------------------------------------------------------------


class PhaseTimer:
    """Exclusive wall time per named phase, counted only while ``counting()`` is true.

    ``wrap(group, name, fn)`` returns ``fn`` timed; ``enter``/``exit`` time a span between two
    hooks. Nested phases are subtracted from their parent, so phases add up to the covered time.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.group: dict[str, str] = {}
        self.counting = lambda: True
        self._stack: list[list[float]] = []  # [start, time spent in children]

    def enter(self) -> None:
        self._stack.append([time.perf_counter(), 0.0])

    def exit(self, group: str, name: str) -> None:
        start, children = self._stack.pop()
        dt = time.perf_counter() - start
        if self._stack:
            self._stack[-1][1] += dt
        if self.counting():
            self.seconds[name] += dt - children
            self.group[name] = group

    def wrap(self, group: str, name: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            self.enter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.exit(group, name)

        return timed

    def wrap_method(self, obj: Any, attr: str, group: str, name: str) -> None:
        setattr(obj, attr, self.wrap(group, name, getattr(obj, attr)))

    def phases(self, steps: int) -> list[dict[str, Any]]:
        """Milliseconds per step of every phase, biggest first."""
        rows = [
            {"group": self.group[k], "phase": k, "ms_per_step": 1e3 * v / steps}
            for k, v in self.seconds.items()
        ]
        return sorted(rows, key=lambda r: -r["ms_per_step"])


def patch_backward_and_optimizer(timer: PhaseTimer, group: str) -> None:
    """Time every ``Tensor.backward`` and every optimizer step of this process."""
    import torch
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    torch.Tensor.backward = timer.wrap(group, "backward", torch.Tensor.backward)
    torch.nn.utils.clip_grad_norm_ = timer.wrap(group, "grad clip", torch.nn.utils.clip_grad_norm_)
    register_optimizer_step_pre_hook(lambda opt, args, kwargs: timer.enter())
    register_optimizer_step_post_hook(lambda opt, args, kwargs: timer.exit(group, "optimizer"))


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def steady(ends: list[float], tokens: dict[int, int]) -> dict[str, Any]:
    """Per-step numbers from the timestamps ``ends`` (ends[0] = before step 1, ends[s] = step s
    done) and the completion tokens generated at each 0-based step."""
    n = len(ends) - 1
    out: dict[str, Any] = {"steps": n, "first_step_s": ends[1] - ends[0]}
    if n >= 2:
        secs = ends[n] - ends[1]
        toks = sum(tokens.get(s, 0) for s in range(1, n))
        out.update(
            steady_steps=n - 1,
            steady_s=secs,
            steady_gen_tokens=toks,
            s_per_step=secs / (n - 1),
            s_per_1k_tokens=1e3 * secs / toks if toks else None,
        )
    return out


def reward_summary(rewards: list[float]) -> dict[str, float]:
    k = max(1, len(rewards) // 5)
    return {
        "reward_first": statistics.fmean(rewards[:k]),
        "reward_last": statistics.fmean(rewards[-k:]),
        "reward_steps_avg": k,
    }


# ---------------------------------------------------------------------------------------------
# (a), (c): our trainer through its public entry point; timings from its metrics.jsonl.
# ---------------------------------------------------------------------------------------------


def our_overrides(experiment: str, steps: int, threads: int, run_dir: Path) -> list[str]:
    return [
        f"experiment={experiment}",
        f"schedule.max_steps={steps}",
        "eval.every=1000000",  # no eval inside the run; one after the last step (untimed)
        "eval.at_start=false",
        "eval.n_problems=1",
        "logger.log_every=1",  # one metrics row per step: the step clock (the default)
        "logger.progress=false",
        # No per-update diag/* (on by default since 4ea1f2e): they cost one no-grad forward of
        # the batch that TRL does not run, and every published row predates them.
        "logger.diagnostics=false",
        "checkpoint.every=0",
        "save_final_model=false",
        f"threads={threads}",
        "device=cpu",
        f"run_dir={run_dir}",
    ]


# What ours is timed by: every training row of metrics.jsonl carries them (cumulative).
LOOP_KEYS = (
    "runtime/steps_per_second", "compute/steps", "compute/seconds_gen", "compute/seconds_train",
    "compute/gen_tokens", "compute/flops_train", "train/reward",
)  # fmt: skip


def step_rows(rows: list[dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    """The training rows of steps 1..``steps`` of a run's metrics.jsonl, one per step."""
    train_rows = [r for r in rows if r.get("step", 0) >= 1 and "train/reward" in r]
    got = [r["step"] for r in train_rows]
    if got != list(range(1, steps + 1)):
        raise SystemExit(f"metrics.jsonl: expected one training row per step 1..{steps}, got {got}")
    missing = [k for k in LOOP_KEYS if k not in train_rows[0]]
    if missing:
        raise SystemExit(f"metrics.jsonl rows lack {missing}: what this script times ours by")
    return train_rows


def run_ours(variant: str, steps: int, threads: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    import torch  # noqa: F401  (imports timed as startup)

    from replay_exp.config.composition import compose
    from replay_exp.config.derive import resolve
    from replay_exp.runlog import read_metrics
    from replay_exp.train import run

    t_import = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as tmp:
        t_setup = time.perf_counter()
        cfg, derived = resolve(compose(our_overrides(EXPERIMENT[variant], steps, threads, tmp)))
        summary = run(cfg, derived, Path(tmp))
        t_end = time.perf_counter()
        rows = step_rows(read_metrics(Path(tmp) / "metrics.jsonl"), steps)

    def total(key: str, step: int) -> float:  # a cumulative column after ``step`` updates
        return rows[step - 1][key] if step else 0.0

    # The loop's wall clock at the end of each step (0 when the loop started).
    ends = [0.0] + [r["compute/steps"] / r["runtime/steps_per_second"] for r in rows]
    tokens = {s: int(total("compute/gen_tokens", s + 1) - total("compute/gen_tokens", s))
              for s in range(steps)}  # fmt: skip
    out = steady(ends, tokens)
    st = out.get("steady_steps", 1)

    def steady_delta(key: str) -> float:  # over the steady steps 2..N
        return total(key, steps) - total(key, 1)

    gen_s, train_s = steady_delta("compute/seconds_gen"), steady_delta("compute/seconds_train")
    flops = steady_delta("compute/flops_train")
    rewards = [float(r["train/reward"]) for r in rows]
    phases = [
        {"group": group, "phase": phase, "ms_per_step": 1e3 * seconds / st}
        for group, phase, seconds in [
            ("generation", "generation (ledger seconds_gen)", gen_s),
            ("training", "update (ledger seconds_train)", train_s),
        ]
    ]
    out.update(
        import_s=t_import,
        setup_s=(t_end - t_setup) - ends[-1],  # outside the steps: setup + finish
        total_s=t_end - t_setup,
        gen_tokens=sum(tokens.values()),
        rollouts_per_step=derived.rollouts_per_step,
        batch_size=cfg.schedule.batch_size,
        phases=phases,
        train_flops_per_step=flops / st,
        train_flops_per_s=flops / train_s if train_s else None,
        ledger=summary["compute"],
        rewards=rewards,
        samples=[],  # no decoded completions in a run's outputs
        **reward_summary(rewards),
    )
    return out


# ---------------------------------------------------------------------------------------------
# (b): TRL's GRPOTrainer, configured to match (a).
# ---------------------------------------------------------------------------------------------


def trl_config(cfg, derived, steps: int, output_dir: str) -> dict[str, Any]:
    """GRPOConfig keyword arguments matching our on-policy run ``cfg`` / ``derived``.

    What cannot match exactly (none of it changes the work done per step):
    - advantages: TRL divides by the group's Bessel-corrected std + 1e-4, ours by the population
      std + 1e-6, so TRL's are sqrt((G-1)/G) ~ 0.94x ours at G = 8;
    - the ratio's denominator: ours is the log-prob stored from generate's logits, TRL's (on
      policy, no vLLM) the detached log-prob of the training forward; neither runs a separate
      behaviour forward pass, and both ratios are 1 up to numerics;
    - sampling randomness: the same prompts in the same order, but different RNG streams, so
      the completions differ;
    - max prompt length: TRL 1.16 has no such option; neither side truncates prompts (they are
      at most ``derived.max_prompt_len`` = 9 tokens by construction);
    - TRL computes the log-probs through its fused, chunked LM head, ours from full logits.
    """
    a, g, s = cfg.algo, cfg.generation, cfg.schedule
    return dict(
        output_dir=output_dir,
        # Batch: one optimizer step per generation batch of B completions = B/G prompts x G.
        per_device_train_batch_size=s.batch_size,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,  # no inner PPO epochs (ours: one step per batch)
        num_generations=a.group_size,
        max_steps=steps,
        shuffle_dataset=False,  # the dataset already holds (a)'s prompts in (a)'s order
        seed=cfg.seed,
        # Sampling: plain HF generate, no vLLM, no continuous batching.
        max_completion_length=derived.max_new_tokens,
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=0,
        use_vllm=False,
        # Loss: clipped surrogate, token-level mean over the batch (ours: token_mean), no KL.
        loss_type="dapo",
        beta=a.kl_coef,
        epsilon=a.eps_low,
        epsilon_high=a.eps_high,
        scale_rewards="group" if a.adv_normalize_std else "none",
        mask_truncated_completions=False,
        # Optimizer: torch AdamW, constant lr, same betas / decay / grad clip.
        optim="adamw_torch",
        learning_rate=a.lr,
        adam_beta1=a.betas[0],
        adam_beta2=a.betas[1],
        weight_decay=a.weight_decay,
        max_grad_norm=a.grad_clip if a.grad_clip is not None else 0.0,
        lr_scheduler_type="constant",
        warmup_steps=0,
        # Precision and memory: float32 like ours (TRL defaults to bf16 and checkpointing).
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        # Logging: one in-memory log row per step (ours: one metrics.jsonl row per step).
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
        save_strategy="no",
        eval_strategy="no",
        dataloader_num_workers=0,
    )


def run_trl(steps: int, threads: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    import numpy as np
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from replay_exp.config.composition import compose
    from replay_exp.config.derive import resolve
    from replay_exp.config.seeding import derive_seed
    from replay_exp.models import load_policy
    from replay_exp.tasks import Problem, make_task

    t_import = time.perf_counter() - t0
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    timer = PhaseTimer()
    ends: list[float] = []  # train start, then each on_step_end
    timer.counting = lambda: 2 <= len(ends) <= steps  # steady steps only (2..N)
    tokens: dict[int, int] = {}
    rewards: list[float] = []
    samples: list[str] = []

    with tempfile.TemporaryDirectory(prefix="vs-trl-") as tmp:
        t_setup = time.perf_counter()
        torch.set_num_threads(threads)
        cfg, derived = resolve(compose(our_overrides("on_policy", steps, threads, tmp)))
        task = make_task(cfg.task)
        policy, tokenizer, _ = load_policy(cfg.model, cfg.task, task, "cpu")
        eos = tokenizer.eos_token_id

        # (a)'s prompt stream: the trainer draws B/G prompts at step s from this seed.
        n_prompts = int(derived.prompts_per_step)
        problems = [
            p
            for step in range(steps)
            for p in task.sample_train(
                np.random.default_rng(derive_seed(cfg.seed, "prompts", step)), n_prompts
            )
        ]
        dataset = Dataset.from_dict(
            {"prompt": [p.prompt for p in problems], "answer": [p.answer for p in problems]}
        )

        def arithmetic_reward(prompts, completions, completion_ids, answer, **kwargs):
            """Our task's reward on the decoded completion; finished = EOS was generated."""
            rows = zip(prompts, answer, completions, completion_ids, strict=True)
            out = [task.reward(Problem(p, ans), text, eos in ids) for p, ans, text, ids in rows]
            step = len(ends) - 1
            tokens[step] = sum(len(ids) for ids in completion_ids)
            rewards.append(statistics.fmean(out))
            samples.append(f"{prompts[0]}{completions[0]} (r={out[0]:g})")
            return out

        class StepClock(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                if not ends:
                    ends.append(time.perf_counter())

            def on_step_end(self, args, state, control, **kwargs):
                ends.append(time.perf_counter())

        args = GRPOConfig(**trl_config(cfg, derived, steps, tmp))
        trainer = GRPOTrainer(
            model=policy,
            reward_funcs=arithmetic_reward,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[StepClock()],
        )
        trainer.remove_callback(PrinterCallback)
        t_constructed = time.perf_counter()
        for attr, group, name in [
            ("_generate_single_turn", "generation", "HF generate"),
            ("_calculate_rewards", "generation", "reward (score)"),
            ("_generate_and_score_completions", "generation", "rollout assembly (other)"),
            ("compute_loss", "training", "forward + loss"),
            ("log", "logging", "log row"),
        ]:
            timer.wrap_method(trainer, attr, group, name)
        patch_backward_and_optimizer(timer, "training")
        trainer.train()
        t_end = time.perf_counter()
        history = [r for r in trainer.state.log_history if "reward" in r]

    out = steady(ends, tokens)
    out.update(
        import_s=t_import,
        setup_s=(t_end - t_setup) - (ends[-1] - ends[0]),  # outside the steps: setup + finish
        construct_s=t_constructed - t_setup,
        total_s=t_end - t_setup,
        gen_tokens=sum(tokens.values()),
        rollouts_per_step=args.generation_batch_size,
        batch_size=args.per_device_train_batch_size,
        phases=timer.phases(out.get("steady_steps", 1)),
        rewards=rewards,
        trl_logged_reward_last=history[-1]["reward"] if history else None,
        samples=samples,
        trl_version=trl.__version__,
        **reward_summary(rewards),
    )
    return out


# ---------------------------------------------------------------------------------------------
# (e): matmul peak of this machine.
# ---------------------------------------------------------------------------------------------


def matmul_peak(threads: int, repeats: int = 5) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    out: dict[str, Any] = {"threads": threads}
    for n in (1024, 2048):
        x, y = torch.randn(n, n), torch.randn(n, n)
        x @ y  # warm-up
        best = min(_timed(lambda x=x, y=y: x @ y) for _ in range(repeats))
        out[f"gflops_{n}"] = 2 * n**3 / best / 1e9
    out["peak_gflops"] = max(v for k, v in out.items() if k.startswith("gflops_"))
    return out


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------
# Orchestration: alternate the variants in fresh subprocesses, then summarise.
# ---------------------------------------------------------------------------------------------


def child(args: argparse.Namespace) -> None:
    if args.variant == "peak":
        result = matmul_peak(args.threads)
    elif args.variant == "b":
        result = run_trl(args.steps, args.threads)
    else:
        result = run_ours(args.variant, args.steps, args.threads)
    import torch

    result["variant"] = args.variant
    result["threads_in_effect"] = torch.get_num_threads()
    result["peak_rss_mb"] = peak_rss_mb()
    Path(args.json_out).write_text(json.dumps(result))


def spawn(variant: str, args: argparse.Namespace, work: Path, tag: str) -> dict[str, Any]:
    out, log = work / f"{tag}.json", work / f"{tag}.log"
    cmd = [
        sys.executable, __file__, "--variant", variant, "--json-out", str(out),
        "--steps", str(args.steps), "--threads", str(args.threads),
    ]  # fmt: skip
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled"}
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    if rc != 0:
        sys.exit(f"variant {variant} failed (exit {rc}); its output:\n{log.read_text()[-4000:]}")
    result = json.loads(out.read_text())
    result["process_s"] = time.perf_counter() - t0
    return result


def median(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarise(runs: dict[str, list[dict[str, Any]]], peak: dict[str, Any]) -> dict[str, Any]:
    keys = ["s_per_step", "s_per_1k_tokens", "first_step_s", "setup_s", "import_s", "peak_rss_mb"]
    summary: dict[str, Any] = {}
    for v, rs in runs.items():
        row: dict[str, Any] = {"label": VARIANTS[v], "reps": len(rs)}
        for k in keys:
            row[k] = median([r.get(k) for r in rs])
            if v != "b" and "b" in runs:  # paired ratio: repetition i of v over repetition i of b
                pairs = zip(rs, runs["b"], strict=False)
                row[f"{k}_vs_b"] = median(
                    [r[k] / q[k] if r.get(k) and q.get(k) else None for r, q in pairs]
                )
        row["tokens_per_step"] = median([r["gen_tokens"] / r["steps"] for r in rs])
        row["reward_first"] = median([r["reward_first"] for r in rs])
        row["reward_last"] = median([r["reward_last"] for r in rs])
        row["sample"] = rs[-1]["samples"][-1] if rs[-1]["samples"] else ""
        phases: dict[str, list[float]] = defaultdict(list)
        groups: dict[str, str] = {}
        for r in rs:
            for p in r["phases"]:
                phases[p["phase"]].append(p["ms_per_step"])
                groups[p["phase"]] = p["group"]
        step_ms = 1e3 * row["s_per_step"] if row["s_per_step"] else None
        plist = [
            {"group": groups[k], "phase": k, "ms_per_step": statistics.median(ms)}
            for k, ms in phases.items()
        ]
        plist.sort(key=lambda p: -p["ms_per_step"])
        if step_ms:
            covered = sum(p["ms_per_step"] for p in plist)
            plist.append(
                {"group": "loop", "phase": "loop, other", "ms_per_step": step_ms - covered}
            )
            for p in plist:
                p["share"] = p["ms_per_step"] / step_ms
            # ours: what is neither generation nor update (buffer, ledger, logging, loop)
            row["outside_share"] = plist[-1]["share"]
        row["phases"] = plist
        if v != "b":
            row["train_gflops_per_s"] = median([(r["train_flops_per_s"] or 0) / 1e9 for r in rs])
            row["train_mflops_per_step"] = median([r["train_flops_per_step"] / 1e6 for r in rs])
            row["train_share_of_peak"] = row["train_gflops_per_s"] / peak["peak_gflops"]
        summary[v] = row
    return summary


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _ratio(row: dict[str, Any], variant: str, key: str) -> str:
    return "1" if variant == "b" else fmt(row.get(f"{key}_vs_b"), ".2f")


def table(summary: dict[str, Any], peak: dict[str, Any], steps: int, reps: int) -> str:
    lines = [
        f"### vs TRL: {steps} optimizer steps per run, median of {reps} alternating repetitions",
        "",
        "| variant | s/step | vs (b) | s/1k gen tok | vs (b) | gen tok/step | first step s "
        "| setup+finish s | import s | peak RSS MB | vs (b) | reward first→last |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v, r in summary.items():
        ratio = functools.partial(_ratio, r, v)
        lines.append(
            f"| ({v}) {r['label']} | {fmt(r['s_per_step'], '.3f')} | {ratio('s_per_step')} "
            f"| {fmt(r['s_per_1k_tokens'], '.3f')} | {ratio('s_per_1k_tokens')} "
            f"| {fmt(r['tokens_per_step'], '.0f')} | {fmt(r['first_step_s'], '.2f')} "
            f"| {fmt(r['setup_s'], '.2f')} | {fmt(r['import_s'], '.1f')} "
            f"| {fmt(r['peak_rss_mb'], '.0f')} | {ratio('peak_rss_mb')} "
            f"| {r['reward_first']:.2f}→{r['reward_last']:.2f} |"
        )
    for v, r in summary.items():
        lines += ["", f"#### Where the step goes: ({v}) {r['label']}", ""]
        lines += ["| group | phase | ms/step | share |", "|---|---|---|---|"]
        for p in r["phases"]:
            lines.append(
                f"| {p['group']} | {p['phase']} | {p['ms_per_step']:.2f} "
                f"| {fmt(100 * p.get('share', 0), '.1f')}% |"
            )
        if v == "b":
            other = sum(p.get("share", 0) for p in r["phases"] if "other" in p["phase"])
            lines.append(
                f"\nTRL outside model compute (rollout assembly + Trainer loop, other): "
                f"{100 * other:.1f}% of the step."
            )
        elif "outside_share" in r:
            lines.append(
                f"\nOutside generation and update (buffer add, ledger, logging, weight push, "
                f"loop): {100 * r['outside_share']:.1f}% of the step."
            )
    lines += [
        "",
        f"#### Training-phase FLOP/s (matmul peak {peak['peak_gflops']:.1f} GFLOP/s: "
        f"1024² {peak['gflops_1024']:.1f}, 2048² {peak['gflops_2048']:.1f}, "
        f"{peak['threads']} threads)",
        "",
        "| variant | analytic MFLOP/step | GFLOP/s (ledger seconds_train) | share of peak |",
        "|---|---|---|---|",
    ]
    for v, r in summary.items():
        if "train_gflops_per_s" in r:
            lines.append(
                f"| ({v}) {r['label']} | {r['train_mflops_per_step']:.0f} "
                f"| {r['train_gflops_per_s']:.2f} | {100 * r['train_share_of_peak']:.1f}% |"
            )
    return "\n".join(lines)


def installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:  # --variants ac runs without the bench extra
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reps", type=int, default=3, help="alternating repetitions (a, b, c)")
    ap.add_argument("--steps", type=int, default=100, help="optimizer steps per run (>= 3)")
    ap.add_argument("--quick", action="store_true", help="1 repetition of 8 steps")
    ap.add_argument(
        "--smoke", action="store_true", help="1 repetition of 3 steps: checks that it all runs"
    )
    ap.add_argument("--threads", type=int, default=2, help="torch threads in every variant")
    ap.add_argument("--variants", default="abc", help="subset to run, e.g. 'ab'")
    ap.add_argument("--out", default="results.json", help="JSON file for every number")
    ap.add_argument("--variant", choices=["a", "b", "c", "peak"], help=argparse.SUPPRESS)
    ap.add_argument("--json-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.variant:
        return child(args)
    if args.quick:
        args.reps, args.steps = 1, 8
    if args.smoke:
        args.reps, args.steps = 1, 3
    if args.steps < 3:
        ap.error("--steps must be >= 3 (the first step is the warm-up)")

    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="vs-trl-bench-"))
    peak = spawn("peak", args, work, "peak")
    print(
        f"matmul peak: {peak['peak_gflops']:.1f} GFLOP/s ({args.threads} threads)  "
        f"[logs in {work}]",
        flush=True,
    )
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants}
    for rep in range(args.reps):
        for v in args.variants:
            r = spawn(v, args, work, f"rep{rep}_{v}")
            runs[v].append(r)
            print(
                f"rep {rep + 1}/{args.reps} ({v}) {VARIANTS[v]:<22} "
                f"{fmt(r.get('s_per_step'), '.3f')} s/step  "
                f"{fmt(r.get('s_per_1k_tokens'), '.3f')} s/1k tok  "
                f"first {r['first_step_s']:.2f} s  setup {r['setup_s']:.2f} s  "
                f"RSS {r['peak_rss_mb']:.0f} MB  process {r['process_s']:.0f} s",
                flush=True,
            )
        if rep == 0 and args.reps > 1:
            projected = (time.perf_counter() - t0) * args.reps
            if projected > 600:
                print(
                    f"  note: about {projected / 60:.0f} min in all at this pace (busy machine? "
                    "fewer --steps or --reps shorten it)",
                    flush=True,
                )
    again = spawn("peak", args, work, "peak_end")  # the best of two: the CPU may be shared
    peak = max(peak, again, key=lambda r: r["peak_gflops"])
    summary = summarise(runs, peak)
    text = table(summary, peak, args.steps, args.reps)
    wall = time.perf_counter() - t0
    versions = {p: installed_version(p) for p in ("torch", "transformers", "trl", "accelerate")}
    record = {
        "steps": args.steps,
        "reps": args.reps,
        "threads": args.threads,
        "versions": versions,
        "wall_s": wall,
        "matmul_peak": peak,
        "summary": summary,
        "table_markdown": text,
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(record, indent=1))  # before printing: a closed pipe
    print("\nsanity (mean train reward, first / last fifth of the steps; TRL: a last-step sample):")
    for v, r in summary.items():
        print(
            f"  ({v}) {r['label']:<22} reward {r['reward_first']:.3f} -> {r['reward_last']:.3f}  "
            f"gen tok/step {r['tokens_per_step']:.0f}"
            + (f"  e.g. {r['sample']}" if r["sample"] else "")
        )
    print("\n" + text)
    print(f"\ntotal wall time {wall:.0f} s; results in {args.out}")


if __name__ == "__main__":
    main()
