"""Curves over seeds, compute to target and Pareto envelopes on hand-computed data."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from replay_exp.analysis import (
    aggregate,
    compute_to_target,
    interpolate,
    pareto_envelope,
    pareto_front,
    target_table,
)


def _steps(curves: dict[tuple[str, int], tuple[list[float], list[float]]]) -> pd.DataFrame:
    """A steps table from {(config, seed): (paper units, pass@1)}."""
    rows = []
    for (config, seed), (xs, ys) in curves.items():
        for x, y in zip(xs, ys, strict=True):
            rows.append({"run": f"{config}/s{seed}", "config": config, "label": config,
                         "seed": seed, "compute/paper_units": x, "eval/pass@1": y})  # fmt: skip
    return pd.DataFrame(rows)


def test_interpolate_is_linear_inside_and_nan_outside():
    # Through (0, 0), (2, 1), (4, 1): 1 -> 0.5, 3 -> 1; 5 is past the end.
    out = interpolate([0, 2, 4], [0, 1, 1], [1, 3, 5, -1])
    assert out[:2].tolist() == [0.5, 1.0] and np.isnan(out[2:]).all()
    # Columns (the bootstrap's per-problem matrices) share the weights: at 1, halfway between
    # rows (0, 10) and (1, 20) -> (0.5, 15); at 4, the last row (1, 40).
    cols = interpolate([0, 2, 4], [[0, 10], [1, 20], [1, 40]], [1, 4])
    assert cols.tolist() == [[0.5, 15.0], [1.0, 40.0]]
    # A NaN point is dropped: through (0, 0) and (4, 1) only, 2 -> 0.5.
    assert interpolate([0, 2, 4], [0, np.nan, 1], [2]).tolist() == [0.5]


def test_median_and_iqr_over_seeds_on_a_common_grid():
    # Three seeds of one config, values at x = 0, 10: (0.1, 0.2, 0.4) and (0.3, 0.5, 0.9).
    steps = _steps(
        {
            ("A", 0): ([0, 10], [0.1, 0.3]),
            ("A", 1): ([0, 10], [0.2, 0.5]),
            ("A", 2): ([0, 10], [0.4, 0.9]),
        }
    )
    curves = aggregate(steps, "compute", "eval/pass@1", grid=np.array([0.0, 5.0, 10.0]))
    # numpy's linear percentiles of (a, b, c) sorted: q25 = (a + b) / 2, q75 = (b + c) / 2.
    # x = 0: 0.1, 0.2, 0.4 -> q25 0.15, median 0.2, q75 0.3.
    # x = 5: midpoints 0.2, 0.35, 0.65 -> 0.275, 0.35, 0.5.
    # x = 10: 0.3, 0.5, 0.9 -> 0.4, 0.5, 0.7.
    assert curves["x"].tolist() == [0, 5, 10]
    # The seed mean (the point estimate): (0.1 + 0.2 + 0.4) / 3 = 0.7 / 3; at 5 the mean of
    # the midpoints 1.2 / 3 = 0.4; at 10 (0.3 + 0.5 + 0.9) / 3 = 1.7 / 3.
    assert curves["mean"].tolist() == pytest.approx([0.7 / 3, 0.4, 1.7 / 3])
    assert curves["median"].tolist() == pytest.approx([0.2, 0.35, 0.5])
    assert curves["q25"].tolist() == pytest.approx([0.15, 0.275, 0.4])
    assert curves["q75"].tolist() == pytest.approx([0.3, 0.5, 0.7])
    assert curves["n_seeds"].tolist() == [3, 3, 3]


def test_a_point_needs_every_seed_unless_min_seeds_relaxes_it():
    # Seed 1 stops at x = 5: past it the median would be seed 0's alone.
    steps = _steps({("A", 0): ([0, 10], [0.0, 1.0]), ("A", 1): ([0, 5], [0.0, 0.2])})
    grid = np.array([0.0, 5.0, 10.0])
    strict = aggregate(steps, "compute", "eval/pass@1", grid=grid)
    assert strict["x"].tolist() == [0, 5]
    # x = 5: seed 0 at 0.5 and seed 1 at 0.2 -> median 0.35.
    assert strict["median"].tolist() == pytest.approx([0.0, 0.35])
    loose = aggregate(steps, "compute", "eval/pass@1", grid=grid, min_seeds=1)
    assert loose["x"].tolist() == [0, 5, 10] and loose["n_seeds"].tolist() == [2, 2, 1]


@pytest.mark.parametrize(
    ("x", "y", "target", "expected"),
    [
        ([0, 10, 20], [0.2, 0.4, 0.8], 0.6, 15.0),  # crossing inside (10, 20): 10 + 0.2/0.4*10
        ([0, 10, 20], [0.2, 0.4, 0.8], 0.4, 10.0),  # reached exactly at a point
        ([0, 10, 20], [0.7, 0.4, 0.8], 0.6, 0.0),  # the first point is already there
        ([0, 10, 20], [0.2, 0.65, 0.5], 0.6, 10 * 0.4 / 0.45),  # the first crossing counts
        ([0, 10, 20], [0.2, 0.4, 0.5], 0.6, math.inf),  # never reached
        ([0, 10, 20], [0.2, float("nan"), 0.8], 0.5, 0 + 0.3 / 0.6 * 20),  # NaN points skipped
    ],
)
def test_compute_to_target(x, y, target, expected):
    assert compute_to_target(x, y, target) == pytest.approx(expected)


def test_pareto_envelope_is_the_running_best_over_configurations():
    curves = pd.DataFrame(
        {
            "label": ["A"] * 3 + ["B"] * 3,
            "x": [0, 1, 2] * 2,
            "mean": [0.1, 0.5, 0.4, 0.2, 0.3, 0.6],
        }
    )
    env = pareto_envelope(curves)
    # x=0: max(0.1, 0.2) = 0.2 (B); x=1: max(0.5, 0.3) = 0.5 (A); x=2: A's best so far is
    # still 0.5 (it fell to 0.4), B is at 0.6 -> 0.6 (B).
    assert env["best"].tolist() == [0.2, 0.5, 0.6]
    assert env["label"].tolist() == ["B", "A", "B"]


def test_pareto_envelope_keeps_a_finished_curve_best_so_far():
    # B stops at x = 1 (NaN at 2): its 0.9 still counts at x = 2.
    curves = pd.DataFrame(
        {"label": ["A", "A", "A", "B", "B"], "x": [0, 1, 2, 0, 1],
         "mean": [0.1, 0.2, 0.3, 0.5, 0.9]}
    )  # fmt: skip
    env = pareto_envelope(curves)
    assert env["best"].tolist() == [0.5, 0.9, 0.9] and env["label"].tolist() == ["B"] * 3


def test_pareto_front_keeps_non_dominated_points():
    pts = pd.DataFrame({"cost": [1, 2, 3, 4, 2], "acc": [0.5, 0.4, 0.7, 0.7, 0.6]})
    front = pareto_front(pts, "cost", "acc")
    # (2, 0.4) is dominated by (1, 0.5); (4, 0.7) by (3, 0.7).
    assert list(zip(front["cost"], front["acc"], strict=True)) == [(1, 0.5), (2, 0.6), (3, 0.7)]


def test_target_table_savings_vs_the_baseline():
    steps = _steps(
        {
            ("base", 0): ([0, 10, 20], [0.2, 0.4, 0.5]),
            ("base", 1): ([0, 10, 20], [0.2, 0.4, 0.5]),
            ("buf", 0): ([0, 5, 10], [0.2, 0.5, 0.6]),
            ("buf", 1): ([0, 5, 10], [0.2, 0.3, 0.6]),
        }
    )
    table, target = target_table(steps, target=0.5, baseline="base")
    assert target == 0.5
    t = table.set_index("label")
    # base: 0.5 first at x = 20. buf seed-mean curve: 0.2, 0.4, 0.6 at 0, 5, 10 (linear in
    # between, whatever grid points lie there) -> 0.5 at 7.5.
    assert t.loc["base", "x_to_target"] == pytest.approx(20)
    assert t.loc["buf", "x_to_target"] == pytest.approx(7.5)
    assert t.loc["buf", "saving_vs_baseline"] == pytest.approx(1 - 7.5 / 20)
    # Peak and final of the seed-mean curve: buf 0.6 and 0.6; base 0.5 and 0.5.
    assert t.loc["buf", ["peak", "final"]].tolist() == pytest.approx([0.6, 0.6])
    assert t.loc["base", ["peak", "final"]].tolist() == pytest.approx([0.5, 0.5])
    # Own curves: buf seed 0 reaches 0.5 at 5, seed 1 at 5 + (0.2 / 0.3) * 5; both base seeds
    # at 20.
    assert t.loc["buf", "seeds_reaching_target"] == 2 == t.loc["base", "seeds_reaching_target"]
    # Default target: 98% of the best peak of the seed-mean curves (buf's 0.6) = 0.588; the
    # baseline never gets there.
    table, target = target_table(steps, baseline="base")
    assert target == pytest.approx(0.98 * 0.6)
    t = table.set_index("label")
    assert t.loc["base", "x_to_target"] == math.inf
    assert t.loc["base", "seeds_reaching_target"] == 0
    assert np.isnan(t.loc["buf", "saving_vs_baseline"])  # no saving against "never"
    # buf: 0.4 at 5, 0.6 at 10 -> 5 + 5 * 0.188 / 0.2 = 9.7.
    assert t.loc["buf", "x_to_target"] == pytest.approx(9.7)


def test_drawdown_per_seed_in_the_target_table():
    from replay_exp.analysis.curves import drawdown

    # 0.5 then 0.3: a drop of 0.2 (the later 0.4 does not matter); a rising curve: 0.
    assert drawdown([0.1, 0.5, 0.3, 0.4]) == pytest.approx(0.2)
    assert drawdown([0.1, 0.2, 0.3]) == 0.0
    # Many curves at once, along an axis: [2, 3] along axis 1 -> one drawdown per row.
    assert drawdown(np.array([[0.1, 0.5, 0.3], [0.3, 0.2, 0.1]]), axis=1) == pytest.approx(
        [0.2, 0.2]
    )
    steps = _steps(
        {
            ("buf", 0): ([0, 5, 10], [0.2, 0.6, 0.45]),  # drawdown 0.15
            ("buf", 1): ([0, 5, 10], [0.2, 0.3, 0.25]),  # 0.05
            ("buf", 2): ([0, 5, 10], [0.2, 0.3, 0.4]),  # 0
        }
    )
    t = target_table(steps)[0].set_index("label")
    # The mean over seeds: (0.15 + 0.05 + 0) / 3 = 0.2 / 3, the statistic the bootstrap's
    # stability is made of (replay_exp.analysis.stats).
    assert t.loc["buf", "drawdown"] == pytest.approx(0.2 / 3)
