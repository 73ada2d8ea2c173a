"""Curves over seeds, compute to reach a target, and Pareto envelopes: pure pandas / numpy.

Conventions (the tests pin them):

- **x-axes** (``X_AXES``): ``steps`` (policy updates), ``rollouts`` (unique generated
  rollouts), ``compute`` (the paper's units: one on-policy step = 1), ``flops`` (analytic) and
  ``wall`` (measured seconds of generation + training + evaluation). All are cumulative columns
  of metrics.jsonl.
- **Interpolation**: a run's curve is its evaluation points joined by straight lines in x; it is
  never extrapolated: before its first or after its last point it is undefined (NaN).
- **Aggregation**: on a common x-grid, each configuration's curve is the median and the
  inter-quartile range (25th / 75th percentiles, linear interpolation between order statistics,
  numpy's default) over its seeds. A grid point belongs to a configuration's curve only where
  every seed has a value (``min_seeds`` relaxes this), so a seed that stopped early never
  biases the median toward the survivors.
- **Compute to target**: the smallest x at which a curve reaches ``target``: the first
  evaluation point at or above it, linearly interpolated with the point before it (the crossing
  of the segment); the first point if it already is at or above the target; ``inf`` if the curve
  never gets there (reported as "not reached").
- **Pareto envelope** over configurations: at each x, the best accuracy any configuration has
  reached with at most x (the running maximum of each curve, then the maximum over
  configurations), and which configuration holds it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

X_AXES = {
    "steps": ("step", "policy updates"),
    "rollouts": ("compute/rollouts", "generated rollouts"),
    "compute": ("compute/paper_units", "compute (paper units: 1 = one on-policy step)"),
    "flops": ("compute/flops", "compute (analytic FLOPs)"),
    "wall": ("compute/seconds", "wall-clock (s): generation + training + evaluation"),
}


def x_column(x: str) -> str:
    """The metrics.jsonl column behind the x-axis name ``x`` (or ``x`` itself if it is one)."""
    return X_AXES[x][0] if x in X_AXES else x


def x_label(x: str) -> str:
    return X_AXES[x][1] if x in X_AXES else x


def interpolate(x: np.ndarray, y: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The piecewise-linear curve through (x, y) evaluated on ``grid``; NaN outside
    [x.min(), x.max()]. Points with NaN y are ignored; x must be non-decreasing."""
    x, y, grid = (np.asarray(a, dtype=float) for a in (x, y, grid))
    ok = ~(np.isnan(x) | np.isnan(y))
    x, y = x[ok], y[ok]
    if len(x) == 0:
        return np.full(grid.shape, np.nan)
    out = np.interp(grid, x, y)
    out[(grid < x[0]) | (grid > x[-1])] = np.nan
    return out


def make_grid(steps: pd.DataFrame, x: str, n: int = 60, y: str | None = None) -> np.ndarray:
    """``n`` evenly spaced points from 0 to the largest x any run reached (at an evaluation
    point of ``y``, if given), plus every run's own last x so that final values are on it."""
    col = x_column(x)
    rows = steps.dropna(subset=[y]) if y else steps
    ends = rows.groupby("run")[col].max().to_numpy(dtype=float)
    if len(ends) == 0:
        return np.zeros(0)
    return np.unique(np.concatenate([np.linspace(0.0, ends.max(), n), ends]))


def run_curves(steps: pd.DataFrame, x: str, y: str, grid: np.ndarray | None = None) -> pd.DataFrame:
    """Every run's ``y`` interpolated on ``grid``: columns run, config, label, seed, x, value."""
    col = x_column(x)
    if grid is None:
        grid = make_grid(steps, x, y=y)
    parts = []
    for run, g in steps.dropna(subset=[y]).groupby("run", sort=False):
        g = g.sort_values(col, kind="stable")
        v = interpolate(g[col].to_numpy(), g[y].to_numpy(), grid)
        first = g.iloc[0]
        parts.append(
            pd.DataFrame(
                {
                    "run": run,
                    "config": first["config"],
                    "label": first["label"],
                    "seed": first["seed"],
                    "x": grid,
                    "value": v,
                }
            )
        )
    cols = ["run", "config", "label", "seed", "x", "value"]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


def aggregate(
    steps: pd.DataFrame,
    x: str = "compute",
    y: str = "eval/pass@1",
    grid: np.ndarray | None = None,
    min_seeds: int | None = None,
) -> pd.DataFrame:
    """Median and IQR over seeds of each configuration's ``y`` vs ``x`` on a common grid.

    Returns columns config, label, x, median, q25, q75, n_seeds (seeds with a value at x) and
    n_runs (seeds of the configuration); rows only where at least ``min_seeds`` seeds (default:
    all of them) have a value."""
    per_run = run_curves(steps, x, y, grid)
    rows = []
    for (config, label), g in per_run.groupby(["config", "label"], sort=False):
        n_runs = g["run"].nunique()
        need = n_runs if min_seeds is None else min(min_seeds, n_runs)
        table = g.pivot_table(index="x", columns="run", values="value", dropna=False)
        vals = table.to_numpy()
        have = (~np.isnan(vals)).sum(axis=1)
        keep = have >= need
        if not keep.any():
            continue
        with np.errstate(all="ignore"):
            q25, med, q75 = np.nanpercentile(vals[keep], [25, 50, 75], axis=1)
        rows.append(
            pd.DataFrame(
                {
                    "config": config,
                    "label": label,
                    "x": table.index.to_numpy()[keep],
                    "median": med,
                    "q25": q25,
                    "q75": q75,
                    "n_seeds": have[keep],
                    "n_runs": n_runs,
                }
            )
        )
    cols = ["config", "label", "x", "median", "q25", "q75", "n_seeds", "n_runs"]
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=cols)


