"""The theory's figures and command line (the math is :mod:`replay_exp.theory.bound`).

    replay-exp-theory --mu 6.84 --alpha 0.1 --rho 0.1 --batch-size 64 [--group-size 16]
                      [--gpus 8] [--plot DIR] [--run RUN_DIR]

(or ``python -m replay_exp.theory.cli ...``) prints the recommended buffer and schedule;
``--plot`` writes x*(mu), y*(mu) and K(x) with their CSVs (:func:`plot_theory`, also used by
``replay-exp-report``).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from replay_exp.theory.bound import (
    K,
    _check_mu_rho,
    closed_form_optimum,
    estimate_mu_from_run,
    recommend,
)

# Default mu axis of :func:`plot_theory`.
MU_GRID = np.logspace(-0.5, 1.5, 60)


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------


def _write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def plot_theory(
    out_dir: str | Path,
    mu: float = 6.84,
    alphas: Sequence[float] = (0.1, 0.2, 0.3),
    rhos: Sequence[float] = (0.05, 0.1, 0.3),
    mu_grid: Sequence[float] | np.ndarray = MU_GRID,
) -> list[Path]:
    """Figures of the closed-form optimum, one line per (alpha, rho) of ``alphas x rhos``.

    * ``theory_xy_vs_mu.png``: x*(mu) and y*(mu) over ``mu_grid`` (log-log), with the
      on-policy boundary y = 1 dotted and the given ``mu`` dashed; data in
      ``theory_xy_vs_mu.csv`` (alpha, rho, mu, x_star, y_star, on_policy).
    * ``theory_K.png``: K(x)/K(1) against x (log x) at the given ``mu``, a marker at x*; data
      in ``theory_K.csv`` (alpha, rho, mu, x, K_rel).

    Returns the written paths (PNGs then CSVs). Points with no interior optimum (alpha >= 1/2)
    are written as 0 in the CSV and left out of the log plots.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    _check_mu_rho(mu, 0.0)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    mu_grid = np.asarray(mu_grid, dtype=float)
    colors = [f"C{i}" for i in range(10)]
    styles = ["-", "--", "-.", ":"]

    def style(i_a: int, i_r: int) -> dict[str, Any]:
        return {"color": colors[i_a % 10], "linestyle": styles[i_r % 4]}

    # x*(mu), y*(mu).
    xy_rows: list[list[Any]] = []
    fig = Figure(figsize=(11, 4.5))
    FigureCanvasAgg(fig)
    ax_x, ax_y = fig.subplots(1, 2)
    for (i_a, a), (i_r, r) in itertools.product(enumerate(alphas), enumerate(rhos)):
        opt = np.array([closed_form_optimum(float(m), a, r) for m in mu_grid])
        for m, (xs, ys) in zip(mu_grid, opt, strict=True):
            xy_rows.append([a, r, m, xs, ys, int(ys <= 1)])
        xs, ys = np.where(opt > 0, opt, np.nan).T
        label = f"alpha={a:g}, rho={r:g}"
        ax_x.plot(mu_grid, xs, label=label, **style(i_a, i_r))
        ax_y.plot(mu_grid, ys, label=label, **style(i_a, i_r))
    ax_y.axhline(1.0, color="k", linestyle=":", linewidth=1, label="y = 1 (on-policy boundary)")
    for ax, name in ((ax_x, "x* = N/R (staleness horizon)"), (ax_y, "y* = B/R (reuse ratio)")):
        ax.axvline(mu, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("mu (rollout generation cost / forward-backward cost)")
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
    ax_x.set_title("optimal staleness horizon")
    ax_y.set_title("optimal reuse ratio")
    ax_y.legend(fontsize=7)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.12, top=0.92, wspace=0.25)
    png_xy = out / "theory_xy_vs_mu.png"
    fig.savefig(png_xy, dpi=110)

    # K(x) / K(1) at the given mu.
    x_grid = np.logspace(-2, 3, 251)
    k_rows: list[list[Any]] = []
    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for (i_a, a), (i_r, r) in itertools.product(enumerate(alphas), enumerate(rhos)):
        k_rel = K(x_grid, mu, a, r) / K(1.0, mu, a, r)
        k_rows.extend([a, r, mu, xv, kv] for xv, kv in zip(x_grid, k_rel, strict=True))
        ax.plot(x_grid, k_rel, label=f"alpha={a:g}, rho={r:g}", **style(i_a, i_r))
        xs, _ = closed_form_optimum(mu, a, r)
        if xs > 0:
            ax.plot([xs], [K(xs, mu, a, r) / K(1.0, mu, a, r)], "o", color=colors[i_a % 10])
    ax.axhline(1.0, color="k", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("x = N/R (staleness horizon)")
    ax.set_ylabel("K(x) / K(1)  (sqrt of J*(x) relative to x = 1)")
    ax.set_title(f"K(x) at mu = {mu:g}; markers at x*")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.12, top=0.92)
    png_k = out / "theory_K.png"
    fig.savefig(png_k, dpi=110)

    csv_xy, csv_k = out / "theory_xy_vs_mu.csv", out / "theory_K.csv"
    _write_csv(csv_xy, ["alpha", "rho", "mu", "x_star", "y_star", "on_policy"], xy_rows)
    _write_csv(csv_k, ["alpha", "rho", "mu", "x", "K_rel"], k_rows)
    return [png_xy, png_k, csv_xy, csv_k]


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line on stderr, exit 2
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def main(argv: Sequence[str] | None = None) -> None:
    """``replay-exp-theory --mu 6.84 --alpha 0.1 --rho 0.1 --batch-size 64
    [--group-size 16] [--gpus 8] [--plot DIR] [--run RUN_DIR]``.

    Prints the recommendation. ``--run`` estimates mu from a finished run (both the paper's
    estimate and the timed one are printed) and uses it when ``--mu`` is not given (the
    paper's estimate if the run was async, else the timed one). ``--plot`` writes the figures
    and prints their paths. Errors print one line on stderr and exit with status 2.
    """
    p = _Parser(prog="replay-exp-theory", description=__doc__.split("\n\n")[0])
    p.add_argument("--mu", type=float, help="generation / training cost ratio")
    p.add_argument("--alpha", type=float, required=True, help="staleness exponent, > 0")
    p.add_argument("--rho", type=float, required=True, help="reuse correlation in [0, 1]")
    p.add_argument("--batch-size", type=int, required=True, help="B, rollouts per batch")
    p.add_argument("--group-size", type=int, default=16, help="G, rollouts per prompt")
    p.add_argument("--gpus", type=int, default=8, help="GPUs of the async node")
    p.add_argument("--plot", metavar="DIR", help="write the theory figures and CSVs here")
    p.add_argument("--run", metavar="RUN_DIR", help="estimate mu from this run directory")
    args = p.parse_args(argv)
    try:
        mu = args.mu
        if args.run is not None:
            est = estimate_mu_from_run(args.run)
            fmt = lambda v: "n/a" if v is None else f"{v:.4g}"  # noqa: E731
            print(
                f"mu from {args.run}: paper (K_train/T)/(K_inf/W) = {fmt(est['mu_paper'])}, "
                f"timed = {fmt(est['mu_timed'])}, configured = {fmt(est['mu_config'])}"
            )
            if mu is None:
                mu = est["mu_paper"] if est["mu_paper"] is not None else est["mu_timed"]
                if mu is None:
                    raise ValueError(f"{args.run} gives no mu estimate; pass --mu")
                print(f"using mu = {mu:.4g}")
        if mu is None:
            raise ValueError("give --mu or --run")
        rec = recommend(mu, args.alpha, args.rho, args.batch_size, args.group_size, args.gpus)
        print(rec.describe())
        if args.plot is not None:
            for path in plot_theory(args.plot, mu=mu):
                print(f"wrote {path}")
    except ValueError as e:
        p.error(" ".join(str(e).split()))


if __name__ == "__main__":
    main()
