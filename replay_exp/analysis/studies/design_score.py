"""Score the design model's prediction against a bracket's measured finals (issue 44, part 3):
the rule committed in the sweep's header before its runs, applied whatever the answer.

For every cell (N, R) of the sweeps given, the mean over ``--seeds`` of the final value of the
metric (the last evaluation, at the budget) is its measured score; the design model
(``replay_exp.theory.design.ranking``, at the point alpha, with rho from ``--noise``) gives
each cell its J / J_on-policy (lower predicts better) under both models, recomputed here from
the same inputs as the header's prediction. ``--score-as 262144:131072`` scores a capacity as
another (the header's convention for "never evict"). The score of each model:

- **Spearman's rank correlation** between its predicted order (−J) and the measured means
  (+1: the order exactly right, −1: reversed); with 9 cells |rho| > 0.68 is significant at 5 %
  (two-sided), which two selection seeds make a weak test;
- **its top pick's paired final difference to the measured best** (the sweeps' rule: the
  highest mean; a tie within ``--tie``, 0.1 pt, goes to the smaller N, then the smaller reuse
  ratio y = B / R, i.e. the larger R), read from a report run with ``--baseline <the best's
  label>`` (``--stats`` its stats.csv): "within" when the 95 % interval contains 0. Without
  ``--stats`` the command to make it is printed. With ``--where`` the labels are those of a
  report on the matching runs alone.

``python -m replay_exp.analysis.studies.design_score analysis/runs/finding1_bracket_tiny
--seeds 0 1 --score-as 262144:131072 --where algo.lr=3e-05 --out
analysis/results/finding1_bracket_tiny/design_score`` writes ``cells.csv`` and ``summary.md``
(the ``--where`` leaves out the winner's later lr runs: cells are grouped by (N, R) only).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
from scipy.stats import spearmanr

from replay_exp.analysis.labels import config_label
from replay_exp.analysis.loader import load_runs
from replay_exp.analysis.studies.selection import markdown
from replay_exp.theory.design import MODELS, relative_noise
from replay_exp.theory.exact import rho_interpolated

NOISE = Path("analysis/results/theory_vs_experiment/rho_long/noise.json")


def cell_scores(
    runs: pd.DataFrame, seeds: list[int], where: dict[str, str], keys: list[str] | None = None
) -> pd.DataFrame:
    """One row per (N, R) of the runs matching ``where`` (config key -> value, as text): label,
    mean final over ``seeds``, seeds finished. With ``keys`` (the loaded sweeps' varying config
    keys) the labels are rebuilt from the keys that still vary among the matching runs, as a
    report on those runs alone labels them (``--where compute.mu=17.6`` drops the mu
    from "N=32768, y=4, mu=17.6")."""
    done = runs[(runs["status"] == "finished") & runs["seed"].isin(seeds)]
    for key, value in where.items():
        if key not in done:
            raise SystemExit(f"--where {key}={value}: no config key {key} in these runs")
        done = done[done[key].astype(str) == value]
    if keys is not None:
        still = [k for k in keys if k in done and done[k].astype(str).nunique() > 1]
        labels = [config_label(row, still) for row in done.to_dict("records")]
        done = done.assign(label=labels)
    cols = ["derived.capacity", "derived.rollouts_per_step"]
    g = done.groupby(cols)
    out = g.agg(label=("label", "first"), final=("final", "mean"), seeds_done=("seed", "count"))
    out = out.reset_index().rename(columns={cols[0]: "N", cols[1]: "R"})
    out[["N", "R"]] = out[["N", "R"]].astype(int)
    return out


def predict(cells: pd.DataFrame, B: int, mu: float, rho, alpha: float,
            score_as: dict[int, int]) -> pd.DataFrame:  # fmt: skip
    """``cells`` with each model's J / J_on-policy and its predicted rank (1: best)."""
    out = cells.copy()
    for m in MODELS:
        out[m] = [
            relative_noise(score_as.get(N, N), R, B, mu, rho, alpha, (m,))[m]
            for N, R in zip(out["N"], out["R"], strict=True)
        ]
        out[f"{m}_rank"] = out[m].rank(method="min").astype(int)
    out["measured_rank"] = out["final"].rank(ascending=False, method="min").astype(int)
    return out


def measured_best(table: pd.DataFrame, tie: float = 1e-3) -> pd.Series:
    """The sweeps' selection rule: the cell of highest mean final; a tie (within ``tie``, 0.1
    pt by default) goes to the smaller N, then the smaller reuse ratio (the larger R)."""
    top = table[table["final"] >= table["final"].max() - tie]
    return top.sort_values(["N", "R"], ascending=[True, False]).iloc[0]


