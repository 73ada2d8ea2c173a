"""Benchmark of the README's main command on the embedded default (run by hand).

    python bench/embedded_default.py [--seeds 0 1 2] [--extra key=value ...] [--smoke]

Runs ``python -m replay_exp.train seed=S`` once per seed, as a user would, and prints per seed:
wall seconds of the whole command, held-out pass@1 of the warm-start model (step 0) and of the
final policy, the lift in points, and the measured mu. The first seed uses an empty warm-start
cache: with the shipped warm start (the default) nothing is trained and every seed times the
same thing; with a recipe that is not shipped (``--extra model.warm_start.shipped=false``) the
supervised phase runs in the first seed's command (a cold start) and later seeds reuse it.
Ends with the medians over seeds. ``bench/calibrate_testbed.py`` checks the testbed's criteria.
``--smoke`` (seed 0 only, ``debug=smoke``: 3 steps, 8 held-out problems; seconds) only checks
that it all runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# ``--smoke``: 3 steps (conf/debug/smoke.yaml), evaluated on 8 held-out problems.
SMOKE = ["debug=smoke", "eval.n_problems=8", "eval.sampled_problems=8"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--extra", nargs="*", default=[], help="extra overrides for every run")
    ap.add_argument("--smoke", action="store_true", help="seed 0, 3 steps, 8 held-out problems")
    args = ap.parse_args()
    if args.smoke:
        args.seeds, args.extra = [0], [*SMOKE, *args.extra]
    work = Path(tempfile.mkdtemp(prefix="replay-exp-bench-"))
    cache = work / "cache"
    rows = []
    for seed in args.seeds:
        run_dir = work / f"seed{seed}"
        cmd = [
            sys.executable, "-m", "replay_exp.train", f"seed={seed}", f"run_dir={run_dir}",
            f"model.warm_start.cache_dir={cache}", "logger.progress=false", *args.extra,
        ]  # fmt: skip
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        summary = json.loads((run_dir / "summary.json").read_text())
        p0, p1 = summary["initial"]["eval/pass@1"], summary["final"]["eval/pass@1"]
        rows.append(
            {
                "seed": seed,
                "wall_s": wall,
                "pass1_start": p0,
                "pass1_final": p1,
                "lift_pts": 100 * (p1 - p0),
                "measured_mu": summary["compute"].get("measured_mu"),
            }
        )
        r = rows[-1]
        print(
            f"seed {seed}: wall {wall:6.1f}s  pass@1 {p0:.3f} -> {p1:.3f} "
            f"({r['lift_pts']:+.1f} pts)  measured mu {r['measured_mu']:.2f}",
            flush=True,
        )
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k != "seed"}
    print(
        f"median over {len(rows)} seeds: wall {med['wall_s']:.1f}s (first seed, empty cache, seed "
        f"{rows[0]['seed']}: {rows[0]['wall_s']:.1f}s)  pass@1 {med['pass1_start']:.3f} -> "
        f"{med['pass1_final']:.3f}  lift {med['lift_pts']:+.1f} pts  mu {med['measured_mu']:.2f}"
    )


if __name__ == "__main__":
    main()
