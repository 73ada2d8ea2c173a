"""Saving on one axis minus saving on another, per paired seed
(replay_exp/analysis/studies/axis_gap.py),
on hand-made runs with hand-derived numbers."""

from __future__ import annotations

import math

import pytest

from replay_exp.analysis.loader import from_records
from replay_exp.analysis.studies.axis_gap import per_seed_savings, summarise


def _run(name, buffer, seed, passes, node):
    cfg = {"buffer.name": buffer, "seed": seed}
    rows = [
        {"step": i, "eval/pass@1": p, "compute/paper_units": float(i), "runtime/node_time": n}
        for i, (p, n) in enumerate(zip(passes, node, strict=True))
    ]
    return (name, name, cfg, rows, "finished")


def test_gap_per_seed_and_its_t_interval():
    """Baseline (both seeds): pass@1 0, 0.5, 1 at compute 0, 1, 2 and node 0, 10, 20; its
    seed-mean peak is 1, so the target is 0.98, reached at compute 1 + 0.48 / 0.5 = 1.96 and
    node 19.6. Replay seed 0: pass@1 0, 1, 1 at node 0, 5, 10: compute 0.98 (saving 1 -
    0.98 / 1.96 = 0.5), node 4.9 (saving 1 - 4.9 / 19.6 = 0.75), gap 0.25. Seed 1: the
    baseline's curve at node 0, 8, 16: compute saving 0, node 15.68 (saving 0.2), gap 0.2.
    Mean gap 0.225, sd 0.035355, SE 0.025, t_1 = 12.706: [-0.0927, 0.5427], not separable."""
    records = [
        _run("base0", "on_policy", 0, [0, 0.5, 1], [0, 10, 20]),
        _run("base1", "on_policy", 1, [0, 0.5, 1], [0, 10, 20]),
        _run("fifo0", "fifo", 0, [0, 1, 1], [0, 5, 10]),
        _run("fifo1", "fifo", 1, [0, 0.5, 1], [0, 8, 16]),
    ]
    table, base, target = per_seed_savings(from_records(records), ("node", "compute"))
    assert target == pytest.approx(0.98)
    assert table["compute_saving"].tolist() == pytest.approx([0.5, 0.0])
    assert table["node_saving"].tolist() == pytest.approx([0.75, 0.2])
    assert table["gap"].tolist() == pytest.approx([0.25, 0.2])
    (row,) = summarise(table, ("node", "compute")).to_dict("records")
    assert row["gap"] == pytest.approx(0.225)
    assert (row["gap_lo"], row["gap_hi"]) == pytest.approx((-0.09265, 0.54265), abs=1e-4)
    assert row["verdict"] == "not separable"


def test_a_seed_that_never_reaches_the_target_has_no_gap():
    records = [
        _run("base0", "on_policy", 0, [0, 0.5, 1], [0, 10, 20]),
        _run("fifo0", "fifo", 0, [0, 0.2, 0.4], [0, 5, 10]),
    ]
    table, _, _ = per_seed_savings(from_records(records), ("node", "compute"))
    assert math.isnan(table["gap"].iloc[0])
    (row,) = summarise(table, ("node", "compute")).to_dict("records")
    assert row["seeds_with_gap"] == 0 and row["verdict"] == "no interval"
