"""Post-hoc pass@k of finished runs (replay_exp/eval/final.py) on real tiny runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from replay_exp.eval.estimators import decode_details
from replay_exp.eval.final import OUT_NAME, main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory, fast_session):
    root = tmp_path_factory.mktemp("final")
    proc = subprocess.run(
        [sys.executable, "-m", "replay_exp.train", "-m", *fast_session, "schedule.max_steps=2",
         "experiment=on_policy,replay_reuse2", "seed=0", f"output_root={root / 'runs'}",
         "sweep_name=final"],
        cwd=root, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sorted(p.parent for p in (root / "runs" / "final").rglob("summary.json"))


def test_the_final_policy_evaluated_again_with_more_samples(runs, capsys):
    args = [*map(str, runs), "--n-samples", "8", "--pass-k", "8", "1", "2", "--problems", "0"]
    main(args)
    for run in runs:
        out = json.loads((run / OUT_NAME).read_text())
        final = json.loads((run / "summary.json").read_text())["final"]
        m = out["metrics"]
        # The same code, weights and problems as the run's last evaluation: greedy pass@1 is
        # the run's final pass@1 exactly.
        assert m["pass@1"] == final["eval/pass@1"]
        assert out["settings"]["pass_k"] == [1, 2, 8] and out["n_samples"] == 8
        counts = decode_details(out)["n_correct"]
        assert len(counts) == out["n_problems"] == 8  # --problems 0: all 8 held-out problems
        assert m["pass@1_sampled"] == pytest.approx(counts.mean() / 8)
        assert m["pass@1_sampled"] <= m["pass@2_sampled"] <= m["pass@8_sampled"]
    # The same settings again: skipped; others: redone.
    main(args)
    assert capsys.readouterr().out.count("already evaluated") == len(runs)
    main([*args[:-1], "4"])
    assert len(decode_details(json.loads((runs[0] / OUT_NAME).read_text()))["n_correct"]) == 4


def test_bad_input_is_one_line_before_any_model_is_loaded(runs, tmp_path, capsys):
    before = (runs[0] / OUT_NAME).read_text() if (runs[0] / OUT_NAME).is_file() else None
    with pytest.raises(SystemExit) as e:
        main([str(runs[0]), "--n-samples", "4", "--pass-k", "8"])
    assert e.value.code == 2
    assert "--pass-k [8] outside 1..--n-samples=4" in capsys.readouterr().err
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.yaml").write_text((runs[0] / "config.yaml").read_text())
    with pytest.raises(SystemExit):
        main([str(runs[0]), str(unfinished)])
    assert "no final_model (the run is unfinished" in capsys.readouterr().err
    after = (runs[0] / OUT_NAME).read_text() if (runs[0] / OUT_NAME).is_file() else None
    assert after == before
