"""The run directory: decide whether a launch starts fresh, resumes, or has nothing to do.

A relaunch of the same command in the same ``run_dir`` resumes from the newest good snapshot;
a finished run is skipped; a changed config is refused with one line (see ``prepare_run_dir``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from replay_exp.checkpoint import (
    CheckpointError,
    Snapshot,
    config_differences,
    format_value,
    has_snapshots,
    load_latest,
    metrics_steps,
)
from replay_exp.config import ConfigError, Derived

# Keys that may differ between a run and its resume: they change neither what is computed nor
# what is logged (threads and logger.log_every do, so they must match).
COSMETIC_KEYS = ("run_dir", "output_root", "logger.progress", "checkpoint.every", "checkpoint.keep")
# Taken from the machine when threads / device are left to auto: a change only warns.
MACHINE_KEYS = ("derived.threads", "derived.device")


@dataclasses.dataclass
class RunStart:
    """How a run uses its directory (``prepare_run_dir``): from scratch, from ``snapshot``, or
    not at all because it already finished (``finished`` is its summary)."""

    run_dir: Path
    snapshot: Snapshot | None = None
    finished: dict[str, Any] | None = None
    notes: list[str] = dataclasses.field(default_factory=list)  # one-line warnings to log


def prepare_run_dir(cfg: DictConfig, derived: Derived, run_dir: Path | None = None) -> RunStart:
    """Decide how this run uses ``run_dir`` (default ``cfg.run_dir``), reading only:

    - neither config.yaml, metrics.jsonl nor a snapshot: a fresh run;
    - summary.json says ``status: finished``: nothing to do (``finished``);
    - config.yaml differs from ``cfg`` outside ``COSMETIC_KEYS``: ConfigError naming the keys;
    - a good snapshot: resume from the newest; corrupt ones are skipped with a warning, and
      snapshots that are all bad raise CheckpointError naming the files;
    - no snapshot: a fresh run if metrics.jsonl holds nothing past the initial eval (the run
      died before its first snapshot), else ConfigError (results it cannot continue).
    """
    run_dir = Path(cfg.run_dir if run_dir is None else run_dir)
    start = RunStart(run_dir)
    cfg_path, metrics_path, ckpt_root = (
        run_dir / "config.yaml",
        run_dir / "metrics.jsonl",
        run_dir / "checkpoints",
    )
    if not (cfg_path.exists() or metrics_path.exists() or has_snapshots(ckpt_root)):
        return start
    here = OmegaConf.to_container(OmegaConf.create(config_yaml(cfg, derived)))
    there = _read_config(cfg_path)
    diffs = [] if there is None else config_differences(there, here, COSMETIC_KEYS + MACHINE_KEYS)
    summary = _finished_summary(run_dir / "summary.json")
    if summary is not None:
        start.finished = summary
        if diffs:
            start.notes.append(f"note: this config differs from the run's: {_describe(diffs)}")
        return start
    if there is None:
        raise ConfigError(
            f"run_dir={run_dir} already holds a run but no readable config.yaml to check a "
            "resume against; choose another run_dir"
        )
    if diffs:
        raise ConfigError(
            f"run_dir={run_dir} already holds a run with a different config: "
            f"{_describe(diffs)} (resuming needs the same config; or choose another run_dir)"
        )
    for key, was, now in config_differences(there, here):
        if key in MACHINE_KEYS:
            start.notes.append(
                f"{key} was {format_value(was)}, is {format_value(now)} now: the resumed part "
                "may differ in the last bits from an uninterrupted run"
            )
    snapshot = load_latest(ckpt_root)
    if snapshot is not None:
        if not metrics_path.exists():
            raise CheckpointError(f"{metrics_path} is missing, so {snapshot.path} cannot resume")
        start.snapshot = snapshot
        start.notes += [f"skipped snapshot: {why}" for why in snapshot.skipped]
        return start
    steps = metrics_steps(metrics_path)
    if any(step > 0 for step in steps):
        raise ConfigError(
            f"run_dir={run_dir} already holds a run (metrics.jsonl up to step {max(steps)}) "
            "but no snapshot to resume from; choose another run_dir"
        )
    return start


def config_yaml(cfg: DictConfig, derived: Derived) -> str:
    """config.yaml: the resolved config plus ``derived``."""
    saved = OmegaConf.to_container(cfg)
    saved["derived"] = dataclasses.asdict(derived)
    return OmegaConf.to_yaml(saved)


def _read_config(path: Path) -> dict | None:
    try:
        out = OmegaConf.to_container(OmegaConf.create(path.read_text()))
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return out if isinstance(out, dict) else None


def _finished_summary(path: Path) -> dict[str, Any] | None:
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and summary.get("status") == "finished" else None


def _describe(diffs: list[tuple[str, Any, Any]], limit: int = 8) -> str:
    parts = [f"{k}={format_value(a)} there, {format_value(b)} here" for k, a, b in diffs[:limit]]
    more = f"; and {len(diffs) - limit} more keys" if len(diffs) > limit else ""
    return "; ".join(parts) + more