def compute_to_target(x: Sequence[float], y: Sequence[float], target: float) -> float:
    """The smallest x at which the curve through (x, y) reaches ``target`` (see the module
    docstring for the rules); ``inf`` if it never does."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = ~(np.isnan(x) | np.isnan(y))
    x, y = x[ok], y[ok]
    hit = np.flatnonzero(y >= target)
    if len(hit) == 0:
        return float("inf")
    i = hit[0]
    if i == 0:
        return float(x[0])
    x0, x1, y0, y1 = x[i - 1], x[i], y[i - 1], y[i]
    return float(x0 + (target - y0) * (x1 - x0) / (y1 - y0))


def pareto_envelope(curves: pd.DataFrame, by: str = "label") -> pd.DataFrame:
    """The upper envelope of aggregated ``curves`` (from :func:`aggregate`): for each x, the
    best median any configuration reached with at most x, and the ``by`` value of the
    configuration holding it. Columns: x, best, <by>."""
    if curves.empty:
        return pd.DataFrame(columns=["x", "best", by])
    wide = curves.pivot_table(index="x", columns=by, values="median", dropna=False).sort_index()
    # Running best of each curve; past a curve's end it keeps its best so far.
    running = wide.cummax().ffill().dropna(how="all")
    return pd.DataFrame(
        {
            "x": running.index.to_numpy(),
            "best": running.max(axis=1).to_numpy(),
            by: running.idxmax(axis=1).to_numpy(),
        }
    )


def pareto_front(points: pd.DataFrame, x: str, y: str) -> pd.DataFrame:
    """The non-dominated rows of ``points``: no other row has x <= and y >= with one strict.
    Sorted by x; lower x and higher y are better."""
    pts = points.dropna(subset=[x, y]).sort_values([x, y], ascending=[True, False])
    keep, best = [], -np.inf
    for i, v in zip(pts.index, pts[y], strict=True):
        if v > best:
            keep.append(i)
            best = v
    return pts.loc[keep].reset_index(drop=True)


def _quartiles(values: Sequence[float]) -> np.ndarray:
    """25th, 50th, 75th percentiles where inf (never reached) counts as the worst value: a
    quantile between two inf values is inf, not NaN."""
    if len(values) == 0:
        return np.full(3, np.nan)
    with np.errstate(invalid="ignore"):
        q = np.percentile(np.asarray(values, dtype=float), [25, 50, 75])
    return np.nan_to_num(q, nan=np.inf, posinf=np.inf)


def drawdown(values: np.ndarray) -> float:
    """The largest drop of a curve below its own running peak (0 for a curve that never
    falls): ``max_k (max_{k' <= k} v[k'] - v[k])``."""
    v = np.asarray(values, dtype=float)
    return float((np.maximum.accumulate(v) - v).max()) if len(v) else float("nan")


def target_table(
    steps: pd.DataFrame,
    x: str = "compute",
    y: str = "eval/pass@1",
    target: float | None = None,
    frac: float = 0.98,
    baseline: str | None = None,
) -> tuple[pd.DataFrame, float]:
    """Per configuration: the peak and final value of the median curve, the per-seed peaks,
    finals and drawdowns (:func:`drawdown`; median, IQR), and the x needed to reach ``target``
    (default ``frac`` x the best peak median over all configurations) on the median curve and
    per seed
    (median and IQR over seeds; a seed that never reaches it counts as inf), with the saving
    1 - x / x_baseline relative to the configuration labelled ``baseline``. Returns the table
    and the target used."""
    curves = aggregate(steps, x, y)
    col = x_column(x)
    if target is None:
        target = frac * float(curves.groupby("config")["median"].max().max())
    rows = []
    for (config, label), g in curves.groupby(["config", "label"], sort=False):
        runs = steps[(steps["config"] == config)].dropna(subset=[y])
        per_seed = [
            compute_to_target(r[col].to_numpy(), r[y].to_numpy(), target)
            for _, r in runs.groupby("run", sort=False)
        ]
        finals = runs.groupby("run")[y].last().to_numpy()
        peaks = runs.groupby("run")[y].max().to_numpy()
        drawdowns = np.array([drawdown(r.sort_values(col)[y].to_numpy())
                              for _, r in runs.groupby("run", sort=False)])  # fmt: skip
        q = _quartiles(per_seed)
        rows.append(
            {
                "config": config,
                "label": label,
                "seeds": len(per_seed),
                "peak_median": float(g["median"].max()),
                "final_median": float(g["median"].iloc[-1]),
                "final_q25": float(np.percentile(finals, 25)),
                "final_q75": float(np.percentile(finals, 75)),
                "peak_seed_median": float(np.median(peaks)),
                "peak_q25": float(np.percentile(peaks, 25)),
                "peak_q75": float(np.percentile(peaks, 75)),
                "drawdown_seed_median": float(np.median(drawdowns)),
                "drawdown_q25": float(np.percentile(drawdowns, 25)),
                "drawdown_q75": float(np.percentile(drawdowns, 75)),
                "x_to_target": compute_to_target(g["x"], g["median"], target),
                "x_to_target_seed_median": float(q[1]),
                "x_to_target_seed_q25": float(q[0]),
                "x_to_target_seed_q75": float(q[2]),
            }
        )
    table = pd.DataFrame(rows)
    if baseline is not None and baseline in set(table.get("label", [])):
        base = float(table.loc[table["label"] == baseline, "x_to_target"].iloc[0])
        # -inf: this config never gets there. Undefined (NaN) when the baseline never gets
        # there or is there from its first evaluation (x = 0): no saving is measurable.
        measurable = np.isfinite(base) and base > 0
        table["saving_vs_baseline"] = 1.0 - table["x_to_target"] / base if measurable else np.nan
    return table, float(target)
