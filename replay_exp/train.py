"""The one train entrypoint: GRPO with verifiable rewards through a replay buffer.

    python -m replay_exp.train [group=option ...] [key=value ...]   # or: replay-exp-train

``main`` resolves the config (a bad one fails here, in one line, before anything is built or
written), prepares the run directory (a fresh run, or the resume of the unfinished run there)
and runs the loop (``replay_exp.loop.train``) in the runtime the config names:
``runtime=inprocess`` (this process generates its rollouts) or ``runtime=distributed`` (W
generator and T trainer processes, each trainer running the same loop).
"""

from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path
from typing import Any

import hydra
import transformers
from omegaconf import DictConfig

from replay_exp.checkpoint import (
    CheckpointError,
    SnapshotWarning,
    atomic_write_text,
    truncate_metrics,
)
from replay_exp.config.composition import expand_model_shorthand
from replay_exp.config.derive import Derived, resolve
from replay_exp.config.errors import ConfigError, RunStopped
from replay_exp.config.schemas import register_configs
from replay_exp.loop import build_parts, train
from replay_exp.rundir import (
    RunDirBusy,
    RunLock,
    RunStart,
    config_yaml,
    prepare_run_dir,
    record_provenance,
)
from replay_exp.runlog import LOG_FILES, in_multirun
from replay_exp.runtime.inprocess import InProcess
from replay_exp.runtime.launch import RankFailed, join_job, run_distributed, task_rank
from replay_exp.runtime.process import set_up_process

log = logging.getLogger("replay_exp")
register_configs()


def run(
    cfg: DictConfig, derived: Derived, run_dir: Path, start: RunStart | None = None
) -> dict[str, Any]:
    """Train with the resolved ``cfg`` and write everything into ``run_dir``: a fresh run, or
    the resume of the unfinished run there (``prepare_run_dir`` decides, unless ``start`` is
    given); a finished run is left untouched and its summary returned."""
    run_dir = Path(run_dir)
    if start is None:
        start = prepare_run_dir(cfg, derived, run_dir)
    if start.finished is not None:
        return _already_finished(run_dir, start)
    with RunLock(run_dir) as lock:  # one live run per directory; released on exit
        start = prepare_run_dir(cfg, derived, run_dir)  # again, now that nobody else writes
        if start.finished is not None:
            return _already_finished(run_dir, start)
        return _run_locked(cfg, derived, run_dir, start, lock.notes)


def _already_finished(run_dir: Path, start: RunStart) -> dict[str, Any]:
    print(f"run already finished: {run_dir / 'summary.json'} says so; nothing to do")
    for note in start.notes:
        print(note)
    return start.finished


def _run_locked(
    cfg: DictConfig, derived: Derived, run_dir: Path, start: RunStart, notes: list[str]
) -> dict[str, Any]:
    set_up_process(derived.threads, cfg.deterministic)
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    file_log = logging.FileHandler(run_dir / "train.log")
    file_log.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    logging.getLogger().addHandler(file_log)
    log.info("run dir: %s", run_dir)
    for note in [*notes, *start.notes]:
        log.warning(note)
    if start.snapshot is None:
        for name in LOG_FILES:  # at most an initial eval: redone
            (run_dir / name).unlink(missing_ok=True)
        atomic_write_text(run_dir / "config.yaml", config_yaml(cfg, derived))
    else:
        dropped = truncate_metrics(run_dir / "metrics.jsonl", start.snapshot.step)
        if (run_dir / "eval_details.jsonl").is_file():
            truncate_metrics(run_dir / "eval_details.jsonl", start.snapshot.step)
        log.info(
            "resuming from %s (step %d); dropped %d metrics.jsonl lines past it",
            start.snapshot.path,
            start.snapshot.step,
            dropped,
        )
    # the code of this start or resume, added to config.yaml's provenance (summary.json, W&B)
    for note in record_provenance(run_dir, 0 if start.snapshot is None else start.snapshot.step):
        log.warning(note)
    log.info(
        "B=%d R=%.4g (y=B/R=%.3g) N=%d (x=N/R=%.3g) steps=%d",
        cfg.schedule.batch_size,
        derived.rollouts_per_step,
        derived.reuse_ratio,
        derived.capacity,
        derived.staleness_horizon,
        derived.total_steps,
    )
    try:
        if cfg.runtime.name == "distributed":  # W + T processes (replay_exp.runtime)
            return run_distributed(cfg, derived, run_dir, start.snapshot)
        parts = build_parts(cfg, derived, run_dir)
        runtime = InProcess(cfg, derived, run_dir, parts, start.snapshot)
        return train(cfg, derived, run_dir, parts, runtime)
    finally:
        logging.getLogger().removeHandler(file_log)
        file_log.close()


@hydra.main(config_path="../conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> dict[str, Any]:
    try:
        resolved, derived = resolve(cfg)
        if resolved.runtime.name == "distributed" and (task_rank() or (0,))[0] > 0:
            # A rank other than 0 the job started (SLURM, torchrun): rank 0 prepares run_dir.
            return join_job(resolved, derived, Path(resolved.run_dir))
        with warnings.catch_warnings():  # run() logs skipped snapshots; errors name them
            warnings.simplefilter("ignore", SnapshotWarning)
            start = prepare_run_dir(resolved, derived)
    except RunDirBusy as e:
        return _busy(e)
    except (ConfigError, CheckpointError) as e:  # one line, nothing written, no model built
        kind = "config error" if isinstance(e, ConfigError) else "resume error"
        print(f"{kind}: {e}", file=sys.stderr)
        sys.exit(2)
    except (RankFailed, RunStopped) as e:  # a rank other than 0: one line
        print(f"runtime error: {e}", file=sys.stderr)
        sys.exit(1)
    try:
        return run(resolved, derived, start.run_dir, start)
    except RunDirBusy as e:  # taken by another process between the check and the lock
        return _busy(e)
    except (RankFailed, RunStopped) as e:  # runtime=distributed: one line; a snapshot is on disk
        print(f"runtime error: {e}", file=sys.stderr)
        sys.exit(1)


def _busy(e: RunDirBusy) -> dict[str, Any]:
    """A run directory that a live process holds. A single run stops with the one-line config
    error (exit 2); a job of a multirun says so in one line and returns, so the sweep goes on to
    its next job: a sweep split over processes by overlapping lists leaves each run to the
    process that got it first (relaunch the sweep afterwards to resume any that stopped)."""
    if not in_multirun():
        print(f"config error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"skipped, another process runs it: {e}", file=sys.stderr)
    return {"status": "busy"}


def cli() -> None:
    """``python -m replay_exp.train`` / ``replay-exp-train``: :func:`main` after expanding the
    ``model=<dir or hub id>`` shorthand (``config.expand_model_shorthand``)."""
    try:
        sys.argv[1:] = expand_model_shorthand(sys.argv[1:])
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        sys.exit(2)
    main()


if __name__ == "__main__":
    cli()
