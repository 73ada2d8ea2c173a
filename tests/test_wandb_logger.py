"""logger=wandb: a 2-step run writes an offline W&B run holding the same metrics as
metrics.jsonl, the config as dotted keys (the code's provenance too) and the buffer histograms
(read back through W&B's own reader, ``wandb leet inspect --json``); the analysis reads such a
run from its metrics.jsonl and a W&B project through the public API; a failing W&B never stops
training."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replay_exp.analysis import from_records, load_runs
from replay_exp.analysis.wandb_runs import wandb_records
from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.runlog import read_metrics, read_provenance, wandb_run_id
from replay_exp.train import run

pytestmark = pytest.mark.slow


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """W&B offline, with every W&B folder under ``tmp_path`` (nothing in $HOME, no network)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        path = tmp_path / var.lower()
        path.mkdir()
        monkeypatch.setenv(var, str(path))


def _run(fast, run_dir, *extra):
    cfg, d = resolve(compose([*fast, "schedule.max_steps=2", "logger=wandb", *extra,
                              f"run_dir={run_dir}", "save_final_model=false"]))  # fmt: skip
    return run(cfg, d, run_dir)


def _inspect(offline_dir: Path) -> list[dict]:
    """The records of an offline run's transaction log through W&B's own reader, ``wandb leet
    inspect --json`` (one JSON record a line), once the log is complete: wandb-core writes it
    in its own process, and ``run.finish()`` may return before the last records reach the file
    (seen once under load: no history yet). Its last record is then "exit"."""
    cmd = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(offline_dir)]
    deadline = time.monotonic() + 30
    while True:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        records = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
        if (records and records[-1]["type"] == "exit") or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def _read_offline_run(offline_dir: Path) -> tuple[dict[int, dict], dict, dict]:
    """(history rows by step, config, summary) of an offline W&B run. The reader flattens a
    nested value with dots: a histogram ``h`` is ``h.bins`` and ``h.values``."""
    history: dict[int, dict] = {}
    config: dict = {}
    summary: dict = {}
    for r in _inspect(offline_dir):
        if r["type"] in ("run", "config"):
            node = r["run"]["config"] if r["type"] == "run" else r["config"]
            config.update(node.get("update", {}))
        elif r["type"] == "history":
            item = r["history"]["item"]
            history.setdefault(item["_step"], {}).update(item)
        elif r["type"] == "summary":
            summary.update(r["summary"].get("update", {}))
    return history, config, summary


def test_wandb_offline_run_mirrors_metrics(fast, tmp_path, offline):
    run_dir = tmp_path / "run"
    summary = _run(fast, run_dir, "logger.wandb.tags=[test]")
    assert summary["status"] == "finished"
    (offline_dir,) = run_dir.glob("wandb/offline-run-*")
    assert offline_dir.name.endswith(wandb_run_id(run_dir))  # stable id: resume continues it

    rows = read_metrics(run_dir / "metrics.jsonl")  # still written, the source of truth
    assert [r["step"] for r in rows] == [0, 1, 2]
    history, config, wb_summary = _read_offline_run(offline_dir)
    assert sorted(history) == [0, 1, 2]
    for row in rows:
        for key in ("eval/pass@1", "train/reward", "loss/loss", "compute/paper_units"):
            if row.get(key) is not None:
                assert history[row["step"]][key] == pytest.approx(row[key]), (row["step"], key)
    assert history[2]["eval/pass@1"] == pytest.approx(rows[2]["eval/pass@1"])
    # Buffer telemetry as W&B histograms (65 bins: 0..63 + overflow) at the step-2 eval.
    hist = history[2]["buffer_telemetry/age.values"]
    assert len(hist) == 65 and len(history[2]["buffer_telemetry/age.bins"]) == 66
    telemetry = json.loads((run_dir / "buffer_telemetry.json").read_text())
    assert hist == telemetry["age"]
    # Config as flat dotted keys, derived sizes included.
    assert config["buffer.capacity"] == 32 and config["logger.wandb.tags"] == ["test"]
    assert config["derived.capacity"] == 32 and config["derived.total_steps"] == 2
    assert wb_summary["status"] == "finished"
    # The code that made the run (config.yaml's record of this start), as flat keys too.
    (record,) = read_provenance(run_dir)
    assert config["provenance.commit"] == record["commit"]
    assert config["provenance.dirty"] == record["dirty"] and config["provenance.step"] == 0
    assert config["provenance.versions.torch"] == record["versions"]["torch"]
    assert wb_summary["provenance"] == [record]  # summary.json's list

    # The analysis reads the run from its metrics.jsonl: one run (the wandb/ folder inside is
    # not a run of its own), with its config.
    runs = load_runs(tmp_path)
    assert runs.runs["run"].tolist() == ["run"]
    assert runs.steps["step"].tolist() == [0, 1, 2]
    assert runs.steps["buffer.capacity"].tolist() == [32, 32, 32]


class _FakeApiRun:
    """The attributes of ``wandb.apis.public.Run`` that :func:`wandb_records` reads."""

    def __init__(self, config, history, state="finished"):
        self.config, self._history, self.state = config, history, state
        self.group, self.name, self.url = "sweep", "run-a", "https://example.invalid/run-a"

    def scan_history(self):
        return iter(self._history)


class _FakeApi:
    def __init__(self, runs):
        self._runs = runs

    def runs(self, path, filters=None):
        assert path == "me/replay-exp"
        return self._runs


def test_wandb_api_records_seam():
    """The online path (wandb.Api, unreachable here) through a stand-in API object: W&B's own
    keys and histograms are dropped, _step becomes step, config keys stay dotted."""
    history = [
        {"_step": 0, "_runtime": 1.0, "eval/pass@1": 0.25, "compute/paper_units": 0.0},
        {"_step": 1, "train/reward": 0.5, "buffer_telemetry/age": {"bins": [0, 1]}},
        {"_step": 2, "eval/pass@1": 0.5, "compute/paper_units": 2.0},
    ]
    api = _FakeApi([_FakeApiRun({"buffer.capacity": 64, "seed": 1, "_wandb": {}}, history)])
    (record,) = wandb_records("me/replay-exp", api=api)
    name, url, config, rows, status = record
    assert (
        name == "sweep/run-a"
        and status == "finished"
        and config
        == {
            "buffer.capacity": 64,
            "seed": 1,
        }
    )
    assert rows == [
        {"step": 0, "eval/pass@1": 0.25, "compute/paper_units": 0.0},
        {"step": 1, "train/reward": 0.5},
        {"step": 2, "eval/pass@1": 0.5, "compute/paper_units": 2.0},
    ]
    runs = from_records([record])
    assert runs.runs.loc[0, "peak"] == 0.5 and runs.runs.loc[0, "seed"] == 1


def test_failing_wandb_never_stops_training(fast, tmp_path, offline, monkeypatch, caplog):
    import wandb

    def broken_init(*args, **kwargs):
        raise RuntimeError("no W&B today\nsecond line")

    monkeypatch.setattr(wandb, "init", broken_init)
    run_dir = tmp_path / "run"
    with caplog.at_level("WARNING", logger="replay_exp"):
        summary = _run(fast, run_dir)
    assert summary["status"] == "finished"
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [0, 1, 2]
    warned = [r.getMessage() for r in caplog.records if "W&B" in r.getMessage()]
    assert len(warned) == 1 and "\n" not in warned[0], warned
    assert "RuntimeError: no W&B today second line" in warned[0]
    assert "W&B init failed" in (run_dir / "train.log").read_text()
    assert not (run_dir / "wandb").exists()
