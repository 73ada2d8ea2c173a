"""Curves over seeds, compute to reach a target, and Pareto envelopes: pure pandas / numpy.

Conventions (the tests pin them):

- **x-axes** (``X_AXES``): ``steps`` (policy updates), ``rollouts`` (unique generated
  rollouts), ``compute`` (the paper's units: one on-policy step = 1), ``flops`` (analytic) and
  ``wall`` (measured seconds of generation + training + evaluation), ``node`` (a GPU node's
  time in units of one GPU training one sample: measured by ``runtime=distributed``, modelled
  for in-process runs by :mod:`replay_exp.analysis.studies.node_time` when the runs are loaded with
  ``x="node"``). All are cumulative columns of metrics.jsonl.
- **Interpolation** (:func:`interpolate`, also used by the bootstrap in
  :mod:`replay_exp.analysis.stats`): a run's curve is its evaluation points joined by straight
  lines in x; it is never extrapolated: before its first or after its last point it is
  undefined (NaN).
- **Aggregation**: on a common x-grid (:func:`make_grid`: every run's evaluation points among
  others), each configuration's curve is the **mean over its seeds**: the point estimate of
  every statistic in the tables (peak, final, drawdown, compute to target), the one the
  bootstrap intervals of :mod:`replay_exp.analysis.stats` are centred on. The median and the
  inter-quartile range (25th / 75th percentiles, numpy's linear interpolation between order
  statistics) are kept as the spread of the seeds, for the figures. A grid point belongs to a
  configuration's curve only where every seed has a value (``min_seeds`` relaxes this), so a
  seed that stopped early never biases the curve toward the survivors.
- **Drawdown** (:func:`drawdown`): a curve's largest drop below its own running peak.
- **Compute to target**: the smallest x at which a curve reaches ``target``: the first
  evaluation point at or above it, linearly interpolated with the point before it (the crossing
  of the segment); the first point if it already is at or above the target; ``inf`` if the curve
  never gets there (reported as "not reached").
- **Pareto envelope** over configurations: at each x, the best seed-mean accuracy any
  configuration has reached with at most x (the running maximum of each curve, then the
  maximum over configurations), and which configuration holds it.
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
    "node": ("runtime/node_time", "node time (one GPU's trained-sample times; in process: model)"),
}


def x_column(x: str) -> str:
    """The metrics.jsonl column behind the x-axis name ``x`` (or ``x`` itself if it is one)."""
    return X_AXES[x][0] if x in X_AXES else x


def x_label(x: str) -> str:
    return X_AXES[x][1] if x in X_AXES else x


def interpolate(x: np.ndarray, y: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The one value-at-x interpolator of the analysis (curves here, the paired bootstrap in
    :mod:`replay_exp.analysis.stats`): the piecewise-linear curve through (x[k], y[k]) at every
    point of ``grid``, NaN outside [x[0], x[-1]] (never extrapolated).

    ``y`` is [K] or [K, ...]: every column is interpolated with the same weights. Points where
    x or (any column of) y is NaN are dropped; x must be non-decreasing. Between x[i] <= g <
    x[i+1]: y[i] + (g - x[i]) / (x[i+1] - x[i]) * (y[i+1] - y[i]); at a repeated x the last of
    its points holds; at g = x[-1], y[-1]."""
    x, y, grid = (np.asarray(a, dtype=float) for a in (x, y, grid))
    bad = np.isnan(x) | np.isnan(y).reshape(len(y), -1).any(axis=1)
    x, y = x[~bad], y[~bad]
    out_shape = grid.shape + y.shape[1:]
    if len(x) == 0:
        return np.full(out_shape, np.nan)
    i = np.clip(np.searchsorted(x, grid, side="right") - 1, 0, len(x) - 1)
    j = np.minimum(i + 1, len(x) - 1)
    span = x[j] - x[i]
    t = np.where(span > 0, (grid - x[i]) / np.where(span > 0, span, 1.0), 0.0)
    t = t.reshape(t.shape + (1,) * (y.ndim - 1))
    out = y[i] * (1 - t) + y[j] * t
    out[(grid < x[0]) | (grid > x[-1])] = np.nan
    return out


def make_grid(steps: pd.DataFrame, x: str, n: int = 60, y: str | None = None) -> np.ndarray:
    """``n`` evenly spaced points from 0 to the largest x any run reached, plus every run's own
    evaluation x (of ``y``, if given; else every row's x). With every knot of every run's
    piecewise-linear curve on it, a seed-mean curve on this grid is exact: its peak, its
    drawdown and where it crosses a target are those of the mean of the runs' curves, not of
    a sampling of it."""
    col = x_column(x)
    rows = steps.dropna(subset=[y]) if y else steps
    xs = rows[col].dropna().to_numpy(dtype=float)
    if len(xs) == 0:
        return np.zeros(0)
    return np.unique(np.concatenate([np.linspace(0.0, xs.max(), n), xs]))


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


def _seed_matrices(per_run: pd.DataFrame, min_seeds: int | None = None):
    """Per configuration of :func:`run_curves` rows: (config, label, x [K], values [K, S],
    seeds with a value [K], S), keeping the grid points where at least ``min_seeds`` seeds
    (default: all of them) have a value."""
    for (config, label), g in per_run.groupby(["config", "label"], sort=False):
        n_runs = g["run"].nunique()
        need = n_runs if min_seeds is None else min(min_seeds, n_runs)
        table = g.pivot_table(index="x", columns="run", values="value", dropna=False)
        vals = table.to_numpy(dtype=float)
        have = (~np.isnan(vals)).sum(axis=1)
        keep = have >= need
        if keep.any():
            yield (
                config,
                label,
                table.index.to_numpy(dtype=float)[keep],
                vals[keep],
                have[keep],
                n_runs,
            )


