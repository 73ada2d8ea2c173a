"""Runs logged to W&B, as the same records the run-directory loader builds.

- Online: ``load_runs(["wandb:entity/project"])`` (or :func:`wandb_records`) reads every run of a
  project through W&B's public API (``wandb.Api().runs``): the flat dotted config the trainer
  sent (``buffer.capacity``), and the full history (``scan_history``). Needs network and a key.
- Offline: :func:`read_offline_run` reads a ``run-<id>.wandb`` transaction log written with
  ``logger.wandb.mode=offline`` directly, without syncing it (``wandb_offline_records``).

History rows become metrics.jsonl rows: ``_step`` -> ``step``; W&B's own keys (``_runtime``,
``_timestamp``, ...) and histogram values are dropped.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

Record = tuple[str, str, dict[str, Any], list[dict[str, Any]], str]


def _metrics_row(row: dict[str, Any]) -> dict[str, Any] | None:
    if "_step" not in row:
        return None
    out: dict[str, Any] = {"step": int(row["_step"])}
    for k, v in row.items():
        if k.startswith("_") or isinstance(v, dict | list):
            continue
        out[k] = math.nan if v is None else v
    return out if len(out) > 1 else None


def wandb_records(project: str, filters: dict | None = None, api: Any = None) -> list[Record]:
    """``(run id, url, flat config, rows, status)`` for every run of ``entity/project``."""
    if api is None:
        import wandb

        api = wandb.Api()
    records = []
    for run in api.runs(project, filters=filters):
        config = {k: v for k, v in dict(run.config).items() if not k.startswith("_")}
        rows = [r for r in map(_metrics_row, run.scan_history()) if r is not None]
        status = "finished" if run.state == "finished" else "unfinished" if rows else "empty"
        name = f"{run.group}/{run.name}" if run.group else run.name
        records.append((name, run.url, config, rows, status))
    return records


def log_records(path: Path) -> Iterator[Any]:
    """The protobuf records of a ``run-<id>.wandb`` transaction log: a 7-byte file header
    (':W&B', magic, version), then LevelDB-log style chunks (crc32, length, type) in 32 KiB
    blocks; FULL=1 or FIRST=2, MIDDLE=3, LAST=4 pieces of one record."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, pieces = path.read_bytes(), 32768, 7, b""
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B transaction log")
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


def read_offline_run(wandb_file: str | Path) -> tuple[dict[int, dict], dict, dict]:
    """(history rows by step, config, summary) of an offline ``run-<id>.wandb`` file."""
    history: dict[int, dict] = {}
    config: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    for r in log_records(Path(wandb_file)):
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


def wandb_offline_records(root: str | Path) -> list[Record]:
    """Records of every offline W&B run under ``root`` (``**/wandb/offline-run-*/run-*.wandb``);
    a run's id is the directory holding its ``wandb/`` folder, relative to ``root``."""
    root = Path(root)
    records = []
    for f in sorted(root.glob("**/wandb/offline-run-*/run-*.wandb")):
        history, config, summary = read_offline_run(f)
        config = {k: v for k, v in config.items() if not k.startswith("_")}
        rows = [r for r in (_metrics_row(history[s]) for s in sorted(history)) if r is not None]
        status = "finished" if summary.get("status") == "finished" else "unfinished"
        run_dir = f.parent.parent.parent
        run_id = str(run_dir.relative_to(root)) if run_dir != root else run_dir.name
        records.append((run_id, str(run_dir), config, rows, status if rows else "empty"))
    return records
