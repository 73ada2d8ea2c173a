"""The two variance models against measured accuracies (issue 24, part 6).

    python -m replay_exp.analysis.studies.variance_models SWEEP_DIR [...] --noise NOISE_JSON \
        --out DIR
        [--recommended LABEL]

For every configuration of the runs (FIFO replay with its x = N / R and y = B / R, and the
on-policy baseline) two predictions of gradient noise per unit of compute relative to the
baseline, from the measured rho(delta) of ``NOISE_JSON`` (``replay_exp.theory.measure``,
interpolated, constant beyond its last delta; sigma flat, the measured alpha being ~0):

- **exact**: ``replay_exp.theory.exact.j_exact`` / ``j_on_policy``, the long-run variance of
  FIFO + uniform sampling with rho at every pair of uses' own distance;
- **paper**: the paper's bound J(x, y) = (1 + y / mu)(1 / y + 1 / x + rho) over its J(1, 1)
  at rho(1), with rho read at the configuration's mean reuse gap
  (``theory.exact.mean_reuse_gap``) and at delta = 1 (what ``recommend()`` was fed):
  ``theory.exact.relative_j``, the numbers of ``python -m replay_exp.theory.exact``.

Below 1: replay predicted to beat the baseline. Against them, the measured difference of final
pass@1 to the baseline at the last shared compute (``stats.compare``: t-interval over paired
seeds with the problem bootstrap inside, MDE at 80 % power). A model's sign is right for a
configuration when the measured verdict is ``better`` and the model says < 1, or ``worse`` and
> 1; a ``not separable`` verdict confirms neither sign. Orders: Spearman's rank correlation of
each model's -J with the measured finals over all configurations (baseline included).

``--recommended LABEL`` (a label or a unique part of one): the configuration a recommendation
picked; its difference to the empirical best (the highest seed-mean final) with its interval,
and whether it "lands inside the interval of the empirical optimum" (not separable from it).
Writes ``variance_models.md``, ``variance_models.csv`` and ``variance_models.png``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from replay_exp.analysis.loader import load_runs
from replay_exp.analysis.plots import save_png
from replay_exp.analysis.report import ReportError, baseline_label, is_baseline, pick_label
from replay_exp.analysis.stats import build_arms, compare
from replay_exp.theory.exact import relative_j, rho_interpolated

METRIC = "eval/pass@1"


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties): the Pearson correlation of the
    ranks. NaN with fewer than 3 points or a constant input."""
    a, b = pd.Series(a, dtype=float), pd.Series(b, dtype=float)
    if len(a) < 3 or a.nunique() < 2 or b.nunique() < 2:
        return float("nan")
    return float(np.corrcoef(a.rank(), b.rank())[0, 1])


def sign_right(verdict: str, j: float) -> str:
    """Does a model's side of 1 agree with the measured verdict? yes / no / untested."""
    if verdict == "better":
        return "yes" if j < 1 else "no"
    if verdict == "worse":
        return "yes" if j > 1 else "no"
    return "untested"


def check_models(runs, noise: dict[str, Any], recommended: str | None = None,
                n_boot: int = 2000) -> dict[str, Any]:  # fmt: skip
    """Everything the module docstring lists (``table``: one row per configuration)."""
    rho = rho_interpolated(noise["deltas"], noise["pooled"]["rho"])
    base = baseline_label(runs, METRIC, "compute")
    if base is None:
        raise ReportError("no on-policy run among them: the models are relative to it")
    labels = list(dict.fromkeys(runs.runs["label"]))
    grid, arms = build_arms(runs, labels, base, METRIC, "compute")
    mu = float(runs.runs["compute.mu"].dropna().iloc[0])
    rows = []
    for _, r in runs.runs.drop_duplicates("label").iterrows():
        label = r["label"]
        row: dict[str, Any] = {"label": label, "final": float(arms[label].values[:, -1].mean()),
                               "seeds": len(arms[label].seeds)}  # fmt: skip
        if label == base:
            row.update({"x": 1.0, "y": 1.0, "exact": 1.0, "paper_rho_gap": 1.0,
                        "paper_rho1": 1.0, "verdict": "(baseline)"})  # fmt: skip
        else:
            if r.get("buffer.name") != "fifo":
                raise ReportError(f"{label}: the models are for FIFO replay (buffer.name=fifo)")
            R = int(round(float(r["derived.rollouts_per_step"])))
            x, y = float(r["derived.staleness_horizon"]), float(r["derived.reuse_ratio"])
            st = compare(grid, arms[label], arms[base], n_boot=n_boot)
            row.update({"x": x, "y": y, **relative_j(x, y, R, mu, rho),
                        "diff": st["final"], "lo": st["final_lo"], "hi": st["final_hi"],
                        "mde": st["final_mde"], "verdict": st["final_verdict"]})  # fmt: skip
            for model in ("exact", "paper_rho_gap", "paper_rho1"):
                row[f"{model}_sign"] = sign_right(row["verdict"], row[model])
        rows.append(row)
    table = pd.DataFrame(rows)
    ranks = {m: spearman(-table[m].to_numpy(), table["final"].to_numpy())
             for m in ("exact", "paper_rho_gap", "paper_rho1")}  # fmt: skip
    best = str(table.loc[table["final"].idxmax(), "label"])
    pick = None
    if recommended is not None:
        rec = pick_label(runs, recommended, "--recommended")
        pick = {"label": rec, "best": best}
        if rec != best:
            st = compare(grid, arms[rec], arms[best], n_boot=n_boot)
            keys = (("diff", ""), ("lo", "_lo"), ("hi", "_hi"), ("mde", "_mde"))
            pick.update({k: st[f"final{suffix}"] for k, suffix in keys})
            pick["inside"] = st["final_verdict"] == "not separable"
        else:
            pick.update({"diff": 0.0, "lo": 0.0, "hi": 0.0, "mde": 0.0, "inside": True})
    return {
        "table": table, "spearman": ranks, "baseline": base, "best": best, "pick": pick,
        "mu": mu, "x_matched": float(grid[-1]), "noise_deltas": noise["deltas"],
        "noise_rho": noise["pooled"]["rho"], "noise_command": noise.get("command", ""),
    }  # fmt: skip


