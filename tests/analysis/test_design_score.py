"""Scoring the design model's prediction (replay_exp/analysis/studies/design_score.py) on a
hand-made bracket: the rank correlation and the pick-vs-best reading."""

from __future__ import annotations

import pandas as pd
import pytest

from replay_exp.analysis.studies.design_score import cell_scores, predict, score


def rho(delta: float) -> float:
    return 0.5


def runs() -> pd.DataFrame:
    # three cells x two seeds, plus an unfinished run and a run of another lr (both left out)
    rows = []
    for N, R, finals in [(512, 16, (0.70, 0.72)), (8192, 16, (0.80, 0.82)),
                         (8192, 32, (0.75, 0.75))]:  # fmt: skip
        for seed, f in enumerate(finals):
            rows.append({"label": f"N={N}, R={R}", "seed": seed, "status": "finished",
                         "final": f, "derived.capacity": N, "derived.rollouts_per_step": R,
                         "algo.lr": 3e-5})  # fmt: skip
    rows.append({**rows[0], "seed": 2, "status": "running"})
    rows.append({**rows[0], "algo.lr": 6e-5, "final": 0.99})
    return pd.DataFrame(rows)


def test_cells_average_the_seeds_of_the_matching_runs():
    cells = cell_scores(runs(), [0, 1], {"algo.lr": "3e-05"})
    got = dict(zip(zip(cells["N"], cells["R"], strict=True), cells["final"], strict=True))
    assert got == pytest.approx({(512, 16): 0.71, (8192, 16): 0.81, (8192, 32): 0.75})
    assert set(cells["seeds_done"]) == {2}


def test_spearman_and_the_pick_against_the_best():
    table = predict(cell_scores(runs(), [0, 1], {"algo.lr": "3e-05"}), 64, 6.84, rho, 0.0, {})
    # The measured order is (8192, 16) > (8192, 32) > (512, 16). At rho 0.5 and alpha 0, with
    # (1 + y / mu) / (1 + 1 / mu) = 1.5848 (y = 4) and 1.2924 (y = 2) at mu 6.84:
    # exact R V = (1 - 1/N) / y + 1/x + rho (1 - 1/x): (8192, 16) 0.7509, (512, 16) 0.7651,
    # (8192, 32) 1.0019, so J 1.038 < 1.058 < 1.130; paper_gap (1/y + 1/x + rho): 0.7520,
    # 0.7813, 1.0039, the same order. Both put (512, 16) second: predicted ranks (1, 3, 2)
    # against measured (1, 2, 3), Spearman 1 - 6 x 2 / (3 x 8) = 0.5.
    assert list(table.sort_values("measured_rank")["N"]) == [8192, 8192, 512]
    assert table.sort_values("N")["exact"].tolist() == pytest.approx([1.058, 1.038, 1.130],
                                                                     abs=1e-3)  # fmt: skip
    for r in score(table, None):
        assert r["spearman"] == pytest.approx(0.5)
        assert r["pick"] == r["best"] == "N=8192, R=16"
        assert r["pick_vs_best"] == "the best itself"
    # A pick other than the best is read from a report against the best: within when its
    # interval contains 0.
    table.loc[table["N"] == 512, "exact"] = -1.0  # make exact pick (512, 16)
    stats = pd.DataFrame([{"label": "N=512, R=16", "final": -0.1, "final_lo": -0.2,
                           "final_hi": 0.01}])  # fmt: skip
    exact = next(r for r in score(table, stats) if r["model"] == "exact")
    assert exact["pick"] == "N=512, R=16"
    assert exact["pick_vs_best"].startswith("within: pick - best -0.1000 [-0.2000, +0.0100]")


def test_a_tie_goes_to_the_smaller_n_then_the_smaller_y_and_the_pick_is_read_from_the_stats():
    # (8192, 16) 0.8100 and (8192, 32) 0.8095 lie within 0.1 pt: the rule takes the smaller
    # reuse ratio y = B / R, i.e. R = 32, although (8192, 16) has the higher mean; (512, 16)
    # 0.71 is out of the tie. Both models pick (8192, 16) (test above), now not the best.
    t = runs()
    t.loc[t["derived.rollouts_per_step"] == 32, "final"] = 0.8095
    table = predict(cell_scores(t, [0, 1], {"algo.lr": "3e-05"}), 64, 6.84, rho, 0.0, {})
    stats = pd.DataFrame([{"label": "N=8192, R=16", "final": 0.0005, "final_lo": -0.008,
                           "final_hi": 0.009}])  # fmt: skip
    exact = next(r for r in score(table, stats) if r["model"] == "exact")
    assert (exact["best"], exact["pick"]) == ("N=8192, R=32", "N=8192, R=16")
    assert exact["pick_vs_best"].startswith("within: pick - best +0.0005")
    # With no tie band, the highest mean is the best and the pick is the best itself.
    exact = next(r for r in score(table, None, tie=0.0) if r["model"] == "exact")
    assert exact["best"] == exact["pick"] == "N=8192, R=16"
    # A pick the stats do not hold (a report on other runs) is one clear line, not an IndexError.
    with pytest.raises(SystemExit, match="no row labelled 'N=8192, R=16'"):
        score(table, stats.assign(label="N=8192, R=16, mu=17.6"))


def test_where_relabels_the_cells_as_a_report_on_those_runs():
    # Two mu in the loaded sweeps: their labels carry the mu; with --where compute.mu=17.6 only
    # N and y vary, as in a report made on the mu = 17.6 runs alone.
    rows = []
    for mu in (2.0, 17.6):
        for N, y in [(8192, 4), (32768, 4)]:
            rows.append({"label": f"N={N}, y={y}, mu={mu:g}", "seed": 0, "status": "finished",
                         "final": 0.8, "derived.capacity": N, "derived.rollouts_per_step": 16,
                         "buffer.name": "fifo", "buffer.capacity": N,
                         "schedule.reuse_ratio": y, "compute.mu": mu})  # fmt: skip
    keys = ["buffer.capacity", "compute.mu"]
    cells = cell_scores(pd.DataFrame(rows), [0], {"compute.mu": "17.6"}, keys)
    assert list(cells["label"]) == ["N=8192", "N=32768"]
    assert list(cell_scores(pd.DataFrame(rows), [0], {"compute.mu": "17.6"})["label"]) == [
        "N=8192, y=4, mu=17.6", "N=32768, y=4, mu=17.6"]  # fmt: skip
    with pytest.raises(SystemExit, match="no config key algo.lr"):
        cell_scores(pd.DataFrame(rows), [0], {"algo.lr": "3e-05"}, keys)
