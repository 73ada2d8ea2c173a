"""The node clock of in-process runs (replay_exp/analysis/studies/node_time.py): closed forms
without
stalls, the stall factor against its expectation, and the loader filling the column for
``x="node"`` on real tiny sweeps."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from replay_exp.analysis.loader import load_runs, with_node_time
from replay_exp.analysis.studies.node_time import COLUMN, modelled_node_time, sync_step_times
from replay_exp.compute.lengthmodel import expected_max


def _sync(**kw) -> dict:
    return {"schedule.name": "sync", "schedule.batch_size": 64, "derived.rollouts_per_step": 64,
            "compute.mu": 6.84, "seed": 0, **kw}  # fmt: skip


def test_without_stalls_a_sync_step_is_one_paper_unit_of_node_time():
    """sigma = 0, B = R = 64, g = 8, mu = 6.84: a step is B / g + mu R / g = 8 + 54.72 =
    62.72 = B (1 + mu) / g; after 0, 1 and 10 steps: 0, 62.72, 627.2. y = 2 (R = 32): 8 +
    6.84 x 4 = 35.36 a step."""
    got = modelled_node_time(_sync(), np.array([0, 1, 10]), sigma=0.0)
    assert got == pytest.approx([0.0, 62.72, 627.2])
    half = modelled_node_time(_sync(**{"derived.rollouts_per_step": 32}), np.array([2]), sigma=0)
    assert half == pytest.approx([70.72])


def test_the_emulated_cluster_never_stalls():
    """schedule=async, B = 64, T = 2: each step is the T trainers training B, 32; steps 0 and
    5: 0 and 160 (whatever sigma)."""
    cfg = {"schedule.name": "async", "schedule.batch_size": 64, "schedule.trainers": 2}
    assert modelled_node_time(cfg, np.array([0, 5])) == pytest.approx([0.0, 160.0])


def test_a_sync_step_waits_for_the_slowest_gpu():
    """sigma = 0.5: the generation part of a step averages mu (R / g) E[M_64] / E[M_8], the
    longest of all 64 responses over one GPU's expected longest of 8 (1.55 here, from
    expected_max), over 4000 steps within 2 %; the training part B / g is untouched."""
    steps = sync_step_times(4000, 64, 64, 6.84, seed=3, sigma=0.5)
    factor = expected_max(64, 0.5) / expected_max(8, 0.5)
    assert ((steps - 8.0) / 54.72).mean() == pytest.approx(factor, rel=0.02)
    assert factor > 1.4
    assert np.array_equal(steps, sync_step_times(4000, 64, 64, 6.84, seed=3, sigma=0.5))


@pytest.mark.slow
def test_loading_with_x_node_models_the_clock_of_in_process_runs(tiny_sweeps):
    """The tiny sweeps log no node clock (in process: NaN); loaded with x="node" every row
    gets the model's, zero before the first step and increasing; other axes leave it NaN."""
    runs = load_runs(tiny_sweeps["compute"], x="node")
    for _, g in runs.steps.groupby("run"):
        node = g.sort_values("step")[COLUMN].to_numpy()
        assert np.all(np.isfinite(node)) and np.all(np.diff(node) >= 0)
        assert node[-1] > 0
    assert load_runs(tiny_sweeps["compute"]).steps[COLUMN].isna().all()


def test_a_distributed_run_keeps_its_measured_clock_with_step_0_as_its_origin():
    """A runtime=distributed run measured its own clock, but its step-0 evaluation row (logged
    before any step) has none: the loader reads it as the origin, 0. A run without any clock
    (NaN throughout) is left alone."""
    measured = pd.DataFrame({"step": [0, 196, 392], COLUMN: [np.nan, 9053.4, 18197.1]})
    got = with_node_time(measured, {"runtime.name": "distributed"})[COLUMN].tolist()
    assert got == [0.0, 9053.4, 18197.1]
    none = pd.DataFrame({"step": [0, 196], COLUMN: [np.nan, np.nan]})
    assert with_node_time(none, {"runtime.name": "distributed"})[COLUMN].isna().all()
