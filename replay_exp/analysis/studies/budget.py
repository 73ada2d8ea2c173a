"""Where does a study's budget reach the ceiling? The gain over the last third of a budget.

For a budget B and a configuration, the gain over the last third is ``pass@1(B) -
pass@1(2B/3)`` of its seed-mean curve: the same seeds and the same held-out problems at two
points of the same runs, so it is a paired difference, with the report's interval
(``replay_exp.analysis.stats.compare``, default ``t``: seeds and problems). The rule
(``sweeps/budget_tiny.yaml``, decided before its runs):

- at each candidate B (multiples of ``step``, so that 2B/3 is an evaluation point of a
  50-unit grid when ``step`` = 150), the **best** configuration is the one with the highest
  seed-mean pass@1 at B;
- the study budget is the smallest B >= ``start`` from which on the best configuration's
  gain over the last third is not separable from 0 at every candidate budget; if none up to
  the runs' end, the cap binds.

``python -m replay_exp.analysis.studies.budget runs/budget_tiny --out analysis/results/budget_tiny``
writes ``budget.csv`` (every B x configuration: accuracy at B and 2B/3, gain, interval, MDE),
``budget.png`` (each configuration's gain with its interval against B) and ``summary.md``.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from replay_exp.analysis.loader import Runs, load_runs
from replay_exp.analysis.plots import save_png
from replay_exp.analysis.stats import Arm, build_arms, compare


def gain_over_last_third(
    grid: np.ndarray, arm: Arm, budget: float, n_boot: int = 2000, seed: int = 0
) -> dict:
    """pass@1 at ``budget`` minus at 2/3 of it (both must be grid points) with its interval:
    the arm at ``budget`` compared with itself at 2/3, paired on seeds and problems."""
    k_end, k_mid = _index(grid, budget), _index(grid, 2 * budget / 3)
    end = Arm("end", arm.seeds, arm.values[:, k_end : k_end + 1], arm.per_problem)
    mid = Arm("mid", arm.seeds, arm.values[:, k_mid : k_mid + 1], arm.per_problem)
    out = compare(np.array([budget]), end, mid, n_boot=n_boot, seed=seed)
    return {
        "budget": budget,
        "acc_end": float(end.values.mean()),
        "acc_two_thirds": float(mid.values.mean()),
        "gain": out["final"],
        "gain_lo": out["final_lo"],
        "gain_hi": out["final_hi"],
        "gain_mde": out.get("final_mde", math.nan),
        "verdict": out["final_verdict"],
        "seeds": out["seeds"],
    }


def _index(grid: np.ndarray, x: float) -> int:
    k = int(np.argmin(np.abs(grid - x)))
    if abs(grid[k] - x) > 1e-6 * max(1.0, abs(x)):
        raise ValueError(f"{x:g} is not an evaluation point (nearest {grid[k]:g})")
    return k


def budget_table(
    paths, metric: str = "eval/pass@1", start: float = 1050, step: float = 150, n_boot: int = 2000
) -> pd.DataFrame:
    """Every candidate budget x configuration (the module docstring), with ``best`` marking
    the configuration of highest seed-mean accuracy at that budget."""
    runs = load_runs(paths, metric=metric, x="compute")
    done = runs.runs["status"] == "finished"  # an unfinished run would shorten every curve
    runs = Runs(runs.steps[runs.steps["run"].isin(runs.runs.loc[done, "run"])],
                runs.runs[done], runs.config_keys)  # fmt: skip
    if runs.runs.empty:
        raise ValueError(f"no finished run under {', '.join(map(str, paths))}")
    labels = list(dict.fromkeys(runs.runs["label"]))
    grid, arms = build_arms(runs, labels, labels[0], metric, "compute")
    rows = []
    budgets = np.arange(start, grid[-1] + 1e-6, step)
    for b in budgets:
        for label in labels:
            rows.append({"label": label, **gain_over_last_third(grid, arms[label], b, n_boot)})
    if not rows:
        raise ValueError(f"the runs end at {grid[-1]:g} units, before the first budget {start:g}")
    table = pd.DataFrame(rows)
    best = table.loc[table.groupby("budget")["acc_end"].idxmax()]
    table["best"] = table.index.isin(best.index)
    return table


SECONDS = ("compute/seconds_gen", "compute/seconds_train", "compute/seconds_eval")


def time_split(paths) -> pd.DataFrame:
    """Where a run's seconds go: per configuration, the mean over its finished runs of the
    ledger's generation, training and evaluation seconds at the end, their shares, and the
    number of evaluations."""
    runs = load_runs(paths, metric="eval/pass@1", x="compute")
    steps = runs.steps[runs.steps["status"] == "finished"]
    cols = [c for c in SECONDS if c in steps]
    if not cols:
        return pd.DataFrame()
    last = steps.dropna(subset=cols).groupby("run", sort=False).last()
    last["evaluations"] = steps.dropna(subset=["eval/pass@1"]).groupby("run").size()
    table = last.groupby("label", sort=False)[[*cols, "evaluations"]].mean()
    total = table[cols].sum(axis=1)
    for c in cols:
        table[c.removeprefix("compute/seconds_") + "_share"] = table[c] / total
    table["runs"] = last.groupby("label", sort=False).size()
    return table.reset_index()


def study_budget(table: pd.DataFrame) -> tuple[float, bool]:
    """(the smallest budget from which on the best configuration's gain is not separable
    from 0 at every candidate budget, whether the cap binds: no budget qualified and the
    largest one is returned). "From which on": one not-separable budget between budgets
    where the curve clearly still gains is a noisy gain (a large MDE), not a ceiling."""
    best = table[table["best"]].sort_values("budget")
    flat = (best["verdict"] == "not separable").to_numpy()
    sustained = np.flip(np.logical_and.accumulate(np.flip(flat)))  # flat here and after
    if sustained.any():
        return float(best["budget"].iloc[int(np.argmax(sustained))]), False
    return float(best["budget"].iloc[-1]), True


def plot_budget(table: pd.DataFrame, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for label, t in table.groupby("label", sort=False):
        lo, hi = t["gain"] - t["gain_lo"], t["gain_hi"] - t["gain"]
        ax.errorbar(t["budget"], 100 * t["gain"], yerr=100 * np.vstack([lo, hi]), capsize=2,
                    marker="o", ms=3, label=label)  # fmt: skip
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlabel("budget B (paper units)")
    ax.set_ylabel("pass@1(B) - pass@1(2B/3), points")
    ax.set_title("gain over the last third of the budget (95 % CI)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=120)
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m replay_exp.analysis.studies.budget", description=__doc__
    )
    p.add_argument("sweep_dirs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--start", type=float, default=1050)
    p.add_argument("--step", type=float, default=150)
    p.add_argument("--n-boot", type=int, default=2000)
    args = p.parse_args(argv)
    try:
        table = budget_table(args.sweep_dirs, start=args.start, step=args.step, n_boot=args.n_boot)
    except (FileNotFoundError, ValueError) as e:  # bad input: one line, nothing written
        print(f"budget error: {e}", file=sys.stderr)
        sys.exit(2)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "budget.csv", index=False)
    plot_budget(table, args.out / "budget.png")
    b, binds = study_budget(table)
    best = table[table["best"]].sort_values("budget")
    lines = [
        "# Study budget: the gain over the last third",
        "",
        f"Runs: {', '.join(map(str, args.sweep_dirs))}; seeds per configuration: "
        f"{int(table['seeds'].min())}-{int(table['seeds'].max())}. Gain = pass@1(B) - "
        "pass@1(2B/3) of the seed-mean curve (greedy, all held-out problems), 95 % t-interval "
        "over seeds with the problem bootstrap inside; MDE at 80 % power.",
        "",
        f"**Study budget: {b:g} paper units**"
        + (
            " (the cap binds: the best configuration still gains at every budget tried)."
            if binds
            else " (the first budget whose best configuration's gain is not separable from 0)."
        ),  # fmt: skip
        "",
        "| B | best configuration | pass@1(2B/3) | pass@1(B) | gain [95 % CI] | MDE | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for _, r in best.iterrows():
        lines.append(
            f"| {r['budget']:g} | {r['label']} | {r['acc_two_thirds']:.3f} | {r['acc_end']:.3f} "
            f"| {100 * r['gain']:+.1f} [{100 * r['gain_lo']:+.1f}, {100 * r['gain_hi']:+.1f}] "
            f"| {100 * r['gain_mde']:.1f} | {r['verdict']} |"
        )
    lines += ["", "![gain over the last third](budget.png)", ""]
    split = time_split(args.sweep_dirs)
    if len(split):
        split.to_csv(args.out / "time_split.csv", index=False)
        lines += [
            "## Where a run's seconds go",
            "",
            "Mean over finished runs of the ledger's seconds (`compute/seconds_*`, at the end).",
            "",
            "| configuration | runs | generation s | training s | evaluation s (evals) "
            "| shares gen / train / eval |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for _, r in split.iterrows():
            lines.append(
                f"| {r['label']} | {int(r['runs'])} | {r['compute/seconds_gen']:.0f} | "
                f"{r['compute/seconds_train']:.0f} | {r['compute/seconds_eval']:.0f} "
                f"({r['evaluations']:.0f}) | {r['gen_share']:.0%} / {r['train_share']:.0%} / "
                f"{r['eval_share']:.0%} |"
            )
        lines.append("")
    (args.out / "summary.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
