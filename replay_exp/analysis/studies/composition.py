"""What was trained on vs what was generated: the ``data/*`` composition keys of metrics.jsonl.

Every run logs, on each row, the cumulative composition of the rollouts generated and of the
samples trained (each use of a replayed rollout counted): ``data/<kind>_<stat>`` for kind in
generated / trained and stat in count / reward / length / pass_rate (pass rate: of the
rollout's prompt group at generation, i.e. how easy the problem is), and on evaluation rows the
means over the interval since the previous evaluation, ``data/interval/<kind>_<stat>``. A
stale-data policy (``buffer.max_staleness``, a token mask) changes what is trained relative to
what was generated; trained minus generated shows which data it starves (e.g. hard or long
problems: a positive pass-rate difference, a negative length difference).

Same conventions as :mod:`replay_exp.analysis.curves`: per configuration, the seed mean is the
point estimate (the IQR over seeds is the spread drawn), on the configuration's evaluation
points. Runs without the keys (logged before them) are left out of this analysis only.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from replay_exp.analysis.curves import aggregate, make_grid

KINDS = ("generated", "trained")
STATS = {
    "reward": "reward",
    "length": "response length (tokens)",
    "pass_rate": "pass rate of the prompt group (easiness)",
}


def diff_column(stat: str) -> str:
    """The derived column: trained minus generated ``stat`` over an evaluation interval."""
    return f"data/interval/diff_{stat}"


def _numeric(steps: pd.DataFrame, col: str) -> pd.Series:
    if col not in steps:
        return pd.Series(np.nan, index=steps.index)
    return pd.to_numeric(steps[col], errors="coerce")


def composition_runs(steps: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(runs with the composition keys, runs without): a run has them when it logged a
    cumulative ``data/trained_count`` and an interval ``data/interval/trained_count``."""
    if steps.empty:
        return [], []
    has = (
        _numeric(steps, "data/trained_count").notna()
        .groupby(steps["run"], sort=False).any()
        & _numeric(steps, "data/interval/trained_count").notna()
        .groupby(steps["run"], sort=False).any()
    )  # fmt: skip
    return [r for r, h in has.items() if h], [r for r, h in has.items() if not h]


def composition_curves(steps: pd.DataFrame, x: str = "compute") -> pd.DataFrame:
    """Per configuration and stat, the trained-minus-generated difference over each evaluation
    interval vs ``x`` (:func:`aggregate` of ``data/interval/trained_<stat> -
    data/interval/generated_<stat>``: seed mean, median and IQR), on the configuration's own
    evaluation points. Only the runs of :func:`composition_runs`. Columns: stat, then those
    of :func:`aggregate`."""
    keep, _ = composition_runs(steps)
    steps = steps[steps["run"].isin(keep)]
    parts = []
    for stat in STATS:
        col = diff_column(stat)
        diff = _numeric(steps, f"data/interval/trained_{stat}") - _numeric(
            steps, f"data/interval/generated_{stat}"
        )
        with_diff = steps.assign(**{col: diff})
        for _, g in with_diff.groupby("label", sort=False):
            # n = 0: no extra grid points, the configuration's evaluation points only (an
            # interval mean belongs to the evaluation that closes the interval).
            curves = aggregate(g, x, col, grid=make_grid(g, x, n=0, y=col))
            if len(curves):
                parts.append(curves.assign(stat=stat))
    cols = ["stat", "config", "label", "x", "mean", "median", "q25", "q75", "n_seeds", "n_runs"]
    return pd.concat(parts, ignore_index=True)[cols] if parts else pd.DataFrame(columns=cols)


def composition_final(steps: pd.DataFrame) -> pd.DataFrame:
    """Per configuration and stat (count included), the final cumulative composition: each
    run's last logged ``data/generated_<stat>`` and ``data/trained_<stat>``, mean over its
    seeds, and their difference (trained - generated; the mean of the seeds' differences).
    Only the runs of :func:`composition_runs`. Columns: config, label, seeds, stat, generated,
    trained, diff."""
    keep, _ = composition_runs(steps)
    steps = steps[steps["run"].isin(keep)]
    cols = ["config", "label", "seeds", "stat", "generated", "trained", "diff"]
    if steps.empty:
        return pd.DataFrame(columns=cols)
    rows_with = steps[_numeric(steps, "data/trained_count").notna()]
    last = rows_with.groupby("run", sort=False).tail(1)  # each run's last composition row
    rows = []
    for (config, label), g in last.groupby(["config", "label"], sort=False):
        for stat in ("count", *STATS):
            gen = _numeric(g, f"data/generated_{stat}").to_numpy(dtype=float)
            tr = _numeric(g, f"data/trained_{stat}").to_numpy(dtype=float)
            rows.append(
                {
                    "config": config,
                    "label": label,
                    "seeds": len(g),
                    "stat": stat,
                    "generated": _mean(gen),
                    "trained": _mean(tr),
                    "diff": _mean(tr - gen),
                }
            )
    return pd.DataFrame(rows, columns=cols)


def _mean(v: np.ndarray) -> float:
    """The mean over seeds, NaN (no warning) when no seed has a value."""
    v = v[~np.isnan(v)]
    return float(v.mean()) if len(v) else float("nan")
