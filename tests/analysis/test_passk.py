"""pass@k of the final policies against the baseline (replay_exp/analysis/studies/passk.py), on
hand-written run directories with hand-derived values."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml

from replay_exp.analysis.studies.passk import main
from replay_exp.eval.estimators import encode_details

SETTINGS = {"n_samples": 4, "pass_k": [1, 2], "sampled_problems": None,
            "sample_temperature": 1.0, "sample_top_p": 1.0}  # fmt: skip
# Correct samples out of 4 on the 2 problems, per configuration and seed.
COUNTS = {("on_policy", 0): [4, 0], ("on_policy", 1): [2, 2],
          ("fifo", 0): [4, 2], ("fifo", 1): [3, 3]}  # fmt: skip


def _run(root, buffer, seed, settings=SETTINGS):
    d = root / f"buffer.name={buffer},seed={seed}"
    d.mkdir(parents=True)
    cfg = {"buffer": {"name": buffer}, "seed": seed, "run_dir": f"runs/elsewhere/{seed}"}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    (d / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/pass@1": 0.5}) + "\n")
    (d / "summary.json").write_text(json.dumps({"status": "finished"}))
    counts = np.array(COUNTS.get((buffer, seed), [1, 1]))
    details = {"pass1": counts >= 2, "n_correct": counts, "n_samples": 4}
    final = {"settings": {**settings, "seed": 100 + seed}, "metrics": {"pass@1": 0.5},
             **encode_details(details)}  # fmt: skip
    (d / "final_passk.json").write_text(json.dumps(final))
    return d


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "sweep"
    for buffer, seed in COUNTS:
        _run(root, buffer, seed)
    return root


def test_gains_and_per_seed_differences_by_hand(sweep, tmp_path, capsys):
    main([str(sweep), "--out", str(tmp_path / "out"), "--n-boot", "200"])
    table = pd.read_csv(tmp_path / "out" / "passk.csv")
    fifo = table[table["label"] != table[table["baseline"]]["label"].iloc[0]].set_index("k")
    base = table[table["baseline"]].set_index("k")
    # pass@1 = c / 4 per problem. Baseline: seed 0 (1 + 0) / 2 = 0.5, seed 1 (0.5 + 0.5) / 2
    # = 0.5; fifo: seed 0 (1 + 0.5) / 2 = 0.75, seed 1 (0.75 + 0.75) / 2 = 0.75. Gain 0.25.
    assert base.loc[1, "mean"] == pytest.approx(0.5)
    assert fifo.loc[1, "gain"] == pytest.approx(0.25)
    assert fifo.loc[1, "per_seed"] == "+0.250 +0.250"
    # pass@2 = 1 - C(4 - c, 2) / C(4, 2): c = 4 -> 1, c = 0 -> 0, c = 2 -> 1 - 1/6 = 5/6,
    # c = 3 -> 1. Baseline: seed 0 0.5, seed 1 5/6, mean 2/3; fifo: seed 0 (1 + 5/6) / 2 =
    # 11/12, seed 1 1, mean 23/24. Gain 23/24 - 2/3 = 7/24; per seed 5/12 and 1/6.
    assert base.loc[2, "mean"] == pytest.approx(2 / 3)
    assert fifo.loc[2, "mean"] == pytest.approx(23 / 24)
    assert fifo.loc[2, "gain"] == pytest.approx(7 / 24)
    assert fifo.loc[2, "per_seed"] == "+0.417 +0.167"
    assert (fifo["lo"] <= fifo["gain"]).all() and (fifo["gain"] <= fifo["hi"]).all()
    md = (tmp_path / "out" / "passk.md").read_text()
    assert "4 samples per problem" in md and "+29.2" in md
    assert (tmp_path / "out" / "passk_gain.png").is_file()


def test_a_run_without_its_evaluation_or_with_other_settings_is_an_error(sweep, tmp_path):
    other = tmp_path / "other"
    _run(other, "fifo", 2, {**SETTINGS, "n_samples": 8})
    with pytest.raises(SystemExit, match="differ in their settings"):
        main([str(sweep), str(other), "--out", str(tmp_path / "out")])
    (other / "buffer.name=fifo,seed=2" / "final_passk.json").unlink()
    with pytest.raises(SystemExit, match="1 run\\(s\\) without final_passk.json"):
        main([str(sweep), str(other), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
