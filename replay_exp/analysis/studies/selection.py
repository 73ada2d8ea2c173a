"""Stage 1 of a two-stage study: pick each arm's configuration on selection seeds, and say
whether the learning-rate grid brackets it.

An **arm** is what a study compares (on-policy, FIFO at reuse y); within an arm the tuned
keys (``--tune``, default buffer capacity and learning rate) span its configurations;
``--arm-keys`` splits arms further by config keys (a study of corrections: ``--arm-keys
algo.name algo.mask algo.proximal algo.tis_level``, one arm per loss and mask). For
each configuration the score is the mean over the selection seeds (``--seeds``) of the final
value of the metric (the last evaluation, at the budget), or with ``--score peak`` of its best
evaluation. Each arm's best configuration is the
one with the highest score; ties within ``--tie`` go to the larger learning rate. For every
(arm, other tuned keys) the best learning rate is **bracketed** when it is strictly inside the
grid tried; an edge means the grid must be widened before stage 2 (the sweep headers say by
a factor of 2).

``python -m replay_exp.analysis.studies.selection runs/budget_tiny runs/finding1_stage1_tiny --seeds
0 1 --out analysis/results/finding1_stage1_tiny`` writes ``selection.csv`` (every
configuration's score), ``brackets.csv`` and ``summary.md``.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from replay_exp.analysis.loader import load_runs

LR = "algo.lr"


def arm_name(row: pd.Series, arm_keys: Sequence[str] = ()) -> str:
    """on-policy, or '<buffer> y=<reuse>'; then ``leaf=value`` for each of ``arm_keys`` that
    is set (e.g. ``fifo y=8, name=cispo, mask=icepop`` with ``algo.name algo.mask``)."""
    if row.get("buffer.name") == "on_policy":
        base = "on-policy"
    else:
        base = f"{row.get('buffer.name')} y={float(row.get('derived.reuse_ratio')):g}"
    extra = [f"{k.split('.')[-1]}={row.get(k)}" for k in arm_keys if _is_set(row.get(k))]
    return ", ".join([base, *extra])


def _is_set(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and v != "none"


def scores(
    runs: pd.DataFrame,
    seeds: list[int],
    tune: list[str],
    score: str = "final",
    arm_keys: Sequence[str] = (),
) -> pd.DataFrame:
    """One row per (arm, tuned values): the mean over the selection seeds of each run's
    ``score`` (``final``: the last evaluation; ``peak``: the best one), how many of them
    finished, and their values (``per_seed``). ``arm_keys``: config keys whose values split
    arms further (:func:`arm_name`), e.g. the loss and its mask in a study of corrections."""
    done = runs[(runs["status"] == "finished") & runs["seed"].isin(seeds)].copy()
    done["arm"] = done.apply(arm_name, axis=1, arm_keys=arm_keys)
    for key in tune:
        if key not in done:
            done[key] = float("nan")
    keys = ["arm", *tune]
    grouped = done.groupby(keys, dropna=False)
    table = grouped[score].agg(["mean", "count"]).reset_index()
    table["per_seed"] = grouped[score].apply(lambda v: " ".join(f"{x:.4f}" for x in v)).values
    return table.rename(columns={"mean": "score", "count": "seeds_done"})


def pick(t: pd.DataFrame, tie: float = 1e-3) -> pd.Series:
    """The row of highest score; within ``tie`` of it, the one with the larger learning rate."""
    top = t[t["score"] >= t["score"].max() - tie]
    return top.sort_values(LR, ascending=False).iloc[0]


def best_per_arm(table: pd.DataFrame, tie: float = 1e-3) -> pd.DataFrame:
    """Each arm's selected configuration (:func:`pick`)."""
    rows = [pick(t, tie) for _, t in table.groupby("arm", sort=False)]
    return pd.DataFrame(rows).reset_index(drop=True)


def brackets(table: pd.DataFrame, tune: list[str], tie: float = 1e-3) -> pd.DataFrame:
    """For every (arm, tuned keys but lr): the grid of lr tried, the best, and whether it is
    strictly inside the grid."""
    others = ["arm", *[k for k in tune if k != LR]]
    rows = []
    for key, t in table.groupby(others, dropna=False, sort=False):
        lrs = sorted(t[LR].unique())
        chosen = pick(t, tie)
        best = float(chosen[LR])
        rows.append({
            **dict(zip(others, key if isinstance(key, tuple) else (key,), strict=True)),
            "lrs": " ".join(f"{v:g}" for v in lrs), "best_lr": best,
            "best_score": float(chosen["score"]),  # the picked lr's (a tie may pick below max)
            "bracketed": len(lrs) >= 3 and lrs[0] < best < lrs[-1],
            "widen_to": "" if lrs[0] < best < lrs[-1] else f"{best / 2:g}" if best == lrs[0]
            else f"{best * 2:g}",
        })  # fmt: skip
    return pd.DataFrame(rows)


def markdown(frame: pd.DataFrame) -> str:
    """A pipe table (floats to 4 significant digits)."""

    def cell(v) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(False)]
    return "\n".join([head, rule, *body])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m replay_exp.analysis.studies.selection", description=__doc__
    )
    p.add_argument("sweep_dirs", nargs="+", type=Path)
    p.add_argument("--seeds", type=int, nargs="+", required=True)
    p.add_argument("--tune", nargs="+", default=["buffer.capacity", LR])
    p.add_argument(
        "--arm-keys",
        nargs="+",
        default=[],
        help="config keys that split arms further (e.g. algo.name algo.mask algo.proximal)",
    )
    p.add_argument("--metric", default="eval/pass@1")
    p.add_argument(
        "--score",
        choices=["final", "peak"],
        default="final",
        help="what a run scores: its last evaluation or its best one",
    )
    p.add_argument("--tie", type=float, default=1e-3)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        runs = load_runs(args.sweep_dirs, metric=args.metric, x="compute").runs
    except (FileNotFoundError, ValueError) as e:  # bad input: one line, nothing written
        print(f"selection error: {e}", file=sys.stderr)
        sys.exit(2)
    table = scores(runs, args.seeds, args.tune, args.score, args.arm_keys)
    best, br = best_per_arm(table, args.tie), brackets(table, args.tune, args.tie)
    best = best.sort_values("score", ascending=False, kind="stable")  # the ranking of arms
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "selection.csv", index=False)
    br.to_csv(args.out / "brackets.csv", index=False)
    lines = [
        "# Stage 1: selection",
        "",
        f"Runs: {', '.join(map(str, args.sweep_dirs))}; selection seeds "
        f"{' '.join(map(str, args.seeds))}; score = mean {args.score} `{args.metric}` over them "
        f"(ties within {args.tie:g}: the larger lr). Unfinished runs are left out "
        f"({int((runs['status'] != 'finished').sum())} of {len(runs)}).",
        "",
        "## Each arm's selected configuration (best first)",
        "",
        markdown(best) if len(best) else "(none finished)",
        "",
        "## Is each best learning rate inside its grid?",
        "",
        markdown(br) if len(br) else "(none)",
        "",
        "## Every configuration",
        "",
        markdown(table) if len(table) else "(none)",
        "",
    ]
    (args.out / "summary.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
