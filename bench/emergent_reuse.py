"""Emergent reuse in the real runtime at a GPU node's costs (issue 25, part 2; run by hand).

    python bench/emergent_reuse.py [--steps 120] [--mu 6.84 5.28] [--splits 6,2 5,3 4,4]
                                   [--variants sigma=0 sigma=1 in_flight=1 in_flight=16
                                    sync_every=4 load_cost=41 load_cost=164]
                                   [--merge runs.json] [--label TEXT] [--out DIR] [--replot]
                                   [--smoke]

The paper's 8-GPU node split into W generators and T trainers, run for real
(``runtime=distributed``: W + T processes, threads=1 each) with the generators' calls lasting
what a GPU node would spend (``runtime.generation_cost=modelled``, docs/runtime.md): the
embedded default with B = 96, G = 8 (B/T rollouts per call is a whole number of groups at
T = 2, 3, 4), FIFO N = 960, evaluation at the end only. The baseline cause settings: response
length tail sigma = 0.5, ``runtime.max_in_flight`` = 4, weights pushed every step, a weight
load costing only its real time. Each variant changes one cause (or the named pair) at the
first mu, at every split.

Reported per run, over the second half of the steps (the start-up and the final drain left
out): reuse = samples trained / rollouts received, against the first-order mu T / W and
against mu T / W (1 + c T / (B mu)), which adds a load of c trained samples' time after every
call of B/T rollouts (a generator alternates a call of (B/T) mu t seconds and a load of c t;
with a push every step and calls longer than a step, every call is followed by one load);
and over the whole run: the realised cost ratio (``compute/measured_mu``) against mu, the
trainers' busy share (seconds in updates per rank / seconds of the training loop: the model's
t is a trained sample's update time, and whatever else a trainer step does slows the trainers
against the model, so mu T / W x busy is the first order with that overhead), trainer
rank 0's seconds waiting for data, the generators' mean seconds blocked on a full queue
(``stall_seconds``), sleeping under the model, and loading weights, pushes (skipped), and
the off-policiness of the trained samples (mean, 90th percentile). Writes ``runs.json``,
``table.md`` and ``reuse.png`` under ``--out`` (``--replot --merge runs.json``: only redraws).
The "explained" column is the first order with what each run measured: its realised cost
ratio for mu, its trainers' busy share and its load cost, mu' T / W x busy x (1 + c T / (B mu')).

On 2 cores the W + T = 8 processes share the machine; the model's sleeps scale with the
trainers' measured seconds per sample, so the ratios hold under that sharing (the realised
cost ratio column says how well). Nothing here is a test; ``--smoke`` (the baseline at mu 6.84
and (W,T) = (1,1) for 4 steps, 8 held-out problems: under a minute) only checks that it all runs
(its second-half reuse may read nan: no generator call lands in so few steps).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from async_runtime import SMOKE, _off_policiness, _run  # bench/ is the script's directory

B, G, N = 96, 8, 960
BASE = {"sigma": 0.5, "in_flight": 4, "sync_every": 1, "load_cost": 0.0}
KEYS = {
    "sigma": "runtime.cost_model.length_sigma",
    "in_flight": "runtime.max_in_flight",
    "sync_every": "schedule.sync_every",
    "load_cost": "runtime.cost_model.load_cost",
}


def predicted(mu: float, W: int, T: int, load_cost: float) -> float:
    """mu T / W (1 + c T / (B mu)): module docstring."""
    return mu * T / W * (1 + load_cost * T / (B * mu))


def explained(r: dict) -> float:
    """The first order with what the run measured: the realised cost ratio for mu, the
    trainers' busy share, and the load after every call: mu' T / W x busy x (1 + c T / (B mu'))."""
    return predicted(r["realised_mu"], r["W"], r["T"], r["load_cost"]) * r["trainer_busy"]


def steady_reuse(rows: list[dict]) -> float:
    """Samples trained per rollout received between the middle step and the last."""
    rows = [r for r in rows if "compute/rollouts" in r and "step" in r]
    mid = rows[len(rows) // 2]
    last = rows[-1]
    trained = last["compute/samples_trained"] - mid["compute/samples_trained"]
    received = last["compute/rollouts"] - mid["compute/rollouts"]
    return trained / received if received else float("nan")


def one(
    mu: float, W: int, T: int, causes: dict, variant: str, steps: int, tmp: Path, extra: list[str]
) -> dict:
    """One run of the real runtime (``extra``: more overrides) and what it measured."""
    overrides = [
        "runtime=distributed", "runtime.generation_cost=modelled", f"compute.mu={mu}",
        f"schedule.workers={W}", f"schedule.trainers={T}", f"buffer.shards={T}",
        f"schedule.batch_size={B}", f"algo.group_size={G}", f"buffer.capacity={N}",
        f"schedule.max_steps={steps}", f"eval.every={steps}", "logger.diagnostics=false",
        *(f"{KEYS[k]}={v}" for k, v in causes.items()), *extra,
    ]  # fmt: skip
    name = f"mu{mu}_{W}_{T}_{variant.replace(',', '+').replace('=', '')}"
    run = _run(overrides, tmp / name)
    s = run["summary"]
    rt, gens = s["runtime"], s["runtime"]["generators"]

    def mean(key: str) -> float:
        return float(np.mean([g[key] for g in gens])) if gens else float("nan")

    off = _off_policiness(run["telemetry"]["off_policiness"])
    wall = run["wall_s"]
    loop_s = steps / rt["steps_per_second"]  # the trainers' loop, start-up excluded
    busy = s["compute"]["seconds_train"] / T / loop_s  # share of it spent in the updates
    return {
        "mu": mu, "W": W, "T": T, "variant": variant, **causes, "steps": steps,
        "reuse": steady_reuse(run["rows"]), "reuse_whole_run": rt["reuse"],
        "first_order": mu * T / W, "predicted_with_load": predicted(mu, W, T, causes["load_cost"]),
        "realised_mu": s["compute"]["measured_mu"], "trainer_busy": busy,
        "first_order_x_busy": mu * T / W * busy,
        "trainer_wait_s": rt["wait_seconds"], "generator_stall_s": mean("stall_seconds"),
        "generator_slept_s": mean("slept_seconds"), "generator_load_s": mean("weight_load_seconds"),
        "generator_gen_s": mean("gen_seconds"), "overruns": sum(g["overruns"] for g in gens),
        "pushes": rt["pushes"], "pushes_skipped": rt["pushes_skipped"],
        "off_policiness_mean": off["mean"], "off_policiness_p90": off["p90"],
        "steps_per_s": rt["steps_per_second"], "balanced": rt["balanced"], "wall_s": wall,
    }  # fmt: skip


def parse_variant(text: str) -> dict:
    causes = dict(BASE)
    for part in text.split(","):
        key, value = part.split("=")
        if key not in KEYS:
            raise SystemExit(f"unknown cause {key!r}; choose from {sorted(KEYS)}")
        causes[key] = type(BASE[key])(float(value))
    return causes


def table(results: list[dict]) -> str:
    head = (
        "| launch | mu | (W,T) | variant | reuse | mu T/W | x busy | with load | explained | "
        "reuse / (mu T/W) | trainer busy | realised mu | "
        "trainer wait s | gen. stall s | gen. slept s | gen. load s | pushes (skipped) | "
        "off-pol. mean / p90 | steps/s |"
    )
    lines = [head, "|" + "---|" * 19]
    for r in results:
        lines.append(
            f"| {r.get('run_batch', '').split(':')[0]} | {r['mu']:.2f} | ({r['W']},{r['T']}) | "
            f"{r['variant']} | {r['reuse']:.2f} | "
            f"{r['first_order']:.2f} | {r['first_order_x_busy']:.2f} | "
            f"{r['predicted_with_load']:.2f} | {explained(r):.2f} | "
            f"{r['reuse'] / r['first_order']:.2f} | "
            f"{r['trainer_busy']:.2f} | {r['realised_mu']:.2f} | "
            f"{r['trainer_wait_s']:.1f} | {r['generator_stall_s']:.1f} | "
            f"{r['generator_slept_s']:.1f} | {r['generator_load_s']:.1f} | "
            f"{r['pushes']} ({r['pushes_skipped']}) | {r['off_policiness_mean']:.1f} / "
            f"{r['off_policiness_p90']:.0f} | {r['steps_per_s']:.1f} |"
        )
    return "\n".join(lines)


def plot(results: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2), width_ratios=[1.4, 1])

    def key(r: dict) -> tuple:
        return r["mu"], r["variant"], r.get("run_batch", "").split(":")[0]

    for mu, variant, batch in sorted({key(r) for r in results}, key=str):
        rs = sorted((r for r in results if key(r) == (mu, variant, batch)), key=lambda r: r["T"])
        label = f"mu {mu:g}, {variant}" + (f" [{batch}]" if batch else "")
        ax.plot([f"({r['W']},{r['T']})" for r in rs], [r["reuse"] / r["first_order"] for r in rs],
                marker="o", label=label)  # fmt: skip
    paper = {"(6,2)": 2.2 / (6.84 * 2 / 6), "(5,3)": 5.6 / (6.84 * 3 / 5), "(4,4)": 17.6 / 6.84}
    ax.plot(list(paper), list(paper.values()), "k--", marker="s", label="paper, Qwen3-0.6B")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("node split (W generators, T trainers)")
    ax.set_ylabel("measured reuse / first-order mu T / W")
    ax.legend(fontsize=7)
    pred = [explained(r) for r in results]
    meas = [r["reuse"] for r in results]
    bx.scatter(pred, meas, c=["C3" if r["load_cost"] > 0 else "C0" for r in results], s=18)
    top = max(pred + meas) * 1.05
    bx.plot([0, top], [0, top], color="grey", lw=0.8)
    bx.set_xlabel("realised mu x T / W x trainer busy share x (1 + c T / (B mu))")
    bx.set_ylabel("measured reuse (second half)")
    bx.set_title("every run (red: a modelled weight-load cost c)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--mu", nargs="+", type=float, default=[6.84, 5.28])
    ap.add_argument("--splits", nargs="+", default=["6,2", "5,3", "4,4"])
    ap.add_argument(
        "--variants",
        nargs="*",
        default=[
            "sigma=0",
            "sigma=1",
            "in_flight=1",
            "in_flight=16",
            "sync_every=4",
            "load_cost=41",
            "load_cost=164",
        ],  # fmt: skip
    )
    ap.add_argument(
        "--merge",
        type=Path,
        default=None,
        help="runs.json of an earlier launch whose runs join this one's table and figure",
    )
    ap.add_argument("--label", default="", help="recorded with each run of this launch")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--replot", action="store_true", help="only redraw --merge's runs")
    ap.add_argument("--smoke", action="store_true", help="the baseline at (1,1), 4 steps")
    args = ap.parse_args()
    extra = []
    if args.smoke:
        args.steps, args.mu, args.splits, args.variants, extra = 4, [6.84], ["1,1"], [], SMOKE
    if args.replot:
        results = json.loads(args.merge.read_text())
        (args.out / "table.md").write_text(table(results) + "\n")
        plot(results, args.out / "reuse.png")
        return
    splits = [tuple(int(v) for v in s.split(",")) for s in args.splits]
    plan = [(mu, W, T, dict(BASE), "baseline") for mu in args.mu for W, T in splits]
    plan += [(args.mu[0], W, T, parse_variant(v), v) for v in args.variants for W, T in splits]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for mu, W, T, causes, variant in plan:
            results.append(one(mu, W, T, causes, variant, args.steps, Path(tmp), extra))
            results[-1]["run_batch"] = args.label
            print(json.dumps(results[-1]), flush=True)
    if args.merge:
        results = json.loads(args.merge.read_text()) + results
    print()
    print(table(results))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "runs.json").write_text(json.dumps(results, indent=2))
        (args.out / "table.md").write_text(table(results) + "\n")
        plot(results, args.out / "reuse.png")


if __name__ == "__main__":
    main()
