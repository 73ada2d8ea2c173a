"""What a design cost to find, beside what it costs to run (issue 44, part 5): for each arm of a
verdict, the compute of the runs that chose it (its tuning) and of its verdict runs, read from
each run's ``summary.json`` (the ledger's ``compute.paper_units``: 1 = one on-policy step, so a
run at the study budget costs that budget whatever its design, and ``compute.seconds``, this
machine's seconds of generation, training and evaluation).

A fixed replay design is found by a sweep on selection seeds; a controller that starts from the
on-policy arm's settings needs that arm's tuning plus the runs that chose its policy. Name the
sweeps of each arm's tuning and of its verdict; a sweep may count for several arms (the
on-policy lr grid chose the controller's start too):

    python -m replay_exp.analysis.studies.tuning_cost \\
        --arm on-policy --tuning analysis/runs/budget_tiny \\
            --verdict analysis/runs/controller_verdict_onpolicy_tiny \\
        --arm controller --tuning analysis/runs/budget_tiny analysis/runs/controller_select_tiny \\
            --verdict analysis/runs/controller_verdict_tiny \\
        --out analysis/results/controller_verdict_tiny/tuning_cost

writes ``tuning_cost.csv`` and ``summary.md``: per arm the runs and paper units of its tuning and
of its verdict, the total, and the total in verdict runs (tuning + verdict over the mean verdict
run: how many runs of the final design the whole search was worth). An unfinished run (no
``summary.json``) counts with what its last logged row's ledger had spent, and the summary
says how many there were.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import pandas as pd

from replay_exp.analysis.loader import find_run_dirs
from replay_exp.runlog import read_metrics


def spent(dirs: list[Path]) -> dict[str, float]:
    """Runs, finished runs, paper units and seconds of every run under ``dirs`` (each run
    counted once, however many of ``dirs`` hold it)."""
    runs = {run.resolve() for _, run in find_run_dirs(dirs)}
    units = seconds = 0.0
    finished = 0
    for run in sorted(runs):
        if (run / "summary.json").is_file():
            summary = json.loads((run / "summary.json").read_text())
            compute = summary["compute"]
            finished += summary.get("status") == "finished"
        else:  # killed or still running: the ledger of its last logged row
            last = [r for r in read_metrics(run / "metrics.jsonl") if "compute/paper_units" in r]
            compute = {k.split("/", 1)[1]: v for k, v in (last[-1] if last else {}).items()
                       if k.startswith("compute/")}  # fmt: skip
        units += float(compute.get("paper_units") or 0.0)
        seconds += float(compute.get("seconds") or 0.0)
    return {"runs": len(runs), "finished": finished, "units": units, "seconds": seconds}


def tuning_cost(arms: dict[str, tuple[list[Path], list[Path]]]) -> pd.DataFrame:
    """One row per arm (label -> (tuning dirs, verdict dirs)): the runs and paper units of its
    tuning and of its verdict, the total, and the total in mean verdict runs."""
    rows = []
    for label, (tuning, verdict) in arms.items():
        t, v = spent(tuning), spent(verdict)
        per_run = v["units"] / v["runs"] if v["runs"] else float("nan")
        rows.append({
            "arm": label,
            "tuning_runs": t["runs"],
            "tuning_units": t["units"],
            "verdict_runs": v["runs"],
            "verdict_units": v["units"],
            "total_units": t["units"] + v["units"],
            "total_in_verdict_runs": (t["units"] + v["units"]) / per_run,
            "tuning_hours": t["seconds"] / 3600,
            "unfinished": t["runs"] - t["finished"] + v["runs"] - v["finished"],
        })  # fmt: skip
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame, arms: dict[str, tuple[list[Path], list[Path]]]) -> str:
    lines = [
        "# Compute to find each design, beside the compute to run it",
        "",
        "Paper units (1 = one on-policy step) from each run's ledger (`summary.json`); "
        "tuning hours: this machine's seconds of generation, training and evaluation, summed "
        "over the tuning runs (one thread each). Total in verdict runs: the tuning and the "
        "verdict over the arm's mean verdict run.",
        "",
        "| arm | tuning runs | tuning units | verdict runs | verdict units | total units | "
        "total in verdict runs | tuning hours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in table.itertuples():
        lines.append(
            f"| {r.arm} | {r.tuning_runs} | {r.tuning_units:,.0f} | {r.verdict_runs} | "
            f"{r.verdict_units:,.0f} | {r.total_units:,.0f} | {r.total_in_verdict_runs:.1f} | "
            f"{r.tuning_hours:.1f} |"
        )
    lines += ["", "Sweeps counted:", ""]
    for label, (tuning, verdict) in arms.items():
        names = ", ".join(f"`{Path(d).name}`" for d in tuning) or "none"
        lines.append(f"- {label}: tuning {names}; verdict "
                     + ", ".join(f"`{Path(d).name}`" for d in verdict))  # fmt: skip
    if table["unfinished"].any():
        lines += ["", "Unfinished runs counted with what they spent: "
                  + ", ".join(f"{r.arm} {r.unfinished}" for r in table.itertuples()
                              if r.unfinished)]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m replay_exp.analysis.studies.tuning_cost",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--arm", action="append", required=True, help="an arm's label")
    p.add_argument(
        "--tuning",
        action="append",
        nargs="*",
        type=Path,
        default=None,
        help="the sweeps that chose it (one --tuning per --arm, in order)",
    )
    p.add_argument("--verdict", action="append", nargs="+", type=Path, default=None,
                   help="its verdict sweeps (one --verdict per --arm, in order)")  # fmt: skip
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    tuning, verdict = args.tuning or [], args.verdict or []
    if not len(args.arm) == len(tuning) == len(verdict):
        p.error(f"one --tuning and one --verdict per --arm: {len(args.arm)} --arm, "
                f"{len(tuning)} --tuning, {len(verdict)} --verdict")  # fmt: skip
    if len(set(args.arm)) < len(args.arm):
        p.error(f"--arm labels repeat: {args.arm}")
    arms = {a: (t, v) for a, t, v in zip(args.arm, tuning, verdict, strict=True)}
    try:
        table = tuning_cost(arms)
    except (FileNotFoundError, KeyError) as e:
        p.error(f"cannot read a run's compute: {e}")
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "tuning_cost.csv", index=False)
    args_given = sys.argv[1:] if argv is None else argv
    command = shlex.join(["python", "-m", "replay_exp.analysis.studies.tuning_cost", *args_given])
    text = markdown(table, arms) + f"\nCommand: `{command}`\n"
    (args.out / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
