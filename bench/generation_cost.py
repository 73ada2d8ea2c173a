"""How close runtime.generation_cost=modelled gets to compute.mu (run by hand, quiet machine).

    python bench/generation_cost.py [--steps 30] [--mu 6.84 5.28] [--sigma 0.5] [--out F.json]
                                    [--smoke]

For each mu it runs the embedded default through the one entrypoint with runtime=distributed,
W = 1, T = 1 (bench/async_runtime.py's settings: FIFO N = 512, B = 64, G = 8, evaluation at the
end only, threads=1 per process), first with generation_cost=measured, then with
generation_cost=modelled at that mu (the trainers' running seconds per sample as the
reference). It prints, side by side: the target mu, the realised cost ratio
(``compute/measured_mu``: charged generation seconds per rollout over training seconds per
trained sample), their ratio, the measured run's ratio (what this machine does unmodelled), the
reuse that emerged against mu T / W, and trainer rank 0's seconds waiting for data, and the
ratio's factors: the calls' mean longest over its expectation (``draws``), the last t the
generator timed with over the run's final t, and the generator's charged seconds over its
modelled units at that t (``excess``: sleep overshoot, overruns). The
acceptance of issue 25 asks for realised / target within 10 % on a quiet machine for a 30-step
run. Nothing here is a test (tests/runtime/test_gencost.py checks the mechanism); ``--smoke``
(3 steps, mu 6.84, 8 held-out problems: under a minute) only checks that it all runs.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from async_runtime import SMOKE, _run  # bench/ is the script's directory


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--mu", nargs="+", type=float, default=[6.84, 5.28])
    ap.add_argument("--sigma", type=float, default=0.5)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true", help="3 steps at mu 6.84")
    args = ap.parse_args()
    if args.smoke:
        args.steps, args.mu = 3, [6.84]
    sched = ["runtime=distributed", "schedule.workers=1", "schedule.trainers=1",
             "buffer.shards=1", f"schedule.max_steps={args.steps}",
             f"eval.every={args.steps}", *(SMOKE if args.smoke else [])]  # fmt: skip
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        measured = _run(sched, Path(tmp) / "measured")["summary"]
        for mu in args.mu:
            run = _run([*sched, f"compute.mu={mu}", "runtime.generation_cost=modelled",
                        f"runtime.cost_model.length_sigma={args.sigma}"],
                       Path(tmp) / f"modelled_{mu}")  # fmt: skip
            s = run["summary"]
            (gen,) = s["runtime"]["generators"]
            t_final = s["compute"]["seconds_train"] / s["compute"]["samples_trained"]
            results.append({
                "mu": mu, "sigma": args.sigma, "steps": args.steps,
                "realised_mu": s["compute"]["measured_mu"],
                "realised_over_target": s["compute"]["measured_mu"] / mu,
                "measured_run_mu": measured["compute"]["measured_mu"],
                "reuse": s["runtime"]["reuse"], "first_order_reuse": mu * 1 / 1,
                "measured_run_reuse": measured["runtime"]["reuse"],
                "wait_seconds_rank0": s["runtime"]["wait_seconds"], "wall_s": run["wall_s"],
                # realised / target = draws x t ratio x excess (x what the ledger's count of
                # rollouts differs from the generator's: in flight at the end)
                "calls": gen["batches"],
                "draws": gen["modelled_units"] / (mu * gen["rollouts"]),
                "t_ratio": gen["modelled_per_sample"] / t_final,
                "excess": gen["gen_seconds"] / (gen["modelled_units"] * gen["modelled_per_sample"]),
                "overruns": gen["overruns"],
            })  # fmt: skip
            print(json.dumps(results[-1]), flush=True)
    print()
    print("| mu target | realised | realised / target | calls | draws | t last / t final | "
          "excess | unmodelled run's ratio | reuse | mu T/W | unmodelled reuse | trainer wait s "
          "| wall s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['mu']:.2f} | {r['realised_mu']:.2f} | {r['realised_over_target']:.3f} | "
            f"{r['calls']} | {r['draws']:.3f} | {r['t_ratio']:.3f} | {r['excess']:.3f} | "
            f"{r['measured_run_mu']:.2f} | {r['reuse']:.2f} | {r['first_order_reuse']:.2f} | "
            f"{r['measured_run_reuse']:.2f} | {r['wait_seconds_rank0']:.1f} | {r['wall_s']:.0f} |"
        )
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
