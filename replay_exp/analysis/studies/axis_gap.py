"""Does a configuration save more on one x-axis than on another? (Finding 6: node time against
compute.)

    python -m replay_exp.analysis.studies.axis_gap <sweep dirs> [--axes node compute] [--frac 0.98]
        [--out DIR]

The saving of a configuration against the on-policy baseline on an axis is ``1 - x_config /
x_baseline``, each x the amount of that axis a curve needs to reach ``frac`` x the baseline's
peak (the report's definition, ``replay-exp-report --x <axis>``). Here it is taken **per seed**,
on paired seeds (every configuration must have run the baseline's seeds): the target is fixed
once, ``frac`` x the peak of the baseline's seed-mean curve, and each run's own curve is read
on both axes. Per seed the gap is

    gap_s = saving_s(first axis) - saving_s(second axis)

and its interval the t-interval over seeds, mean +- t_{S-1} sd / sqrt(S) (no problem
bootstrap: a run's curve on both axes is the same evaluations, so problem noise moves both
savings together and mostly cancels in the gap). A seed whose run (or whose baseline run)
never reaches the target has no saving; the table says how many seeds have one, and a
configuration with fewer than two gets no interval.

Writes ``gap.csv`` (one row per configuration and seed) and ``gap.md`` (per configuration:
mean savings on each axis, the gap with its interval and verdict) to ``--out``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from replay_exp.analysis.curves import aggregate, compute_to_target, x_column
from replay_exp.analysis.loader import Runs, load_runs
from replay_exp.analysis.report import ReportError, baseline_label
from replay_exp.analysis.stats import t_interval, verdict


def per_seed_savings(
    runs: Runs, axes: tuple[str, str], frac: float = 0.98, metric: str = "eval/pass@1"
) -> tuple[pd.DataFrame, str, float]:
    """Per (configuration, seed): x to target on each axis for the run and its baseline seed,
    the savings and their gap; also the baseline's label and the target."""
    base = baseline_label(runs, metric, axes[1])
    if base is None:
        raise ReportError("no on-policy baseline (buffer.name=on_policy) among the runs")
    steps = runs.steps.dropna(subset=[metric])
    target = frac * float(aggregate(steps[steps["label"] == base], axes[1], metric)["mean"].max())
    to_target = {}
    for (label, seed), g in steps.groupby(["label", "seed"], sort=False):
        for axis in axes:
            col = x_column(axis)
            if col not in g or g[col].isna().all():
                raise ReportError(f"run {label}, seed {seed} has no {col} (x-axis {axis})")
            g = g.sort_values(col, kind="stable")
            to_target[label, seed, axis] = compute_to_target(g[col], g[metric], target)
    rows = []
    base_seeds = {s for (lab, s, _) in to_target if lab == base}
    for label in dict.fromkeys(runs.runs["label"]):
        if label == base:
            continue
        for seed in sorted({s for (lab, s, _) in to_target if lab == label}):
            if seed not in base_seeds:
                raise ReportError(f"{label} ran seed {seed}, which the baseline did not: unpaired")
            row = {"label": label, "seed": seed}
            for axis in axes:
                x, xb = to_target[label, seed, axis], to_target[base, seed, axis]
                row[f"{axis}_to_target"], row[f"baseline_{axis}_to_target"] = x, xb
                reached = math.isfinite(x) and math.isfinite(xb)
                row[f"{axis}_saving"] = 1 - x / xb if reached else math.nan
            row["gap"] = row[f"{axes[0]}_saving"] - row[f"{axes[1]}_saving"]
            rows.append(row)
    return pd.DataFrame(rows), base, target


def summarise(table: pd.DataFrame, axes: tuple[str, str]) -> pd.DataFrame:
    """Per configuration: seeds with a gap, the mean savings, the mean gap and its t-interval
    over seeds (module docstring)."""
    out = []
    for label, g in table.groupby("label", sort=False):
        gaps = g["gap"].dropna().to_numpy()
        n = len(gaps)
        row = {"label": label, "seeds": len(g), "seeds_with_gap": n}
        for axis in axes:
            row[f"{axis}_saving"] = float(g[f"{axis}_saving"].mean())
        row["gap"] = float(gaps.mean()) if n else math.nan
        if n >= 2:
            ci = t_interval(row["gap"], [(float(np.var(gaps, ddof=1)) / n, n - 1)])
            row.update(gap_lo=ci["lo"], gap_hi=ci["hi"], gap_mde=ci["mde"])
            row["verdict"] = verdict(ci["lo"], ci["hi"])
        else:
            row.update(gap_lo=math.nan, gap_hi=math.nan, gap_mde=math.nan, verdict="no interval")
        out.append(row)
    return pd.DataFrame(out)


def markdown(
    summary: pd.DataFrame, axes: tuple[str, str], base: str, target: float, frac: float
) -> str:
    a, b = axes
    lines = [
        f"# Saving on {a} minus saving on {b}",
        "",
        f"Baseline: **{base}**; target {target:.3f} ({frac:.0%} of its seed-mean peak, as the "
        "report). "
        f"Per paired seed: saving = 1 - x / x_baseline on each axis, gap = {a} saving - {b} "
        "saving; interval: t over seeds (replay_exp/analysis/studies/axis_gap.py). "
        "Verdict *better*: "
        f"the saving on {a} exceeds the saving on {b}.",
        "",
        f"| configuration | seeds (with a gap) | {a} saving | {b} saving | gap [95 % CI] | MDE "
        "| verdict |",
        "|---|---|---|---|---|---|---|",
    ]

    def pct(v: float, sign: str = "+") -> str:
        return f"{v:{sign}.1%}" if math.isfinite(v) else "n/a"

    for _, r in summary.iterrows():
        lines.append(
            f"| {r['label']} | {r['seeds']} ({r['seeds_with_gap']}) | {pct(r[f'{a}_saving'])} "
            f"| {pct(r[f'{b}_saving'])} | {pct(r['gap'])} [{pct(r['gap_lo'])}, "
            f"{pct(r['gap_hi'])}] | {pct(r['gap_mde'], '')} | {r['verdict']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("sweep_dirs", nargs="+", type=Path)
    p.add_argument("--axes", nargs=2, default=["node", "compute"], metavar=("FIRST", "SECOND"))
    p.add_argument("--frac", type=float, default=0.98)
    p.add_argument("--metric", default="eval/pass@1")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    axes = tuple(args.axes)
    try:
        x = "node" if "node" in axes else axes[0]  # loading with x="node" models in-process clocks
        runs = load_runs(args.sweep_dirs, metric=args.metric, x=x)
        table, base, target = per_seed_savings(runs, axes, args.frac, args.metric)
    except (ReportError, FileNotFoundError) as e:
        raise SystemExit(f"axis_gap: {e}") from None
    summary = summarise(table, axes)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "gap.csv", index=False)
    (args.out / "gap.md").write_text(markdown(summary, axes, base, target, args.frac))
    print((args.out / "gap.md").read_text())


if __name__ == "__main__":
    main()