def aggregate(
    steps: pd.DataFrame,
    x: str = "compute",
    y: str = "eval/pass@1",
    grid: np.ndarray | None = None,
    min_seeds: int | None = None,
) -> pd.DataFrame:
    """Each configuration's ``y`` vs ``x`` over its seeds on a common grid: the seed mean (the
    point estimate every table of the report uses) and, as the spread of the seeds around it,
    their median and IQR.

    Returns columns config, label, x, mean, median, q25, q75, n_seeds (seeds with a value at x)
    and n_runs (seeds of the configuration); rows only where at least ``min_seeds`` seeds
    (default: all of them) have a value."""
    rows = []
    for config, label, xs, vals, have, n_runs in _seed_matrices(
        run_curves(steps, x, y, grid), min_seeds
    ):
        with np.errstate(all="ignore"):
            q25, med, q75 = np.nanpercentile(vals, [25, 50, 75], axis=1)
            mean = np.nanmean(vals, axis=1)
        rows.append(
            pd.DataFrame(
                {
                    "config": config,
                    "label": label,
                    "x": xs,
                    "mean": mean,
                    "median": med,
                    "q25": q25,
                    "q75": q75,
                    "n_seeds": have,
                    "n_runs": n_runs,
                }
            )
        )
    cols = ["config", "label", "x", "mean", "median", "q25", "q75", "n_seeds", "n_runs"]
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=cols)


def compute_to_target(x: Sequence[float], y: Sequence[float], target: float) -> float:
    """The smallest x at which the curve through (x, y) reaches ``target`` (see the module
    docstring for the rules); ``inf`` if it never does."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = ~(np.isnan(x) | np.isnan(y))
    x, y = x[ok], y[ok]
    if len(y) == 0:
        return float("inf")
    return float(compute_to_target_columns(x, y[:, None], np.array([target]))[0])


def compute_to_target_columns(x: np.ndarray, m: np.ndarray, target: np.ndarray) -> np.ndarray:
    """:func:`compute_to_target` of every column of ``m`` [K, R] (NaN-free curves on ``x``) at
    its own target [R], at once: the first point at or above the target, interpolated linearly
    from the point before (the first point itself if it is there already); ``inf`` if none."""
    hit = m >= target
    i = hit.argmax(axis=0)
    cols = np.arange(m.shape[1])
    prev = np.maximum(i - 1, 0)
    y0, y1 = m[prev, cols], m[i, cols]
    with np.errstate(divide="ignore", invalid="ignore"):
        at = x[prev] + (target - y0) * (x[i] - x[prev]) / (y1 - y0)
    at = np.where(i == 0, x[0], at)
    return np.where(hit.any(axis=0), at, np.inf)


def drawdown(values: np.ndarray, axis: int = -1) -> np.ndarray | float:
    """The one drawdown of the analysis: the largest drop of a curve below its own running
    peak, ``max_k (max_{k' <= k} v[k'] - v[k])`` along ``axis`` (0 for a curve that never
    falls). A 1-D curve gives a float (NaN if empty); an array of curves gives an array, e.g.
    [S, K, R] along axis 1 -> [S, R] (the bootstrap's seeds x replicates)."""
    v = np.asarray(values, dtype=float)
    if v.ndim == 1:
        return float((np.maximum.accumulate(v) - v).max()) if len(v) else float("nan")
    return (np.maximum.accumulate(v, axis=axis) - v).max(axis=axis)


def pareto_envelope(curves: pd.DataFrame, by: str = "label", value: str = "mean") -> pd.DataFrame:
    """The upper envelope of aggregated ``curves`` (from :func:`aggregate`): for each x, the
    best ``value`` (the seed mean) any configuration reached with at most x, and the ``by``
    value of the configuration holding it. Columns: x, best, <by>."""
    if curves.empty:
        return pd.DataFrame(columns=["x", "best", by])
    wide = curves.pivot_table(index="x", columns=by, values=value, dropna=False).sort_index()
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


def target_table(
    steps: pd.DataFrame,
    x: str = "compute",
    y: str = "eval/pass@1",
    target: float | None = None,
    frac: float = 0.98,
    baseline: str | None = None,
) -> tuple[pd.DataFrame, float]:
    """Per configuration, the statistics of its seed-mean curve (:func:`aggregate`'s ``mean``,
    on the grid points every seed reached; the same statistics, on the same kind of curve,
    that :mod:`replay_exp.analysis.stats` bootstraps): ``peak`` and ``final`` (its largest and
    last value), ``drawdown`` (the mean over seeds of each seed's :func:`drawdown` on that
    range), ``x_to_target`` (:func:`compute_to_target` of the seed-mean curve; ``target``
    defaults to ``frac`` x the best peak over all configurations), ``seeds_reaching_target``
    (how many seeds' own curves reach it), and, against the configuration labelled
    ``baseline``, ``saving_vs_baseline`` = 1 - x_to_target / x_to_target of the baseline.
    Returns the table and the target used."""
    per_config = list(_seed_matrices(run_curves(steps, x, y)))
    if target is None:
        target = frac * max((float(vals.mean(axis=1).max()) for *_, vals, _, _ in per_config),
                            default=float("nan"))  # fmt: skip
    rows = []
    for config, label, xs, vals, _, n_runs in per_config:
        mean = vals.mean(axis=1)
        rows.append(
            {
                "config": config,
                "label": label,
                "seeds": n_runs,
                "peak": float(mean.max()),
                "final": float(mean[-1]),
                "drawdown": float(drawdown(vals, axis=0).mean()),
                "x_to_target": compute_to_target(xs, mean, target),
                "seeds_reaching_target": int(
                    sum(np.isfinite(compute_to_target(xs, v, target)) for v in vals.T)
                ),  # fmt: skip
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