def score(table: pd.DataFrame, stats: pd.DataFrame | None, tie: float = 1e-3) -> list[dict]:
    """Per model: Spearman's rho (with its p-value), its top pick, and whether the pick's paired
    final difference to the measured best (:func:`measured_best`; ``stats``: a report against
    that best) contains 0."""
    best = measured_best(table, tie)
    rows = []
    for m in MODELS:
        rho, p = spearmanr(-table[m], table["final"])
        pick = table.loc[table[m].idxmin()]
        within = "the best itself" if pick["label"] == best["label"] else "no --stats"
        if stats is not None and pick["label"] != best["label"]:
            match = stats[stats["label"] == pick["label"]]
            if match.empty:
                raise SystemExit(
                    f"--stats: no row labelled {pick['label']!r} (its labels: "
                    f"{', '.join(map(repr, stats['label']))}); make the report on the same runs"
                )
            r = match.iloc[0]
            lo, hi = float(r["final_lo"]), float(r["final_hi"])
            within = (f"{'within' if lo <= 0 <= hi else 'outside'}: pick - best "
                      f"{float(r['final']):+.4f} [{lo:+.4f}, {hi:+.4f}]")  # fmt: skip
        rows.append({"model": m, "spearman": float(rho), "p": float(p),
                     "pick": pick["label"], "pick_final": float(pick["final"]),
                     "best": best["label"], "best_final": float(best["final"]),
                     "pick_vs_best": within})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m replay_exp.analysis.studies.design_score", description=__doc__
    )
    p.add_argument("sweep_dirs", nargs="+", type=Path)
    p.add_argument("--seeds", type=int, nargs="+", required=True)
    p.add_argument("--noise", type=Path, default=NOISE, help="rho(delta): a theory.measure output")
    p.add_argument("--mu", type=float, default=6.84)
    p.add_argument("--alpha", type=float, default=0.032)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--score-as", nargs="*", default=[], metavar="N:AS")
    p.add_argument("--stats", type=Path, help="stats.csv of a report against the measured best")
    p.add_argument(
        "--where",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="only the runs with these config values (e.g. algo.lr=3e-05)",
    )
    p.add_argument(
        "--tie",
        type=float,
        default=1e-3,
        help="the best: the highest mean; within this of it, the smaller N, then the smaller y",
    )
    p.add_argument("--metric", default="eval/pass@1")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    noise = json.loads(a.noise.read_text())
    rho = rho_interpolated(noise["deltas"], noise["pooled"]["rho"])
    score_as = {int(k): int(v) for k, v in (s.split(":") for s in a.score_as)}
    where = dict(w.split("=", 1) for w in a.where)
    loaded = load_runs(a.sweep_dirs, metric=a.metric)
    cells = cell_scores(loaded.runs, a.seeds, where, loaded.config_keys)
    table = predict(cells, a.batch, a.mu, rho, a.alpha, score_as)
    stats = pd.read_csv(a.stats) if a.stats else None
    scored = score(table, stats, a.tie)
    a.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(a.out / "cells.csv", index=False)
    best = scored[0]["best"]
    lines = [
        "# The design model's prediction, scored",
        "",
        f"Sweeps: {', '.join(str(d) for d in a.sweep_dirs)}"
        f"{''.join(f' (runs with {k}={v})' for k, v in where.items())}; "
        f"seeds {a.seeds}; mu {a.mu}, "
        f"alpha {a.alpha}, rho from {a.noise}; scored as {score_as or 'given'}; the best: "
        f"the highest mean, a tie within {a.tie:g} to the smaller N, then the smaller y.",
        "",
        markdown(
            table[
                [
                    "label",
                    "N",
                    "R",
                    "seeds_done",
                    "final",
                    "measured_rank",
                    "exact",
                    "exact_rank",
                    "paper_gap",
                    "paper_gap_rank",
                ]
            ]
        ),  # fmt: skip
        "",
        markdown(pd.DataFrame(scored)),
    ]
    if stats is None:
        lines += ["", "The pick-vs-best intervals need a report against the measured best:",
                  f"`replay-exp-report {' '.join(map(str, a.sweep_dirs))} --baseline "
                  f"'{best}' --out {a.out / 'vs_best'}`, then `--stats "
                  f"{a.out / 'vs_best' / 'stats.csv'}`."]  # fmt: skip
    (a.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
