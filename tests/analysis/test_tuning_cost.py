"""``tuning_cost``: the compute of the runs that chose a design, beside its verdict's, summed from
the runs' ledgers; hand-made run directories with known ledgers."""

from __future__ import annotations

import json

import pytest

from replay_exp.analysis.studies.tuning_cost import main, tuning_cost


def _run(root, name, units, seconds, finished=True):
    d = root / name
    d.mkdir(parents=True)
    ledger = {"compute/paper_units": units, "compute/seconds": seconds}
    # An unfinished run has no summary.json: its last logged row carries the ledger (an earlier
    # row spent less; a diagnostics row without compute keys comes last).
    rows = [{"step": 0, "compute/paper_units": 0.0, "compute/seconds": 0.0}, {"step": 9, **ledger},
            {"step": 9, "loss/pg": 0.1}]  # fmt: skip
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        summary = {"status": "finished", "compute": {"paper_units": units, "seconds": seconds}}
        (d / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def sweeps(tmp_path):
    # An lr grid of 2 on-policy runs, a controller selection of 3 (one killed at 1000 units),
    # 2 verdict runs of each arm at a 3000-unit budget.
    _run(tmp_path / "grid", "lr=1,seed=0", 3000.0, 1800.0)
    _run(tmp_path / "grid", "lr=2,seed=0", 3000.0, 1800.0)
    _run(tmp_path / "select", "a,seed=0", 3000.0, 3600.0)
    _run(tmp_path / "select", "b,seed=0", 2999.5, 3600.0)
    _run(tmp_path / "select", "c,seed=0", 1000.0, 1200.0, finished=False)
    for arm in ("onp", "ctl"):
        _run(tmp_path / arm, "seed=5", 3000.0, 600.0)
        _run(tmp_path / arm, "seed=6", 3000.0, 600.0)
    return tmp_path


def test_each_arm_counts_its_tuning_and_its_verdict(sweeps):
    arms = {
        "on-policy": ([sweeps / "grid"], [sweeps / "onp"]),
        # The grid chose the controller's start too; a sweep named twice counts once.
        "controller": ([sweeps / "grid", sweeps / "select", sweeps / "grid"], [sweeps / "ctl"]),
    }
    table = tuning_cost(arms).set_index("arm")
    onp, ctl = table.loc["on-policy"], table.loc["controller"]
    # on-policy: tuning 3000 + 3000 = 6000 units, 2 runs; verdict 2 x 3000 = 6000; total
    # 12,000 = 4 verdict runs of 3000; tuning hours (1800 + 1800) / 3600 = 1.0.
    assert (onp.tuning_runs, onp.tuning_units, onp.verdict_units) == (2, 6000.0, 6000.0)
    assert onp.total_in_verdict_runs == pytest.approx(4.0)
    assert onp.tuning_hours == pytest.approx(1.0) and onp.unfinished == 0
    # controller: tuning 6000 (grid) + 3000 + 2999.5 + 1000 (the killed run's spend) = 12,999.5
    # units over 5 runs, 1 unfinished; total 12,999.5 + 6000 = 18,999.5 = 6.3332 verdict runs;
    # tuning hours (3600 + 3600 + 3600 + 1200) / 3600 = 3.3333.
    assert (ctl.tuning_runs, ctl.tuning_units, ctl.unfinished) == (5, 12999.5, 1)
    assert ctl.total_units == pytest.approx(18999.5)
    assert ctl.total_in_verdict_runs == pytest.approx(18999.5 / 3000)
    assert ctl.tuning_hours == pytest.approx(12000 / 3600)


def test_the_command_writes_the_table_and_refuses_unpaired_arms(sweeps, capsys):
    out = sweeps / "out"
    main(["--arm", "on-policy", "--tuning", str(sweeps / "grid"), "--verdict", str(sweeps / "onp"),
          "--out", str(out)])  # fmt: skip
    text = (out / "summary.md").read_text()
    assert "| on-policy | 2 | 6,000 | 2 | 6,000 | 12,000 | 4.0 | 1.0 |" in text
    assert (out / "tuning_cost.csv").read_text().startswith("arm,tuning_runs,tuning_units,")
    with pytest.raises(SystemExit):
        main(["--arm", "a", "--arm", "b", "--tuning", str(sweeps / "grid"), "--verdict",
              str(sweeps / "onp"), "--out", str(sweeps / "out2")])  # fmt: skip
    assert "one --tuning and one --verdict per --arm" in capsys.readouterr().err
    assert not (sweeps / "out2").exists()
