"""The theory-vs-experiment check: the recommendation for any measured alpha, the nearest tested
configuration, and the whole check on hand-made run directories whose answer is known."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import yaml

from replay_exp.analysis.studies.theory_check import check, main, nearest, optimum
from replay_exp.eval.estimators import encode_details
from replay_exp.theory.bound import closed_form_optimum


def test_optimum_for_every_sign_of_alpha():
    # alpha <= 0: staleness is free, x* = inf and y* = sqrt(mu / rho)
    assert optimum(6.84, -0.3, 0.9) == (math.inf, pytest.approx(math.sqrt(6.84 / 0.9)))
    assert optimum(6.84, 0.0, 0.25) == (math.inf, pytest.approx(math.sqrt(6.84 / 0.25)))
    # the paper's worked example through the closed form
    x, y = optimum(5.28, 0.1, 0.1)
    assert (x, y) == closed_form_optimum(5.28, 0.1, 0.1)
    assert x == pytest.approx(14.3, abs=0.1) and y == pytest.approx(5.6, abs=0.1)


def test_nearest_is_by_reuse_then_horizon():
    configs = pd.DataFrame(
        {"label": ["on", "y2", "y4", "y4 long"], "x": [1, 8, 32, 128], "y": [1, 2, 4, 4]}
    )
    assert nearest(configs, 10.0, 1.9) == "y2"
    assert nearest(configs, 20.0, 3.5) == "y4"
    assert nearest(configs, math.inf, 3.5) == "y4 long"  # x* = inf: the longest horizon
    assert nearest(configs, 1.0, 0.5) == "on"


def _run(root, name, buffer, x, y, seed, rates, J=300):
    d = root / name
    d.mkdir(parents=True)
    cfg = {
        "seed": seed,
        "buffer": {"name": buffer, "capacity": 32 * x},
        "compute": {"mu": 6.84},
        "derived": {"staleness_horizon": x, "reuse_ratio": y},
    }
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    with open(d / "metrics.jsonl", "w") as m, open(d / "eval_details.jsonl", "w") as e:
        for k, rate in enumerate(rates):
            c = np.zeros(J, dtype=bool)
            c[: int(rate * J) + seed] = True
            row = {"step": k, "compute/paper_units": 10.0 * k, "compute/seconds": 1.0 * k}
            m.write(json.dumps({**row, "eval/pass@1": c.mean(), "compute/measured_mu": 0.5}) + "\n")
            det = {"pass1": c, "n_correct": c.astype(int), "n_samples": 1}
            e.write(json.dumps({**row, **encode_details(det)}) + "\n")
    (d / "summary.json").write_text(json.dumps({"status": "finished"}))


def test_check_on_a_hand_made_sweep(tmp_path):
    """On-policy ends at 0.50, y = 2 at 0.60, y = 4 at 0.55 (3 seeds); measured alpha < 0 and
    rho = 0.9 recommend y* = sqrt(6.84 / 0.9) = 2.76: nearest tested y = 2, the best."""
    root = tmp_path / "sweep"
    arms = (("on_policy", 1, 1, (0.2, 0.4, 0.5)), ("fifo", 8, 2, (0.2, 0.5, 0.6)),
            ("fifo", 32, 4, (0.2, 0.5, 0.55)))  # fmt: skip
    for buffer, x, y, rates in arms:
        for seed in range(3):
            name = f"buffer.name={buffer},buffer.capacity={x * 32},seed={seed}"
            _run(root, name, buffer, x, y, seed, rates)
    noise = {
        "deltas": [1, 4],
        "pooled": {"alpha": -0.2, "alpha_ci": [-0.3, -0.1], "rho": [0.9, 0.7],
                   "rho_ci": [[0.85, 0.95], [0.6, 0.8]]},
    }  # fmt: skip
    res = check(noise, [root], n_boot=300)
    assert res["y_star"] == pytest.approx(math.sqrt(6.84 / 0.9)) and res["x_star"] == math.inf
    assert res["mu_cpu"] == pytest.approx(0.5) and res["delta"] == 1
    c = res["configs"].set_index("y")
    assert c.loc[2, "final"] == pytest.approx(0.60 + 1 / 300, abs=1e-9)  # seeds add 0, 1, 2
    assert res["best"] == res["recommended"] == c.loc[2, "label"] and res["gap"] is None
    assert c.loc[1, "J_rel"] == pytest.approx(1.0)
    # rho at delta = 4 (0.7): y* = 3.13 -> nearest is still y = 2 in log distance? |ln(3.13/2)|
    # = 0.45 > |ln(3.13/4)| = 0.25: y = 4, which leaves 0.05 on the table
    res = check(noise, [root], delta=4, n_boot=300)
    assert res["recommended"] == c.loc[4, "label"]
    assert res["gap"]["final"] == pytest.approx(-0.05, abs=1e-9)
    assert res["gap"]["final_verdict"] == "worse"
    out = tmp_path / "out"
    (tmp_path / "noise.json").write_text(json.dumps(noise))
    main([str(root), "--noise", str(tmp_path / "noise.json"), "--out", str(out),
          "--n-boot", "200"])  # fmt: skip
    text = (out / "theory_check.md").read_text()
    assert "x* = inf, y* = 2.76" in text and (out / "theory_check.png").stat().st_size > 0