def markdown(res: dict[str, Any]) -> str:
    t = res["table"]
    pts = lambda v: f"{100 * v:+.1f}"  # noqa: E731
    rhos = ", ".join(f"{d}: {r:.3f}" for d, r in zip(res["noise_deltas"], res["noise_rho"],
                                                       strict=True))  # fmt: skip
    lines = [
        "# The variance models against the measured accuracies",
        "",
        f"Baseline: {res['baseline']}; mu = {res['mu']:g}; rho(delta) measured at {rhos} "
        f"(`{res['noise_command']}`), interpolated, constant beyond. J / J_on-policy below 1: "
        f"replay predicted better. Measured: final greedy pass@1 at {res['x_matched']:g} paper "
        "units minus the baseline's, points, 95 % t-interval over paired seeds with the problem "
        "bootstrap inside; MDE at 80 % power.",
        "",
        "| configuration | x | y | seeds | final | measured diff [95 % CI] | MDE | verdict | "
        "exact J | paper J (rho at gap) | paper J (rho(1)) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for _, r in t.iterrows():
        if r["verdict"] == "(baseline)":
            diff, mde = "(baseline)", ""
        else:
            diff = f"{pts(r['diff'])} [{pts(r['lo'])}, {pts(r['hi'])}]"
            mde = f"{100 * r['mde']:.1f}"
        lines.append(
            f"| {r['label']} | {r['x']:.4g} | {r['y']:.3g} | {r['seeds']} | {r['final']:.4f} | "
            f"{diff} | {mde} | {r['verdict']} | {r['exact']:.3f} | {r['paper_rho_gap']:.3f} | "
            f"{r['paper_rho1']:.3f} |"
        )
    lines += ["", "Signs (does the model's side of 1 match the measured verdict?) and orders:", ""]
    names = {
        "exact": "exact",
        "paper_rho_gap": "paper (rho at gap)",
        "paper_rho1": "paper (rho(1))",
    }
    others = t[t["verdict"] != "(baseline)"]
    for m, name in names.items():
        counts = others[f"{m}_sign"].value_counts()
        lines.append(
            f"- {name}: sign right {counts.get('yes', 0)}, wrong {counts.get('no', 0)}, untested "
            f"(not separable) {counts.get('untested', 0)}; Spearman(-J, final) over "
            f"{len(t)} configurations = {res['spearman'][m]:.2f}"
        )
    p = res["pick"]
    if p is not None:
        where = "inside" if p["inside"] else "outside"
        lines += [
            "",
            f"Recommended configuration **{p['label']}** against the empirical best "
            f"**{p['best']}**: {pts(p['diff'])} [{pts(p['lo'])}, {pts(p['hi'])}] "
            f"(MDE {100 * p['mde']:.1f}): {where} the interval of the optimum.",
        ]
    return "\n".join(lines) + "\n"


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = res["table"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    others = t[t["verdict"] != "(baseline)"]
    err = [100 * (others["diff"] - others["lo"]), 100 * (others["hi"] - others["diff"])]
    for m, marker, name in (("exact", "o", "exact"), ("paper_rho_gap", "s", "paper, rho at gap"),
                            ("paper_rho1", "^", "paper, rho(1)")):  # fmt: skip
        ax.errorbar(others[m], 100 * others["diff"], yerr=err, fmt=marker, capsize=3, label=name)
    for _, r in others.iterrows():
        ax.annotate(r["label"], (r["exact"], 100 * r["diff"]), textcoords="offset points",
                    xytext=(4, 4), fontsize=7)  # fmt: skip
    ax.axhline(0, color="black", lw=0.8)
    ax.axvline(1, color="black", lw=0.8, ls="--")
    ax.set(xlabel="predicted J / J_on-policy (left of 1: replay predicted better)",
           ylabel="measured final pass@1 - on-policy (points)",
           title="the variance models against the measured accuracies")  # fmt: skip
    ax.text(0.02, 0.97, "right sign: top-left or bottom-right", transform=ax.transAxes,
            va="top", fontsize=8)  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    save_png(fig, path, dpi=130)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m replay_exp.analysis.studies.variance_models",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("sweep_dirs", nargs="+", type=Path)
    p.add_argument("--noise", type=Path, required=True, help="noise.json of measure_noise")
    p.add_argument("--recommended", default=None, help="label of a recommended configuration")
    p.add_argument("--n-boot", type=int, default=2000)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        runs = load_runs(args.sweep_dirs, metric=METRIC, x="compute")
        if not is_baseline(runs.runs).any():
            raise ReportError("no on-policy run among them: the models are relative to it")
        res = check_models(runs, json.loads(args.noise.read_text()), args.recommended, args.n_boot)
    except (ReportError, FileNotFoundError) as e:
        raise SystemExit(f"variance_models: {e}") from None
    args.out.mkdir(parents=True, exist_ok=True)
    res["table"].to_csv(args.out / "variance_models.csv", index=False)
    (args.out / "variance_models.md").write_text(markdown(res))
    plot(res, args.out / "variance_models.png")
    print(markdown(res))


if __name__ == "__main__":
    main()
