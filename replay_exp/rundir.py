"""The run directory: decide whether a launch starts fresh, resumes, or has nothing to do.

A relaunch of the same command in the same ``run_dir`` resumes from the newest good snapshot;
a finished run is skipped; a changed config is refused with one line (see ``prepare_run_dir``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from replay_exp.checkpoint import (
    RUN_LAYOUT,
    CheckpointError,
    Snapshot,
    atomic_write_text,
    config_differences,
    format_value,
    has_snapshots,
    load_latest,
    metrics_steps,
)
from replay_exp.config.derive import Derived
from replay_exp.config.errors import ConfigError
from replay_exp.runlog import code_provenance, read_provenance

# Keys that may differ between a run and its resume: they change neither what is computed nor
# what is logged (threads and logger.log_every do, so they must match).
COSMETIC_KEYS = ("run_dir", "output_root", "logger.progress", "checkpoint.every", "checkpoint.keep")
# Taken from the machine when threads / device are left to auto: a change only warns.
MACHINE_KEYS = ("derived.threads", "derived.device")
# What config.yaml records beside the config (record_provenance): never compared, so a resume
# with other code (a new commit, other package versions) is a resume, its own record added.
RECORD_KEYS = ("provenance",)


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
    - config.yaml differs from ``cfg`` outside ``COSMETIC_KEYS`` (its ``provenance`` records,
      :func:`record_provenance`, are not compared): ConfigError naming the keys;
    - a good snapshot: resume from the newest; corrupt ones are skipped with a warning, and
      snapshots that are all bad raise CheckpointError naming the files;
    - no snapshot: a fresh run if metrics.jsonl holds nothing past the initial eval (the run
      died before its first snapshot), else ConfigError (results it cannot continue);
    - a live process holds the directory (:class:`RunLock`): :class:`RunDirBusy`.
    """
    run_dir = Path(cfg.run_dir if run_dir is None else run_dir)
    start = RunStart(run_dir)
    owner = lock_holder(run_dir)
    if owner is not None:
        raise _busy(run_dir, owner)
    cfg_path, metrics_path, ckpt_root = (
        run_dir / "config.yaml",
        run_dir / "metrics.jsonl",
        run_dir / "checkpoints",
    )
    if not (cfg_path.exists() or metrics_path.exists() or has_snapshots(ckpt_root)):
        return start
    here = OmegaConf.to_container(OmegaConf.create(config_yaml(cfg, derived)))
    there = _read_config(cfg_path)
    ignored = COSMETIC_KEYS + MACHINE_KEYS + RECORD_KEYS
    diffs = [] if there is None else config_differences(there, here, ignored)
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
        if sorted(snapshot.states) != sorted(RUN_LAYOUT):  # before anything is cut back
            raise CheckpointError(
                f"{snapshot.path} holds components {sorted(snapshot.states)}, not this version's "
                f"{sorted(RUN_LAYOUT)}: it was written by another version of the trainer; "
                "resume it with that version, or choose another run_dir"
            )
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


def record_provenance(run_dir: Path, step: int) -> list[str]:
    """Add this start's (``step`` 0) or resume's (``step``: its snapshot's) record of the code
    (``runlog.code_provenance``: commit, dirty, package versions) to the ``provenance:`` list
    that ends ``run_dir/config.yaml``, rewritten atomically with its file time kept (the time a
    run started: ``replay_exp.analysis.archive``). Returns a one-line note when the code differs
    from the previous record's (a resume after a new commit, or of a dirty tree)."""
    path = run_dir / "config.yaml"
    text, stat = path.read_text(), path.stat()
    records = read_provenance(run_dir)
    this = {"step": step, "started": time.strftime("%Y-%m-%d %H:%M:%S"), **code_provenance()}
    head, sep, _ = text.rpartition("\nprovenance:\n")  # always the last key (written here)
    body = yaml.safe_dump({"provenance": [*records, this]}, sort_keys=False)
    atomic_write_text(path, (head if sep else text.rstrip("\n")) + "\n" + body)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    notes = [] if this["commit"] is not None else [f"{this['git']} (config.yaml: provenance)"]
    if records and _code(records[-1]) != _code(this):
        notes.append(
            f"this resume runs commit {_code(this)}, the run's previous part {_code(records[-1])}:"
            " its steps come from more than one version of the code (config.yaml: provenance)"
        )
    return notes


