"""logger=wandb: a 2-step run writes an offline W&B run holding the same metrics as
metrics.jsonl, the config as dotted keys and the buffer histograms; a failing W&B never stops
training."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from replay_exp.config import compose, resolve
from replay_exp.logging import read_metrics, wandb_run_id
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


def _records(path: Path):
    """The protobuf records of a ``run-<id>.wandb`` transaction log: a 7-byte file header
    (':W&B', magic, version), then LevelDB-log style chunks (crc32, length, type) in 32 KiB
    blocks; FULL=1 or FIRST=2, MIDDLE=3, LAST=4 pieces of one record."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, pieces = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pieces += data[pos + 7 : pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pieces)
            pieces = b""
            yield record


def _read_offline_run(run_dir: Path):
    """(history rows by step, config dict, summary dict) of the offline run in run_dir."""
    (wandb_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    history: dict[int, dict] = {}
    config, summary = {}, {}
    for r in _records(wandb_file):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            config.update({i.key: json.loads(i.value_json) for i in r.run.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in r.config.update})
        elif kind == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                   for i in r.history.item}  # fmt: skip
            history.setdefault(row["_step"], {}).update(row)
        elif kind == "summary":
            summary.update({i.key: json.loads(i.value_json) for i in r.summary.update if i.key})
    return history, config, summary


def test_wandb_offline_run_mirrors_metrics(fast, tmp_path, offline):
    run_dir = tmp_path / "run"
    summary = _run(fast, run_dir, "logger.wandb.tags=[test]")
    assert summary["status"] == "finished"
    (offline_dir,) = run_dir.glob("wandb/offline-run-*")
    assert offline_dir.name.endswith(wandb_run_id(run_dir))  # stable id: resume continues it

    rows = read_metrics(run_dir / "metrics.jsonl")  # still written, the source of truth
    assert [r["step"] for r in rows] == [0, 1, 2]
    history, config, wb_summary = _read_offline_run(run_dir)
    assert sorted(history) == [0, 1, 2]
    for row in rows:
        for key in ("eval/pass@1", "train/reward", "loss/loss", "compute/paper_units"):
            if row.get(key) is not None:
                assert history[row["step"]][key] == pytest.approx(row[key]), (row["step"], key)
    assert history[2]["eval/pass@1"] == pytest.approx(rows[2]["eval/pass@1"])
    # Buffer telemetry as W&B histograms (65 bins: 0..63 + overflow) at the step-2 eval.
    hist = history[2]["buffer_telemetry/age/values"]
    assert len(hist) == 65 and len(history[2]["buffer_telemetry/age/bins"]) == 66
    telemetry = json.loads((run_dir / "buffer_telemetry.json").read_text())
    assert hist == telemetry["age"]
    # Config as flat dotted keys, derived sizes included.
    assert config["buffer.capacity"] == 32 and config["logger.wandb.tags"] == ["test"]
    assert config["derived.capacity"] == 32 and config["derived.total_steps"] == 2
    assert wb_summary["status"] == "finished"


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
