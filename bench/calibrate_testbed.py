"""Calibration of the embedded testbed: is the default discriminating? (run by hand, ~20 min)

    python bench/calibrate_testbed.py [--seeds 0 1 2] [--lrs 3e-5 6e-5 1e-4 2e-4] [--out DIR]
                                      [--testbed NAME] [--baseline-runs DIR] [--smoke]

Prints each criterion of docs/testbed.md with its measured value and PASS/FAIL:

1. The README's main command (``python -m replay_exp.train seed=S``, the default thread count,
   nothing else running) finishes in <= 5 minutes and lifts held-out pass@1 by >= 15 points
   (median over seeds; the warm start is shipped, so it is not trained here).
2. The default replay config's batches (those same runs) have mean per-token
   KL(behaviour || current) <= 0.02 and <= 5 % of tokens clipped (the PPO clip zeroes their
   gradient), averaged over the run.
3. Held-out pass@1 has a standard error <= 1.2 points at every evaluation of those runs
   (sqrt(p (1 - p) / n) on n held-out problems).
4. The on-policy baseline at its best learning rate (highest seed-mean final pass@1 over
   ``--lrs``, at the study budget of ``sweeps/_tiny_base.yaml``) is still improving at half of
   the study budget (its second-half gain has a 95 % bootstrap interval above 0, resampling
   seeds and problems) and ends >= 25 points above the start.

``--testbed NAME`` calibrates another testbed (``testbed=NAME`` on every run, its study base
``sweeps/_NAME_base.yaml``, e.g. ``--testbed chain_sum``); ``--baseline-runs DIR`` reads part 4
from the finished on-policy runs of a sweep (matched by ``algo.lr`` and ``seed`` in their
config.yaml, e.g. ``runs/transfer_lr_chain_sum``) instead of training its own.

Part 1 runs first, one run at a time, so its timings are clean; part 4 then runs two runs at a
time with ``threads=1`` each. Runs live under ``--out`` (default a temporary folder); a rerun
with the same ``--out`` skips the finished ones (the trainer does). ``--smoke`` (seed 0, one
learning rate, every run cut to a few steps on 8 held-out problems: about a minute) only checks
that it all runs: its verdicts mean nothing and it exits 0 whatever they say.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from replay_exp.analysis.stats import per_problem_values, percentile_interval, read_details
from replay_exp.runlog import read_metrics

MAIN_SECONDS, MAIN_LIFT = 300.0, 0.15
KL_MAX, CLIP_MAX, SE_MAX = 0.02, 0.05, 0.012
BASELINE_LIFT = 0.25
# ``--smoke``: every run cut to 4 steps (4 paper units on-policy) with 8 held-out problems;
# part 1 evaluates at the start and the end, part 4 every 2 units (its half-budget point).
SMOKE_EVAL = ["eval.n_problems=8", "eval.sampled_problems=8"]
SMOKE_MAIN = ["schedule.max_steps=4", "eval.every=4", *SMOKE_EVAL]
SMOKE_STUDY = ["schedule.max_compute=4", "eval.every=2", *SMOKE_EVAL]


def train(run_dir: Path, *overrides: str) -> float:
    """Run the train entrypoint into ``run_dir``; returns its wall seconds."""
    cmd = [sys.executable, "-m", "replay_exp.train", f"run_dir={run_dir}",
           "logger.progress=false", *overrides]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def pass1_matrix(run_dir: Path) -> np.ndarray:
    """Per-problem greedy correctness [evaluations, problems] of a finished run."""
    return np.stack([per_problem_values(r, "eval/pass@1") for r in read_details(run_dir)])


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def main_command(out: Path, seeds: list[int], extra: list[str]) -> bool:
    """Criteria 1-3 (``extra``: more overrides of every run)."""
    print("1-3. the README main command, one run at a time, default threads", flush=True)
    walls, lifts, kls, clips, ses = [], [], [], [], []
    for seed in seeds:
        run_dir = out / "main" / f"seed{seed}"
        fresh = not (run_dir / "summary.json").is_file()
        wall = train(run_dir, f"seed={seed}", *extra)
        rows = read_metrics(run_dir / "metrics.jsonl")
        evals = [r["eval/pass@1"] for r in rows if r.get("eval/pass@1") is not None]
        train_rows = [r for r in rows if r.get("diag/kl") is not None]
        kl = statistics.mean(r["diag/kl"] for r in train_rows)
        clip = statistics.mean(r["diag/clip_frac"] for r in train_rows)
        outside = statistics.mean(r["diag/outside_clip"] for r in train_rows)
        n = pass1_matrix(run_dir).shape[1]
        se = max(np.sqrt(p * (1 - p) / n) for p in evals)
        walls.append(wall if fresh else float("nan"))
        lifts.append(evals[-1] - evals[0])
        kls.append(kl)
        clips.append(clip)
        ses.append(se)
        print(f"  seed {seed}: wall {wall:6.1f} s{'' if fresh else ' (already finished)'}, "
              f"pass@1 {evals[0]:.3f} -> {evals[-1]:.3f} ({100 * lifts[-1]:+.1f} pts), "
              f"KL(behaviour||current) {kl:.4f}, clipped {100 * clip:.2f} % "
              f"(outside the clip range {100 * outside:.2f} %), max SE {100 * se:.2f} pts "
              f"on {n} problems", flush=True)  # fmt: skip
    timed = [w for w in walls if w == w]
    wall = statistics.median(timed) if timed else float("nan")
    lift, kl, clip, se = (statistics.median(lifts), statistics.mean(kls), statistics.mean(clips),
                          max(ses))  # fmt: skip
    checks = [
        (f"main command wall time (median) <= {MAIN_SECONDS:.0f} s", wall <= MAIN_SECONDS,
         f"{wall:.1f} s"),
        (f"main command lift (median) >= {100 * MAIN_LIFT:.0f} pts", lift >= MAIN_LIFT,
         f"{100 * lift:+.1f} pts"),
        (f"default replay: mean KL(behaviour||current) <= {KL_MAX}", kl <= KL_MAX, f"{kl:.4f}"),
        (f"default replay: tokens clipped <= {100 * CLIP_MAX:.0f} %", clip <= CLIP_MAX,
         f"{100 * clip:.2f} %"),
        (f"held-out pass@1 SE <= {100 * SE_MAX:.1f} pts", se <= SE_MAX, f"{100 * se:.2f} pts"),
    ]  # fmt: skip
    for name, ok, value in checks:
        print(f"  {verdict(ok)}  {name}: {value}")
    return all(ok for _, ok, _ in checks)


def finished_runs(root: Path, lrs: list[str], seeds: list[int]) -> dict:
    """(lr, seed) -> the finished run under ``root`` whose config.yaml has that ``algo.lr``
    and ``seed`` (SystemExit naming what is missing)."""
    import yaml

    found = {}
    for summary in root.glob("**/summary.json"):
        cfg = yaml.safe_load((summary.parent / "config.yaml").read_text())
        found[(float(cfg["algo"]["lr"]), int(cfg["seed"]))] = summary.parent
    missing = [(lr, s) for lr in lrs for s in seeds if (float(lr), s) not in found]
    if missing:
        raise SystemExit(f"--baseline-runs {root}: no finished run for (lr, seed) {missing}")
    return {(lr, s): found[(float(lr), s)] for lr in lrs for s in seeds}


def baseline_lr_sweep(
    out: Path,
    seeds: list[int],
    lrs: list[str],
    jobs: int,
    extra: list[str],
    base: str = "_tiny_base",
    runs_root: Path | None = None,
) -> bool:
    """Criterion 4 (``extra``: more overrides of every run; ``base``: the study's sweep base;
    ``runs_root``: read finished runs from there instead of training)."""
    print(f"4. on-policy baseline at the study budget, lr in {lrs}, seeds {seeds} "
          f"({jobs} runs at a time, threads=1)", flush=True)  # fmt: skip
    if runs_root is not None:
        runs = finished_runs(runs_root, lrs, seeds)
    else:
        runs = {(lr, s): out / "baseline" / f"lr{lr}_seed{s}" for lr in lrs for s in seeds}
        study = [f"+sweep={base}", "buffer=on_policy", "threads=1", "save_final_model=false",
                 *extra]  # fmt: skip
        with ThreadPoolExecutor(jobs) as pool:
            list(pool.map(lambda k: train(runs[k], *study, f"algo.lr={k[0]}", f"seed={k[1]}"),
                          runs))  # fmt: skip
    curves = {}
    for lr in lrs:
        mats = np.stack([pass1_matrix(runs[(lr, s)]) for s in seeds])  # [S, K, J]
        curves[lr] = mats
        m = mats.mean(axis=(0, 2))
        print(f"  lr {lr}: seed-mean pass@1 {m[0]:.3f} -> {m[len(m) // 2]:.3f} (half) -> "
              f"{m[-1]:.3f} (end)", flush=True)  # fmt: skip
    best = max(lrs, key=lambda lr: curves[lr][:, -1].mean())
    mats = curves[best]
    S, K, J = mats.shape
    half = K // 2  # evaluations at 0, 50, ..., 1000 units: index K // 2 is 500 (1500 of 3000)
    gain = mats[:, -1] - mats[:, half]  # [S, J], paired per seed and problem
    rng = np.random.default_rng(0)
    boots = []
    for _ in range(2000):
        s_idx, j_idx = rng.integers(0, S, S), rng.integers(0, J, J)
        boots.append(gain[s_idx][:, j_idx].mean())
    lo, hi = percentile_interval(np.array(boots))
    lift = mats[:, -1].mean() - mats[:, 0].mean()
    checks = [
        (f"baseline at its best lr ({best}) still improving at half budget",
         lo > 0, f"second-half gain {100 * gain.mean():+.1f} pts [95 % CI {100 * lo:+.1f}, "
         f"{100 * hi:+.1f}]"),
        (f"baseline at its best lr ends >= {100 * BASELINE_LIFT:.0f} pts above the start",
         lift >= BASELINE_LIFT, f"{100 * lift:+.1f} pts"),
    ]  # fmt: skip
    for name, ok, value in checks:
        print(f"  {verdict(ok)}  {name}: {value}")
    return all(ok for _, ok, _ in checks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--lrs", nargs="+", default=["3e-5", "6e-5", "1e-4", "2e-4"])
    ap.add_argument("--out", type=Path, default=None, help="runs folder (default: a temp dir)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel runs in part 4")
    ap.add_argument("--smoke", action="store_true", help="seed 0, lr 6e-5, 4-step runs")
    ap.add_argument("--testbed", default=None, help="calibrate testbed=NAME (e.g. chain_sum)")
    ap.add_argument("--baseline-runs", type=Path, default=None,
                    help="read part 4 from a sweep's finished on-policy runs")  # fmt: skip
    args = ap.parse_args()
    main_extra, study_extra = [], []
    base = "_tiny_base"
    if args.testbed:
        main_extra, study_extra = [f"testbed={args.testbed}"], [f"testbed={args.testbed}"]
        base = f"_{args.testbed}_base"
    if args.smoke:
        args.seeds, args.lrs, args.jobs = [0], ["6e-5"], 1
        main_extra, study_extra = main_extra + SMOKE_MAIN, study_extra + SMOKE_STUDY
    out = args.out or Path(tempfile.mkdtemp(prefix="replay-exp-calibration-"))
    print(f"runs in {out}")
    ok = main_command(out, args.seeds, main_extra)
    ok = baseline_lr_sweep(out, args.seeds, args.lrs, args.jobs, study_extra, base,
                           args.baseline_runs) and ok  # fmt: skip
    print(json.dumps({"all_pass": ok}))
    if args.smoke:
        print("smoke run: the verdicts of 4-step runs mean nothing")
        return
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
