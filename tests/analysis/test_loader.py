"""The loader on hand-written run directories, damaged ones included."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import yaml

from replay_exp.analysis import config_label, find_run_dirs, from_records, load_runs
from replay_exp.analysis.loader import overrides_from_name


def _config(capacity, seed, lr=2e-4, name="fifo"):
    return {
        "buffer": {"name": name, "capacity": capacity},
        "algo": {"lr": lr, "betas": [0.9, 0.999]},
        "seed": seed,
        "output_root": "/somewhere",
        "logger": {"name": "jsonl"},
        "derived": {"capacity": capacity, "threads": 2},
    }


def _rows(*pass1):
    """Rows at steps 0, 1, 2, ...: evaluation every other step (NaN elsewhere)."""
    rows = []
    for step, p in enumerate(pass1):
        row = {"step": step, "compute/paper_units": 0.5 * step, "train/reward": 0.1 * step}
        if p is not None:
            row["eval/pass@1"] = p
        rows.append(row)
    return rows


def _write(run_dir, config=None, rows=(), finished=False, tail=""):
    run_dir.mkdir(parents=True)
    if config is not None:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    if rows or tail:
        text = "".join(json.dumps(r) + "\n" for r in rows) + tail
        (run_dir / "metrics.jsonl").write_text(text)
    if finished:
        (run_dir / "summary.json").write_text(json.dumps({"status": "finished"}))


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "sweep"
    _write(root / "buffer.capacity=64,seed=0", _config(64, 0), _rows(0.2, None, 0.5), True)
    # Killed mid-write: a truncated last line, no summary.
    _write(root / "buffer.capacity=64,seed=1", _config(64, 1), _rows(0.3, None, 0.4),
           tail='{"step": 3, "eval/pa')  # fmt: skip
    # config.yaml lost: the directory name still says what it was.
    _write(root / "buffer.capacity=256,seed=0", None, _rows(0.1, None, 0.7), True)
    # Queued or just started: config but no metrics yet.
    _write(root / "buffer.capacity=256,seed=1", _config(256, 1))
    # Not runs: Hydra's record and a run's own subfolders.
    (root / "multirun.yaml").write_text("{}")
    (root / "buffer.capacity=64,seed=0" / "checkpoints" / "step_000002").mkdir(parents=True)
    return root


def test_partial_and_damaged_runs_load_with_warnings(sweep):
    with pytest.warns(UserWarning) as caught:
        runs = load_runs(sweep)
    messages = " | ".join(str(w.message) for w in caught)
    assert "truncated or corrupt line" in messages
    assert "missing config.yaml; config taken from the directory name" in messages
    assert "no metrics logged yet" in messages

    assert len(runs) == 4
    status = dict(zip(runs.runs["run"], runs.runs["status"], strict=True))
    assert status == {
        "buffer.capacity=64,seed=0": "finished",
        "buffer.capacity=64,seed=1": "unfinished",
        "buffer.capacity=256,seed=0": "finished",
        "buffer.capacity=256,seed=1": "empty",
    }
    # Seeds of one configuration share ``config``; runs ordered by N numerically, then seed.
    assert runs.config_keys == ["buffer.capacity"]
    assert runs.runs["config"].tolist() == ["buffer.capacity=64"] * 2 + ["buffer.capacity=256"] * 2
    assert runs.runs["label"].tolist() == ["N=64"] * 2 + ["N=256"] * 2
    assert runs.runs["seed"].tolist() == [0, 1, 0, 1]


def test_steps_table_is_tidy(sweep):
    with pytest.warns(UserWarning):
        runs = load_runs(sweep)
    steps = runs.steps
    # 3 rows per run with metrics (the truncated line dropped), none for the empty run.
    assert len(steps) == 9
    assert steps.groupby("run").size().to_dict() == {
        "buffer.capacity=256,seed=0": 3, "buffer.capacity=64,seed=0": 3,
        "buffer.capacity=64,seed=1": 3,
    }  # fmt: skip
    first = steps.iloc[0]
    assert first["run"] == "buffer.capacity=64,seed=0" and first["step"] == 0
    # Flattened config (dotted names, lists as strings) next to the metrics.
    assert first["buffer.capacity"] == 64 and first["algo.lr"] == 2e-4
    assert first["algo.betas"] == "[0.9, 0.999]" and first["derived.capacity"] == 64
    assert first["eval/pass@1"] == 0.2
    assert math.isnan(steps.iloc[1]["eval/pass@1"])  # a training-only row
    # The run without config.yaml has the keys of its directory name.
    nameless = steps[steps["run"] == "buffer.capacity=256,seed=0"]
    assert (
        nameless["buffer.capacity"].tolist() == [256] * 3 and nameless["seed"].tolist() == [0] * 3
    )


def test_runs_table_final_peak_and_compute_to_target(sweep):
    with pytest.warns(UserWarning):
        runs = load_runs(sweep)
    r = runs.runs.set_index("run")
    a = r.loc["buffer.capacity=64,seed=0"]
    assert (a["initial"], a["final"], a["peak"], a["last_step"]) == (0.2, 0.5, 0.5, 2)
    assert a["compute_at_peak"] == 1.0  # step 2 at 0.5 units per step
    # Target: 98% of the best peak over runs (0.7) = 0.686. Run 256/0 goes 0.1 -> 0.7 over
    # x = 0 -> 1: crosses at (0.686 - 0.1) / 0.6 = 0.9767. The others never get there.
    assert r.loc["buffer.capacity=256,seed=0", "compute_to_target"] == pytest.approx(0.586 / 0.6)
    assert a["compute_to_target"] == math.inf
    assert math.isnan(r.loc["buffer.capacity=256,seed=1", "peak"])  # empty run: no values


def test_a_single_run_dir_and_several_roots(sweep, tmp_path):
    one = sweep / "buffer.capacity=64,seed=0"
    assert find_run_dirs(one) == [(sweep, one)]
    other = tmp_path / "other"
    _write(other / "r", _config(64, 0, lr=1e-3), _rows(0.1, None, 0.2), True)
    with pytest.warns(UserWarning):
        runs = load_runs([sweep, other])
    assert len(runs) == 5
    assert runs.config_keys == ["algo.lr", "buffer.capacity"]
    assert "r" in set(runs.runs["run"])


def test_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        load_runs(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no runs"):
        load_runs(tmp_path / "empty")


def test_overrides_from_name():
    assert overrides_from_name("buffer.capacity=256,experiment=on_policy,seed=1") == {
        "buffer.capacity": 256, "experiment": "on_policy", "seed": 1,
    }  # fmt: skip
    assert overrides_from_name("eval.pass_k=[1,4],seed=0") == {"eval.pass_k": [1, 4], "seed": 0}


@pytest.mark.parametrize(
    ("cfg", "keys", "label"),
    [
        ({"buffer.name": "on_policy", "buffer.capacity": None, "schedule.reuse_ratio": None},
         ["buffer.name", "buffer.capacity", "schedule.reuse_ratio"], "on-policy"),
        ({"buffer.name": "fifo", "buffer.capacity": 256, "schedule.reuse_ratio": 2,
          "derived.reuse_ratio": 2.0}, ["buffer.name", "buffer.capacity", "schedule.reuse_ratio"],
         "FIFO, N=256, y=2"),
        ({"buffer.capacity": 768, "schedule.trainers": 2, "schedule.workers": None,
          "schedule.gpus": 8}, ["buffer.capacity", "schedule.trainers"], "N=768, (6,2)"),
        ({"buffer.name": "on_policy", "algo.lr": 1e-4}, ["buffer.name", "algo.lr"],
         "on-policy, lr=1e-04"),
        ({"buffer.name": "on_policy", "algo.lr": 1.2e-4}, ["buffer.name", "algo.lr"],
         "on-policy, lr=1.2e-04"),  # no digit dropped: 1.2e-4 is not 1e-4
        ({"buffer.name": "positive_bias", "buffer.delta": 0.2, "algo.name": "asymre"},
         ["buffer.delta", "algo.name"], "δ=0.2, AsymRE"),
        ({"task.n_digits": 4}, ["task.n_digits"], "n_digits=4"),
        ({}, [], "all runs"),
    ],
)  # fmt: skip
def test_config_labels_name_the_meaning(cfg, keys, label):
    assert config_label(cfg, keys) == label


def test_the_same_configuration_and_seed_from_two_sweeps_counts_once(sweep, tmp_path):
    """A configuration reached through two sweeps is one experiment per seed, not two seeds."""
    other = tmp_path / "other"
    _write(other / "buffer.capacity=64,seed=0", _config(64, 0), _rows(0.2, None, 0.5), True)
    _write(other / "buffer.capacity=64,seed=7", _config(64, 7), _rows(0.2, None, 0.6), True)
    with pytest.warns(UserWarning, match="same configuration and seed as .*sweep"):
        runs = load_runs([sweep, other])
    cap64 = runs.runs[runs.runs["buffer.capacity"] == 64]
    assert sorted(cap64["seed"]) == [0, 1, 7]
    assert sorted(cap64["run_dir"].str.startswith(str(other))) == [False, False, True]
    assert len(runs.steps[runs.steps["run_dir"] == str(other / "buffer.capacity=64,seed=0")]) == 0


def test_run_dir_is_where_the_run_was_found_not_where_its_config_says(tmp_path):
    # An archived copy keeps the config's run_dir (runs/...); per-problem results must be read
    # from the copy, else a fresh clone's report silently falls back to seeds only.
    cfg = {**_config(64, 0), "run_dir": "runs/sweep/seed=0"}
    _write(tmp_path / "archive" / "seed=0", cfg, _rows(0.2, None, 0.5), True)
    runs = load_runs(tmp_path / "archive")
    assert list(runs.runs["run_dir"]) == [str(tmp_path / "archive" / "seed=0")]
    assert set(runs.steps["run_dir"]) == {str(tmp_path / "archive" / "seed=0")}


def test_the_evaluation_cadence_does_not_make_a_configuration(tmp_path):
    # Training does not depend on eval.every: runs that differ only in it are one configuration.
    for seed, every in ((0, 50), (1, 100)):
        cfg = {**_config(64, seed), "eval": {"every": every}}
        _write(tmp_path / "s" / f"seed={seed}", cfg, _rows(0.2, None, 0.5), True)
    runs = load_runs(tmp_path / "s")
    assert runs.config_keys == [] and runs.runs["label"].nunique() == 1


def test_runs_with_the_same_directory_name_in_two_sweeps_stay_two_runs(tmp_path):
    # seed=5/ of an on-policy sweep and seed=5/ of another sweep: one id would merge their rows
    # into one curve (found on Finding 1 stage 2 + theory_recommend: drawdowns 0.026 -> 0.062).
    _write(tmp_path / "onp" / "seed=5", _config(64, 5, name="on_policy"), _rows(0.2, None, 0.6),
           True)  # fmt: skip
    _write(tmp_path / "fifo" / "seed=5", _config(64, 5), _rows(0.3, None, 0.4), True)
    runs = load_runs([tmp_path / "onp", tmp_path / "fifo"])
    assert sorted(runs.runs["run"]) == ["fifo/seed=5", "onp/seed=5"]
    per_run = runs.steps.dropna(subset=["eval/pass@1"]).groupby("run")["eval/pass@1"]
    assert per_run.apply(list).to_dict() == {"fifo/seed=5": [0.3, 0.4], "onp/seed=5": [0.2, 0.6]}
    # One sweep alone keeps the plain names.
    assert list(load_runs(tmp_path / "onp").runs["run"]) == ["seed=5"]


def _code(commit, dirty=False, step=0):
    """One provenance record of config.yaml (replay_exp.rundir.record_provenance)."""
    return {"step": step, "started": "2026-12-06 12:00:00", "commit": commit, "dirty": dirty,
            "versions": {"python": "3.11.7", "torch": "2.13.0+cpu"}}  # fmt: skip


def test_each_run_carries_the_commit_that_made_it(tmp_path):
    a, b = "a" * 40, "b" * 40
    root = tmp_path / "s"
    _write(root / "seed=0", {**_config(64, 0), "provenance": [_code(a)]}, _rows(0.2, 0.5), True)
    # Resumed at step 1 on another commit, from a dirty tree.
    two = [_code(a), _code(b, dirty=True, step=1)]
    _write(root / "seed=1", {**_config(64, 1), "provenance": two}, _rows(0.3, 0.4), True)
    # From before the record; and one outside a git checkout (commit null: unknown).
    _write(root / "seed=2", _config(64, 2), _rows(0.3, 0.4), True)
    none = [{**_code(None, dirty=None), "git": "no commit recorded: git not found"}]
    _write(root / "seed=3", {**_config(64, 3), "provenance": none}, _rows(0.3, 0.4), True)
    # config.yaml lost: summary.json's copy of the records stands in.
    _write(root / "buffer.capacity=64,seed=4", None, _rows(0.3, 0.4))
    summary = {"status": "finished", "provenance": [_code(b)]}
    (root / "buffer.capacity=64,seed=4" / "summary.json").write_text(json.dumps(summary))
    with pytest.warns(UserWarning, match="missing config.yaml"):
        runs = load_runs(root)
    r = runs.runs.set_index("seed")

    def known(column):  # unknown: None (pandas may store it as NaN)
        return {k: None if pd.isna(v) else v for k, v in r[column].items()}

    assert known("commit") == {0: a, 1: f"{a}+{b}", 2: None, 3: None, 4: b}
    assert known("dirty") == {0: False, 1: True, 2: None, 3: None, 4: False}
    assert set(runs.steps["commit"].dropna()) == {a, f"{a}+{b}", b}  # on every step row too
    assert runs.steps["commit"].isna().sum() == 4  # 2 rows each of the 2 unknown runs
    # The records are no configuration: one configuration, no provenance column.
    assert runs.config_keys == [] and runs.runs["config"].nunique() == 1
    assert not [c for c in runs.runs.columns if c.startswith("provenance")]
    # A W&B run's flat config keys.
    wandb = {"seed": 0, "provenance.commit": b, "provenance.dirty": True, "provenance.step": 0}
    one = from_records([("w", "https://example.invalid/w", wandb, _rows(0.1, 0.2), "finished")])
    assert (one.runs.loc[0, "commit"], one.runs.loc[0, "dirty"]) == (b, True)
    assert "provenance.commit" not in one.runs.columns