def _code(record: dict[str, Any]) -> str:
    commit = record.get("commit") or "unknown"
    return commit[:12] + (" (dirty)" if record.get("dirty") else "")


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


# ---------------------------------------------------------------------------------------------
# The run directory's lock: one live run writes into a directory at a time.
# ---------------------------------------------------------------------------------------------

LOCK_FILE = ".lock"


class RunDirBusy(ConfigError):
    """Another live process holds the run directory (one line, names it)."""


def process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (field 22 of /proc/<pid>/stat), so that a reused pid
    is not mistaken for the run that wrote a lock; None where /proc is not available."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _this_process() -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "start": process_start(os.getpid()),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def lock_holder(run_dir: Path, include_self: bool = False) -> dict[str, Any] | None:
    """Who holds ``run_dir`` (the lock file's record), or None: no lock, a stale one (its
    process is gone, or it is an earlier attempt of this same SLURM job, i.e. a requeue), or
    this process's own lock unless ``include_self``."""
    try:
        owner = json.loads((Path(run_dir) / LOCK_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(owner, dict):
        return None
    me = _this_process()
    if owner.get("pid") == me["pid"] and owner.get("host") == me["host"]:
        return owner if include_self else None  # this process's own lock
    if owner.get("slurm_job_id") and owner.get("slurm_job_id") == me["slurm_job_id"]:
        return None  # the same SLURM job, requeued: its earlier attempt is dead
    if owner.get("host") != me["host"]:
        return owner  # another machine: cannot tell, so it counts as held
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return None
    start = process_start(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's
    if start is None and Path("/proc").is_dir():
        return None  # gone between the two checks
    if owner.get("start") is not None and start is not None and start != owner["start"]:
        return None  # the pid was reused by another process
    if Path(f"/proc/{pid}/stat").is_file() and _zombie(pid):
        return None
    return owner


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _busy(run_dir: Path, owner: dict[str, Any]) -> RunDirBusy:
    lock = run_dir / LOCK_FILE
    if owner.get("host") != socket.gethostname():  # its process cannot be checked from here
        how = f"if that run is gone, delete {lock}"
    else:
        how = f"a lock left by a process that is gone is taken over: {lock}"
    return RunDirBusy(
        f"run_dir={run_dir} is in use by process {owner.get('pid')} on {owner.get('host')} "
        f"(since {owner.get('since')}); wait for it to end or choose another run_dir ({how})"
    )


class RunLock:
    """Exclusive use of a run directory while a run writes into it: ``run_dir/.lock`` records
    the owner (pid, host, process start time, SLURM job id). Created with O_EXCL; a lock whose
    owner is gone (or an earlier attempt of the same SLURM job) is taken over with a warning
    (``notes``); a live owner raises :class:`RunDirBusy`. Released (removed) on exit."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.notes: list[str] = []
        self.held = False

    def __enter__(self) -> RunLock:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        me = json.dumps(_this_process())
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            owner = lock_holder(self.run_dir, include_self=True)
            if owner is not None:
                raise _busy(self.run_dir, owner) from None
            stale = self.path.read_text(errors="replace").strip()
            atomic_write_text(self.path, me)
            self.notes.append(f"took over a stale lock of {self.run_dir}: {stale}")
        else:
            with os.fdopen(fd, "w") as f:
                f.write(me)
        if self.path.read_text() != me:  # another process took it over at the same moment
            raise _busy(self.run_dir, json.loads(self.path.read_text()))
        self.held = True
        return self

    def __exit__(self, *exc) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False
