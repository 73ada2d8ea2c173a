"""Runs logged to W&B, as the same records the run-directory loader builds.

``load_runs(["wandb:entity/project"])`` (or :func:`wandb_records`) reads every run of a project
through W&B's public API (``wandb.Api().runs``): the flat dotted config the trainer sent
(``buffer.capacity``), and the full history (``scan_history``). Needs network and a key.
History rows become metrics.jsonl rows: ``_step`` -> ``step``; W&B's own keys (``_runtime``,
``_timestamp``, ...) and histogram values are dropped.

An offline run (``logger.wandb.mode=offline``) is read from its run directory instead: the
directory that holds ``wandb/offline-run-*/run-<id>.wandb`` also holds ``metrics.jsonl``, the
source of truth, which ``load_runs(run_dir)`` reads like any other run. Nothing here parses the
``.wandb`` transaction log (a private format); W&B's own reader shows it,
``wandb leet inspect --json <run_dir>/wandb/offline-run-*`` (one JSON record a line), and
``wandb sync`` uploads it, after which the online path reads it.
"""

from __future__ import annotations

import math
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
