"""The real asynchronous runtime against its emulation at the same (W, T) (run by hand).

    python bench/async_runtime.py [--steps 60] [--splits 1,1 1,2 2,1] [--in-flight 1 4]
                                  [--out FILE.json] [--smoke]

For each split (W generator processes, T trainer processes) it runs the embedded default twice
through the one entrypoint, both with buffer=fifo, N = 512, B = 64, G = 8, evaluation only at
the end (64 problems), threads=1 per process, in this order (runs never overlap):
  real:     ``runtime=distributed schedule=async schedule.workers=W schedule.trainers=T``,
            once per ``runtime.max_in_flight`` given (the generators' queue depth per trainer)
  emulated: ``runtime=inprocess`` with the same schedule and compute.mu = the cost ratio the
            real run measured (seconds per generated rollout / seconds per trained sample,
            ``compute/measured_mu``), so the emulation predicts reuse mu T / W from the real
            costs, to first order.
and reports, per run: reuse y = samples trained / rollouts generated over the training steps,
the paper's mu estimate from the real counts, (K_train / T) / (K_inf / W) = y W / T, against
the measured cost ratio (they agree when nothing but compute limits either side),
the off-policiness of the trained samples (mean, median, 90th percentile, share > 0) from
buffer_telemetry.json, steps per second over the training loop (startup excluded), the real
runtime's weight pushes and skipped pushes, and the trainer rank 0's seconds waiting for data.

On this 2-core machine W + T > 2 processes share the cores; the timings then measure that
sharing, which the report says. Nothing here is a test; ``--smoke`` (3 steps, split (1,1),
one queue depth, 8 held-out problems: under a minute) only checks that it all runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

COMMON = [
    "schedule=async", "schedule.gpus=null", "schedule.max_compute=null", "buffer=fifo",
    "buffer.capacity=512", "eval.at_start=false", "eval.unit=steps", "task.n_eval=64",
    "eval.sampled_problems=16", "logger.progress=false", "threads=1", "checkpoint.every=null",
]  # fmt: skip


def _run(overrides: list[str], run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "replay_exp.train", *COMMON, *overrides, f"run_dir={run_dir}"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"failed: {' '.join(cmd)}\n{out.stderr[-3000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    tele = json.loads((run_dir / "buffer_telemetry.json").read_text())
    rows = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line
    ]
    return {"summary": summary, "telemetry": tele, "rows": rows,
            "wall_s": time.perf_counter() - t0}  # fmt: skip


def _off_policiness(hist: list[int]) -> dict[str, float]:
    """Mean / median / p90 / share > 0 of a 0..63 + overflow histogram (overflow read as 64)."""
    h = np.asarray(hist, dtype=float)
    x = np.arange(len(h))
    n = h.sum()
    cdf = np.cumsum(h) / n
    return {
        "mean": float((h * x).sum() / n),
        "median": float(x[np.searchsorted(cdf, 0.5)]),
        "p90": float(x[np.searchsorted(cdf, 0.9)]),
        "share_stale": float(h[1:].sum() / n),
    }


def _steps_per_second(rows: list[dict]) -> float:
    """Training steps per wall second since the loop started (``runtime/steps_per_second``,
    measured alike by both runtimes since the one-loop change; before it the emulated rate
    came from compute/seconds_gen + seconds_train, which leaves out evaluation)."""
    return float(rows[-1]["runtime/steps_per_second"])


# ``--smoke``: a held-out split of 8 problems (after COMMON's, so these win).
SMOKE = ["task.n_eval=8", "eval.sampled_problems=4"]


def _compare(W: int, T: int, k: int, steps: int, tmp: Path, extra: list[str]) -> dict:
    """The real run at (W, T) and queue depth k, then its emulation at the measured cost ratio;
    ``extra``: overrides of both runs."""
    sched = [f"schedule.workers={W}", f"schedule.trainers={T}", f"buffer.shards={T}",
             f"schedule.max_steps={steps}", f"eval.every={steps}", *extra]  # fmt: skip
    real = _run(["runtime=distributed", f"runtime.max_in_flight={k}", *sched],
                tmp / f"real_{W}_{T}_{k}")  # fmt: skip
    rt = real["summary"]["runtime"]
    mu_cost = real["summary"]["compute"]["measured_mu"]
    emu = _run([f"compute.mu={mu_cost:.6g}", *sched], tmp / f"emu_{W}_{T}_{k}")
    ec = emu["summary"]["compute"]
    return {
        "W": W, "T": T, "max_in_flight": k, "steps": steps, "processes": W + T,
        "real_reuse": rt["reuse"], "mu_from_counts": rt["mu_estimate"],
        "mu_cost": mu_cost, "first_order_reuse": mu_cost * T / W,
        "emulated_reuse": ec["samples_trained"] / ec["rollouts"],
        "real_off_policiness": _off_policiness(real["telemetry"]["off_policiness"]),
        "emulated_off_policiness": _off_policiness(emu["telemetry"]["off_policiness"]),
        "real_steps_per_s": rt["steps_per_second"],
        "emulated_steps_per_s": _steps_per_second(emu["rows"]),
        "real_wall_s": real["wall_s"], "emulated_wall_s": emu["wall_s"],
        "pushes": rt["pushes"], "pushes_skipped": rt["pushes_skipped"],
        "wait_seconds_rank0": rt["wait_seconds"],
        "real_final_pass1": real["summary"]["final"].get("eval/pass@1"),
        "emulated_final_pass1": emu["summary"]["final"].get("eval/pass@1"),
        "accounting_balanced": rt["balanced"],
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--splits", nargs="+", default=["1,1", "1,2", "2,1"])
    ap.add_argument("--in-flight", nargs="+", type=int, default=[1, 4])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true", help="3 steps at (1,1), queue depth 1")
    args = ap.parse_args()
    extra = []
    if args.smoke:
        args.steps, args.splits, args.in_flight, extra = 3, ["1,1"], [1], SMOKE
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for split in args.splits:
            for k in args.in_flight:
                W, T = (int(v) for v in split.split(","))
                results.append(_compare(W, T, k, args.steps, Path(tmp), extra))
                print(json.dumps(results[-1]), flush=True)
    print()
    print("| (W,T) | in flight | reuse real | mu from counts | mu cost ratio | mu T/W | "
          "reuse emulated | off-pol. mean real / emu | stale share real / emu | "
          "steps/s real / emu | pushes (skipped) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        ro, eo = r["real_off_policiness"], r["emulated_off_policiness"]
        print(
            f"| ({r['W']},{r['T']}) | {r['max_in_flight']} | {r['real_reuse']:.2f} | "
            f"{r['mu_from_counts']:.2f} | {r['mu_cost']:.2f} | {r['first_order_reuse']:.2f} | "
            f"{r['emulated_reuse']:.2f} | "
            f"{ro['mean']:.2f} / {eo['mean']:.2f} | {ro['share_stale']:.2f} / "
            f"{eo['share_stale']:.2f} | {r['real_steps_per_s']:.2f} / "
            f"{r['emulated_steps_per_s']:.2f} | {r['pushes']} ({r['pushes_skipped']}) |"
        )
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
