"""The theory against the experiment: does ``recommend()`` land among the best configurations?

    python -m replay_exp.analysis.studies.theory_check --noise DIR/noise.json SWEEP_DIR [...] \
        --out DIR

Inputs, all measured:

* ``alpha`` and ``rho(delta)`` with their 95 % intervals from ``noise.json``
  (:mod:`replay_exp.theory.measure`, pooled over its points and seeds);
* ``mu``: as charged by the sweep (``compute.mu``, the paper's 6.84) and as measured on this
  machine (``compute/measured_mu`` of the runs: generation seconds per rollout over training
  seconds per sample; median over runs);
* the sweep's runs (e.g. ``fig4_lr_pareto_tiny``), every configuration at its best learning
  rate (:func:`replay_exp.analysis.report.best_over`), with its horizon ``x = N / R`` and reuse
  ``y = B / R``.

The recommendation is the theory's continuous optimum for the measured values:
:func:`replay_exp.theory.bound.closed_form_optimum` when ``0 < alpha < 1/2``; when ``alpha <= 0``
staleness costs nothing in the theory's model (``sigma_bar^2`` does not grow with ``x``), so
``x* = inf`` and ``y* = sqrt(mu / rho)`` (the limit of ``optimal_reuse``); ``alpha >= 1/2``:
on-policy. ``rho`` is taken at one delta (``--delta``, default the smallest measured: the
highest correlation, the most conservative), and the recommendation is repeated over the ends
of the intervals of ``alpha`` and ``rho`` and over both ``mu``.

The comparison: the tested configuration nearest to the recommendation (in ``log y``, then
``log x``) against the empirically best one (highest seed-mean final accuracy at the budget):
the accuracy it leaves on the table, with a paired bootstrap interval
(:func:`replay_exp.analysis.stats.compare`), and the theory's ``J(x, y) / J(1, 1)`` of every
tested configuration next to its measured accuracy (does the theory rank them right?).
Writes ``theory_check.md``, ``theory_check.csv`` and ``theory_check.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from replay_exp.analysis.loader import load_runs
from replay_exp.analysis.plots import save_png
from replay_exp.analysis.report import baseline_label, best_over
from replay_exp.analysis.stats import build_arms, compare, percentile_interval
from replay_exp.runlog import read_metrics
from replay_exp.theory.bound import closed_form_optimum, objective, optimal_reuse

METRIC = "eval/pass@1"
# noise.json files written before measure_noise recorded its command line
NOISE_COMMAND = "python -m replay_exp.theory.measure (arguments: README.md next to noise.json)"


def optimum(mu: float, alpha: float, rho: float) -> tuple[float, float]:
    """``(x*, y*)`` of the theory for any measured ``alpha`` (module docstring)."""
    if alpha <= 0:
        return math.inf, float(optimal_reuse(math.inf, mu, rho))
    return closed_form_optimum(mu, alpha, rho)


def j_rel(x: float, y: float, mu: float, alpha: float, rho: float) -> float:
    """``J(x, y) / J(1, 1)`` under the power law (1 = on-policy; lower is better)."""
    return float(objective(x, y, mu, rho, alpha=alpha) / objective(1, 1, mu, rho, alpha=alpha))


def nearest(configs: pd.DataFrame, x: float, y: float) -> str:
    """Label of the tested configuration nearest to ``(x, y)``: in log y, then log x."""
    dy = np.abs(np.log(configs["y"] / y))
    dx = np.abs(np.log(configs["x"] / x)) if math.isfinite(x) else -np.log(configs["x"])
    order = np.lexsort((dx.to_numpy(), np.round(dy.to_numpy(), 9)))
    return str(configs["label"].iloc[order[0]])


def measured_mu(run_dirs: list[str]) -> float:
    """Median over runs of the last logged ``compute/measured_mu``."""
    values = []
    for d in run_dirs:
        rows = [r for r in read_metrics(Path(d) / "metrics.jsonl") if "compute/measured_mu" in r]
        if rows:
            values.append(rows[-1]["compute/measured_mu"])
    return float(np.median(values)) if values else math.nan


def check(noise: dict[str, Any], sweep_dirs: list[Path], delta: int | None = None,
          n_boot: int = 2000) -> dict[str, Any]:  # fmt: skip
    """Everything the module docstring lists, as one dict (``configs``: a DataFrame)."""
    pooled = noise["pooled"]
    deltas = noise["deltas"]
    j = deltas.index(delta if delta is not None else min(deltas))
    alpha, (a_lo, a_hi) = pooled["alpha"], pooled["alpha_ci"]
    rho, (r_lo, r_hi) = pooled["rho"][j], pooled["rho_ci"][j]
    rho, r_lo, r_hi = (min(max(v, 1e-6), 1.0) for v in (rho, r_lo, r_hi))

    runs = load_runs(sweep_dirs, metric=METRIC, x="compute")
    if "algo.lr" in runs.config_keys:
        runs = best_over(runs, "algo.lr", METRIC, "compute")
    mu_charged = float(runs.runs["compute.mu"].dropna().iloc[0])
    mu_cpu = measured_mu(runs.runs["run_dir"].tolist())
    table = runs.runs.drop_duplicates("label")
    configs = pd.DataFrame({
        "label": table["label"].to_numpy(),
        "x": table["derived.staleness_horizon"].astype(float).to_numpy(),
        "y": table["derived.reuse_ratio"].astype(float).to_numpy(),
    })  # fmt: skip

    labels = configs["label"].tolist()
    grid, arms = build_arms(runs, labels, baseline_label(runs, METRIC, "compute"), METRIC,
                            "compute")  # fmt: skip
    finals = {lb: float(arms[lb].values[:, -1].mean()) for lb in labels}
    configs["final"] = configs["label"].map(finals)
    best = max(finals, key=finals.get)
    rng = np.random.default_rng(0)
    cis = {}
    for lb in labels:
        v = arms[lb].values[:, -1]  # [S, J]
        s_w = rng.multinomial(v.shape[0], np.full(v.shape[0], 1 / v.shape[0]), n_boot)
        p_w = rng.multinomial(v.shape[1], np.full(v.shape[1], 1 / v.shape[1]), n_boot)
        reps = np.einsum("rs,sj,rj->r", s_w, v, p_w) / (v.shape[0] * v.shape[1])
        cis[lb] = percentile_interval(reps)
    configs["final_lo"] = configs["label"].map(lambda lb: cis[lb][0])
    configs["final_hi"] = configs["label"].map(lambda lb: cis[lb][1])
    configs["J_rel"] = [j_rel(x, y, mu_charged, alpha, rho) for x, y in
                        zip(configs["x"], configs["y"], strict=True)]  # fmt: skip

    x_star, y_star = optimum(mu_charged, alpha, rho)
    rec = nearest(configs, x_star, y_star)
    gap = compare(grid, arms[rec], arms[best], n_boot=n_boot) if rec != best else None
    sensitivity = [
        {"mu": m, "alpha": a, "rho": r, **dict(zip(("x", "y"), optimum(m, a, r), strict=True))}
        for m in (mu_charged, mu_cpu) if math.isfinite(m)
        for a in (a_lo, alpha, a_hi) for r in (r_lo, rho, r_hi)
    ]  # fmt: skip
    return {
        "alpha": alpha, "alpha_ci": (a_lo, a_hi), "rho": rho, "rho_ci": (r_lo, r_hi),
        "delta": deltas[j], "mu_charged": mu_charged, "mu_cpu": mu_cpu,
        "x_star": x_star, "y_star": y_star, "recommended": rec, "best": best,
        "gap": gap, "configs": configs, "sensitivity": pd.DataFrame(sensitivity),
        "seeds": int(runs.runs.groupby("label").size().min()),
        "x_matched": float(grid[-1]),
    }  # fmt: skip


def markdown(res: dict[str, Any]) -> str:
    c = res["configs"].sort_values("y")
    (a_lo, a_hi), (r_lo, r_hi) = res["alpha_ci"], res["rho_ci"]
    x_star = "inf" if not math.isfinite(res["x_star"]) else f"{res['x_star']:.3g}"
    lines = [
        "# The theory against the experiment",
        "",
        f"Measured: alpha = {res['alpha']:.3f} [{a_lo:.3f}, {a_hi:.3f}], rho(delta = "
        f"{res['delta']}) = {res['rho']:.3f} [{r_lo:.3f}, {r_hi:.3f}]; mu charged "
        f"{res['mu_charged']:.3g}, measured on this machine {res['mu_cpu']:.3g}.",
        "",
        f"Recommendation (mu = {res['mu_charged']:.3g}): x* = {x_star}, y* = "
        f"{res['y_star']:.3g}; nearest tested configuration: **{res['recommended']}**. "
        f"Empirical best (seed-mean pass@1 at {res['x_matched']:g} paper units, the last "
        f"evaluation every run reached; each configuration at its best lr, >= {res['seeds']} "
        f"seeds): **{res['best']}**.",
        "",
    ]
    gap = res["gap"]
    if gap is None:
        lines.append("The recommendation's nearest configuration is the empirical best.")
    else:
        lines.append(
            f"Left on the table (recommended minus best, final): {gap['final']:+.3f} "
            f"[{gap['final_lo']:+.3f}, {gap['final_hi']:+.3f}] ({gap['final_verdict']}); peak "
            f"{gap['peak']:+.3f} [{gap['peak_lo']:+.3f}, {gap['peak_hi']:+.3f}]."
        )
    lines += ["", f"| configuration | x = N/R | y = B/R | pass@1 at {res['x_matched']:g} [95 % CI] "
              "| theory J/J_on |",
              "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for _, r in c.iterrows():
        ci = f"[{r['final_lo']:.3f}, {r['final_hi']:.3f}]"
        lines.append(f"| {r['label']} | {r['x']:.3g} | {r['y']:.3g} | {r['final']:.3f} {ci} "
                     f"| {r['J_rel']:.3f} |")  # fmt: skip
    lines += ["", "Sensitivity of (x*, y*) to the interval ends and to mu:", "",
              "| mu | alpha | rho | x* | y* |", "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for _, r in res["sensitivity"].iterrows():
        lines.append(f"| {r['mu']:.3g} | {r['alpha']:.3f} | {r['rho']:.3f} | {r['x']:.3g} | "
                     f"{r['y']:.3g} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = res["configs"].sort_values("y")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ax1.errorbar(c["y"], c["final"], yerr=[c["final"] - c["final_lo"], c["final_hi"] - c["final"]],
                 marker="o", capsize=4, label="measured final pass@1 (best lr)")  # fmt: skip
    for _, r in c.iterrows():
        ax1.annotate(f"x={r['x']:.3g}", (r["y"], r["final"]), textcoords="offset points",
                     xytext=(5, -12), fontsize=8)  # fmt: skip
    ax1.axvline(res["y_star"], ls="--", color="k", label=f"theory y* = {res['y_star']:.2f}")
    ax1.set(xscale="log", xlabel="reuse y = B/R",
            ylabel=f"held-out pass@1 at {res['x_matched']:g} paper units",
            title="measured accuracy vs the recommendation")  # fmt: skip
    ax1.set_xticks(c["y"], [f"{v:g}" for v in c["y"]])
    ax1.minorticks_off()
    twin = ax1.twinx()
    twin.plot(c["y"], c["J_rel"], "s:", color="tab:red", label="theory J / J_on-policy")
    twin.set_ylabel("theory J(x, y) / J(1, 1) (lower is better)", color="tab:red")
    ax1.legend(fontsize=8, loc="lower left")
    twin.legend(fontsize=8, loc="lower right")
    rhos = np.linspace(0.05, 1.0, 200)
    for mu in (res["mu_charged"], res["mu_cpu"]):
        if math.isfinite(mu):
            ax2.plot(rhos, np.sqrt(mu / rhos), label=f"y*(x = inf), mu = {mu:.3g}")
    r_lo, r_hi = res["rho_ci"]
    ax2.axvspan(r_lo, r_hi, alpha=0.2, color="gray", label="measured rho (95 % CI)")
    for y in c["y"]:
        ax2.axhline(y, ls=":", color="gray", lw=0.8)
    ax2.set(yscale="log", xlabel="rho", ylabel="y*", title="optimal reuse vs rho (tested y dotted)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dirs", nargs="+", type=Path)
    ap.add_argument("--noise", type=Path, required=True, help="noise.json of measure_noise")
    ap.add_argument("--delta", type=int, default=None, help="rho at this delta (default: min)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n-boot", type=int, default=2000)
    args = ap.parse_args(argv)
    res = check(json.loads(args.noise.read_text()), args.sweep_dirs, args.delta, args.n_boot)
    args.out.mkdir(parents=True, exist_ok=True)
    res["configs"].to_csv(args.out / "theory_check.csv", index=False)
    argv = argv if argv is not None else sys.argv[1:]
    text = markdown(res) + (
        f"\nRegenerate: `{json.loads(args.noise.read_text()).get('command', NOISE_COMMAND)}`, "
        f"then `python -m replay_exp.analysis.studies.theory_check {' '.join(argv)}`.\n"
    )
    (args.out / "theory_check.md").write_text(text)
    plot(res, args.out / "theory_check.png")
    print(text)


if __name__ == "__main__":
    main()
