"""The variance models against measured accuracies (replay_exp/analysis/studies/variance_models.py),
on hand-written runs with hand-derived predictions, signs and rank correlations."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from replay_exp.analysis.studies.variance_models import main, spearman

# rho constant 0.5 at every distance; mu = 2.
NOISE = {"deltas": [1, 2], "pooled": {"rho": [0.5, 0.5]}, "command": "by hand"}
# (buffer, R, final pass@1 per seed 0-2)
ARMS = {
    "on_policy": (64, [0.50, 0.52, 0.54]),
    "fifo_a": (32, [0.60, 0.63, 0.63]),  # x = 2, y = 2: better by 10, 11, 9 points
    "fifo_b": (64, [0.41, 0.41, 0.44]),  # x = 1, y = 1: worse by 9, 11, 10 points
}


def _write(root, arm, seed):
    R, finals = ARMS[arm]
    d = root / f"{arm},seed={seed}"
    d.mkdir(parents=True)
    buffer = "on_policy" if arm == "on_policy" else "fifo"
    cfg = {"buffer": {"name": buffer, "capacity": 64}, "seed": seed, "compute": {"mu": 2.0},
           "schedule": {"rollouts_per_step": R},
           "derived": {"rollouts_per_step": R, "staleness_horizon": 64 / R,
                       "reuse_ratio": 64 / R}}  # fmt: skip
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    rows = [{"step": 0, "compute/paper_units": 0.0, "eval/pass@1": 0.2},
            {"step": 10, "compute/paper_units": 100.0, "eval/pass@1": finals[seed]}]  # fmt: skip
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({"status": "finished"}))


def test_spearman_by_hand():
    # ranks [3, 2, 1] vs [2, 3, 1]: deviations (1, 0, -1) and (0, 1, -1), cov 1, var 2 -> 0.5
    assert spearman([3, 2, 1], [0.52, 0.62, 0.42]) == pytest.approx(0.5)
    assert spearman([1, 2], [1, 2]) != spearman([1, 2], [1, 2])  # NaN under 3 points


def test_predictions_signs_orders_and_the_recommendation(tmp_path):
    for arm in ARMS:
        for seed in range(3):
            _write(tmp_path / "runs", arm, seed)
    (tmp_path / "noise.json").write_text(json.dumps(NOISE))
    out = tmp_path / "out"
    main([str(tmp_path / "runs"), "--noise", str(tmp_path / "noise.json"), "--n-boot", "300",
          "--recommended", "y=2", "--out", str(out)])  # fmt: skip
    t = pd.read_csv(out / "variance_models.csv").set_index("x")
    a, b = t.loc[2.0], t.loc[1.0].query("verdict != '(baseline)'").iloc[0]
    # A: x = 2, y = 2, R = 32, N = 64, rho 0.5: exact R V = (1 - 1/64) / 2 + 1/2 + 0.5 (1 - 1/2)
    # = 1.2421875, J = (1 + 2/2) R V = 2.484375, J_on = 1 + 1/2 = 1.5 -> 1.65625. Paper:
    # (1 + 1)(1/2 + 1/2 + 0.5) / ((1 + 1/2)(1 + 1 + 0.5)) = 3 / 3.75 = 0.8 (mean gap 1).
    assert a["exact"] == pytest.approx(1.65625) and a["paper_rho1"] == pytest.approx(0.8)
    # B: x = y = 1, R = 64: R V = 63/64 + 1 = 1.984375, J = 1.5 R V -> exact 1.984375;
    # paper J(1, 1) / J(1, 1) = 1.
    assert b["exact"] == pytest.approx(1.984375) and b["paper_rho1"] == pytest.approx(1.0)
    assert (a["verdict"], b["verdict"]) == ("better", "worse")
    assert a["diff"] == pytest.approx(0.10) and b["diff"] == pytest.approx(-0.10)
    # Signs: exact says A worse (wrong) and B worse (right); paper says A better (right) and B
    # level (1.0 is not worse: wrong).
    assert (a["exact_sign"], b["exact_sign"]) == ("no", "yes")
    assert (a["paper_rho1_sign"], b["paper_rho1_sign"]) == ("yes", "no")
    md = (out / "variance_models.md").read_text()
    # Spearman(-J, final) over baseline, A, B (finals 0.52, 0.62, 0.42): exact -J (-1, -1.656,
    # -1.984) ranks (3, 2, 1) -> 0.5; paper -J (-1, -0.8, -1) ranks (1.5, 3, 1.5), deviations
    # (-0.5, 1, -0.5) against (0, 1, -1): cov 1.5, var 1.5 and 2 -> 1.5 / sqrt(3) = 0.87.
    assert "exact: sign right 1, wrong 1, untested (not separable) 0; Spearman" in md
    assert "= 0.50" in md and "= 0.87" in md
    # The recommended configuration is the empirical best (A): inside at 0.
    assert "against the empirical best" in md and "inside the interval" in md
    assert (out / "variance_models.png").is_file()
