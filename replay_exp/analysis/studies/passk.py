"""pass@k up to large k against the baseline, from the final policies' post-hoc evaluation.

    python -m replay_exp.eval.final SWEEP_DIR/*/          # writes each run's final_passk.json
    python -m replay_exp.analysis.studies.passk SWEEP_DIR [...] [--baseline LABEL] --out DIR

For every configuration and every k of the evaluation, the final pass@k minus the baseline's
with its 95 % interval, minimal detectable effect and verdict: ``stats.compare`` on one point
(the final policy), per-problem unbiased pass@k from the counts of correct samples, problems
resampled inside the seed-level t-interval and seeds paired when both arms ran the same ones,
exactly as the report's pass@1 table. The baseline is the on-policy configuration (the best one
if several, by mean final pass@1) unless ``--baseline`` names another. Writes ``passk.csv``,
``passk.md`` and ``passk_gain.png`` (the gain vs k, with its CSV) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from replay_exp.analysis.loader import Runs, load_runs
from replay_exp.analysis.plots import plot_passk_gain
from replay_exp.analysis.report import ReportError, is_baseline, pick_label
from replay_exp.analysis.stats import Arm, compare
from replay_exp.eval.estimators import decode_details, pass_at_k_per_problem

FILE = "final_passk.json"  # replay_exp.eval.final.OUT_NAME (that module imports torch)


def read_final(runs: Runs) -> dict[str, dict]:
    """Each run's ``final_passk.json`` by run name; all must exist and share their settings
    (the seed aside)."""
    out, missing = {}, []
    for _, r in runs.runs.iterrows():
        path = Path(r["run_dir"]) / FILE
        if not path.is_file():
            missing.append(str(r["run_dir"]))
            continue
        out[r["run"]] = json.loads(path.read_text())
    if missing:
        raise ReportError(
            f"{len(missing)} run(s) without {FILE} (run python -m replay_exp.eval.final on "
            f"them first): {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"
        )
    shared = {json.dumps({k: v for k, v in f["settings"].items() if k != "seed"}, sort_keys=True)
              for f in out.values()}  # fmt: skip
    if len(shared) > 1:
        raise ReportError(f"the runs' {FILE} differ in their settings: {' vs '.join(shared)}")
    return out


def per_problem(final: dict, k: int) -> np.ndarray:
    """Unbiased per-problem pass@k of one run's final evaluation."""
    return pass_at_k_per_problem(final["n_samples"], decode_details(final)["n_correct"], k)


def passk_table(
    runs: Runs, finals: dict[str, dict], baseline: str, n_boot: int = 2000, seed: int = 0
) -> pd.DataFrame:
    """One row per (configuration, k): the mean final pass@k over seeds and, for the others,
    the gain over ``baseline`` with its interval (``stats.compare``, method ``t``)."""
    ks = next(iter(finals.values()))["settings"]["pass_k"]
    labels = list(dict.fromkeys(runs.runs["label"]))
    rows = []
    for k in ks:
        arms = {}
        for label in labels:
            table = runs.runs[runs.runs["label"] == label]
            values = np.stack([per_problem(finals[r], k) for r in table["run"]])[:, None, :]
            arms[label] = Arm(label, list(table["seed"]), values, per_problem=True)
        for label, arm in arms.items():
            row = {"label": label, "k": k, "seeds": len(arm.seeds),
                   "mean": float(arm.values.mean()), "baseline": label == baseline}  # fmt: skip
            if label != baseline:
                st = compare(np.zeros(1), arm, arms[baseline], n_boot=n_boot, seed=seed)
                row.update({
                    "gain": st["final"], "lo": st["final_lo"], "hi": st["final_hi"],
                    "mde": st["final_mde"], "verdict": st["final_verdict"],
                    "per_seed": st.get("final_per_seed", ""), "problems": st["problems"],
                })  # fmt: skip
            rows.append(row)
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame, finals: dict[str, dict], baseline: str) -> str:
    s = next(iter(finals.values()))["settings"]
    pct = lambda v: f"{100 * v:+.1f}"  # noqa: E731
    lines = [
        "# pass@k of the final policies against the baseline",
        "",
        f"Baseline: {baseline}. `python -m replay_exp.eval.final`: {s['n_samples']} samples "
        f"per problem at temperature {s['sample_temperature']} (top_p {s['sample_top_p']}) on "
        f"the first {s['sampled_problems'] or 'all'} held-out problems; pass@k unbiased per "
        "problem. Gain in points, 95 % seed-level t-interval with the problem bootstrap inside "
        "(paired seeds where they match); MDE: the gain a 5 % test detects with 80 % power.",
        "",
        "| configuration | k | seeds | pass@k | gain [95 % CI] | MDE | verdict | per seed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for _, r in table.iterrows():
        if r["baseline"]:
            cells = "(baseline) | | | |"
        else:
            cells = (f"{pct(r['gain'])} [{pct(r['lo'])}, {pct(r['hi'])}] | "
                     f"{100 * r['mde']:.1f} | {r['verdict']} | {r['per_seed']} |")  # fmt: skip
        lines.append(f"| {r['label']} | {r['k']} | {r['seeds']} | {r['mean']:.4f} | {cells}")
    return "\n".join(lines) + "\n"


def choose_baseline(runs: Runs, finals: dict[str, dict], name: str | None) -> str:
    """``--baseline`` (a label or a unique part of one), else the on-policy configuration with
    the best mean final greedy pass@1."""
    if name is not None:
        return pick_label(runs, name)
    base = runs.runs[is_baseline(runs.runs)]
    if len(base) == 0:
        raise ReportError("no on-policy run among them: name the reference with --baseline")
    p1 = base.assign(p1=[finals[r]["metrics"]["pass@1"] for r in base["run"]])
    return str(p1.groupby("label")["p1"].mean().idxmax())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m replay_exp.analysis.studies.passk", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("sweep_dirs", nargs="+", type=Path)
    p.add_argument("--baseline", default=None)
    p.add_argument("--n-boot", type=int, default=2000)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        runs = load_runs(args.sweep_dirs)
        finals = read_final(runs)
        base = choose_baseline(runs, finals, args.baseline)
    except (ReportError, FileNotFoundError) as e:
        raise SystemExit(f"passk: {e}") from None
    table = passk_table(runs, finals, base, args.n_boot)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "passk.csv", index=False)
    (args.out / "passk.md").write_text(markdown(table, finals, base))
    wide = pd.DataFrame([
        {"label": lab, **{f"eval/pass@{k}_sampled": float(per_problem(finals[r], k).mean())
                          for k in next(iter(finals.values()))["settings"]["pass_k"]}}
        for r, lab in zip(runs.runs["run"], runs.runs["label"], strict=True)
    ])  # fmt: skip
    plot_passk_gain(wide, base, args.out / "passk_gain")
    print((args.out / "passk.md").read_text())


if __name__ == "__main__":
    main()
