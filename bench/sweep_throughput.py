"""Sweep throughput on this machine: the same study runs through two launchers (run by hand).

    python bench/sweep_throughput.py [--sweep fig4_lr_pareto_tiny] [--params ...] [--out DIR]
                                     [--smoke]

A study is hundreds of runs of the study length (``sweeps/_tiny_base.yaml``: 1000 paper
units). This launches the same runs (default: on-policy at lr 6e-5, seeds 0-3 of
``fig4_lr_pareto_tiny``) twice, nothing else running:

1. ``launcher=local``: Hydra's sequential launcher, one run after another in one process, at
   the default thread count (every core);
2. ``launcher=slurm``: the local single-node SLURM (``scripts/slurm_up.sh``) with
   ``cpus_per_task=1``: as many runs at once as the node has cores, one thread each.

It prints each launcher's wall time, runs per hour and the final held-out pass@1 of every run
under both (the thread count changes float reduction order, so the two sets of numbers may
differ slightly; each is deterministic on its own). Needs SLURM up for part 2 (else it says so
and measures part 1 only). ``--smoke`` launches one run (seed 0) of 3 paper units with 8 held-out
problems through each launcher: it only checks that it all runs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PARAMS = ["experiment=on_policy", "algo.lr=6e-5", "seed=0,1,2,3"]
# ``--smoke``: one run of 3 paper units (3 on-policy steps), evaluated on 8 held-out problems.
SMOKE = ["experiment=on_policy", "algo.lr=6e-5", "seed=0", "schedule.max_compute=3",
         "eval.every=3", "eval.n_problems=8", "eval.sampled_problems=8"]  # fmt: skip


def launch(out: Path, sweep: str, params: list[str], launcher: list[str]) -> float:
    """One multirun of ``sweep`` restricted to ``params`` under ``out``; returns its wall s."""
    cmd = [sys.executable, "-m", "replay_exp.train", "-m", f"+sweep={sweep}",
           f"output_root={out}", "logger.progress=false", "save_final_model=false",
           *params, *launcher]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def finals(out: Path) -> dict[str, float]:
    """Final held-out pass@1 of every run under ``out``, by run directory name."""
    return {
        p.parent.name: json.loads(p.read_text())["final"]["eval/pass@1"]
        for p in sorted(out.rglob("summary.json"))
    }


def slurm_up() -> bool:
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sweep", default="fig4_lr_pareto_tiny")
    ap.add_argument("--params", nargs="+", default=PARAMS, help="the sweep overrides launched")
    ap.add_argument("--out", type=Path, default=None, help="default: a temporary folder")
    ap.add_argument("--slurm-root", type=Path, default=None,
                    help="output_root of the SLURM launch (e.g. runs, to keep its runs for the "
                         "study; default: under --out)")  # fmt: skip
    ap.add_argument("--smoke", action="store_true", help="one run of 3 paper units")
    args = ap.parse_args()
    if args.smoke:
        args.params = SMOKE
    out = args.out or Path(tempfile.mkdtemp(prefix="throughput_"))
    print(f"runs in {out}; sweep {args.sweep} {' '.join(args.params)}", flush=True)
    launchers = {
        "local, sequential, default threads": [],
        "slurm, 1 cpu + 1 thread per run": [
            "launcher=slurm",
            "hydra.launcher.cpus_per_task=1",
        ],  # fmt: skip
    }
    results = {}
    for i, (name, extra) in enumerate(launchers.items()):
        if extra and not slurm_up():
            print(f"{name}: SKIP (no SLURM answers sinfo; start it with scripts/slurm_up.sh)")
            continue
        root = args.slurm_root if extra and args.slurm_root else out / f"launcher{i}"
        wall = launch(root, args.sweep, args.params, extra)
        got = finals(root / args.sweep)
        results[name] = (wall, got)
        print(f"{name}: {len(got)} runs in {wall:.0f} s = {3600 * len(got) / wall:.1f} runs/hour",
              flush=True)  # fmt: skip
        for run, p in got.items():
            print(f"    {run}: final pass@1 {p:.4f}")
    if len(results) == 2:
        (w1, _), (w2, _) = results.values()
        print(f"speed-up of the second launcher over the first: {w1 / w2:.2f}x")


if __name__ == "__main__":
    main()
