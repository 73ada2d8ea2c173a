"""Sweep progress: a Hydra callback that prints queued / running / done counts, and
``python -m replay_exp.config.sweep <sweep_dir>`` to count a sweep's runs by state at any time.

The callback is registered in conf/train.yaml (``hydra.callbacks``). The launcher process
counts the jobs when the multirun starts and passes the total to the jobs through the
environment (local subprocesses and SLURM jobs inherit it), so each job prints where it stands.
With the sequential basic launcher the counts are exact; with parallel launchers each line
says which job started or ended, and the status command gives the whole picture.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

_TOTAL = "REPLAY_EXP_SWEEP_TOTAL"


def count_jobs(config: DictConfig) -> int:
    """Jobs of a basic-sweeper multirun: the product of the numbers of choices of the
    command-line sweep overrides and of ``hydra.sweeper.params`` (command line wins)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = {str(k): str(v) for k, v in (config.hydra.sweeper.get("params") or {}).items()}
    lines = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
    choices: dict[str, int] = {}
    for override in OverridesParser.create().parse_overrides(lines):
        n = len(list(override.sweep_string_iterator())) if override.is_sweep_override() else 1
        choices[override.key_or_group] = n
    return math.prod(choices.values())


class SweepProgress(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        total = count_jobs(config)
        os.environ[_TOTAL] = str(total)
        print(f"[sweep] {total} runs queued", flush=True)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.mode is None or str(config.hydra.mode) != "RunMode.MULTIRUN":
            return
        total, num = os.environ.get(_TOTAL, "?"), config.hydra.job.num
        queued = int(total) - num - 1 if total.isdigit() else "?"
        print(
            f"[sweep] run {num + 1}/{total} running (done {num}, queued {queued}): "
            f"{config.hydra.job.override_dirname}",
            flush=True,
        )

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        if str(config.hydra.mode) != "RunMode.MULTIRUN":
            return
        status = getattr(getattr(job_return, "status", None), "name", "?")
        total = os.environ.get(_TOTAL, "?")
        print(f"[sweep] run {config.hydra.job.num + 1}/{total} ended: {status}", flush=True)


def sweep_status(sweep_dir: str | Path) -> dict[str, list[str]]:
    """Runs under ``sweep_dir`` by state: finished (summary.json says so), started (has
    metrics.jsonl but is not finished: running, or interrupted and resumable) and empty."""
    out: dict[str, list[str]] = {"finished": [], "started": [], "empty": []}
    for run in sorted(p for p in Path(sweep_dir).iterdir() if p.is_dir()):
        try:
            finished = json.loads((run / "summary.json").read_text()).get("status") == "finished"
        except (OSError, ValueError):
            finished = False
        state = (
            "finished" if finished else "started" if (run / "metrics.jsonl").exists() else "empty"
        )
        out[state].append(run.name)
    return out


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        sys.exit("usage: python -m replay_exp.config.sweep <sweep_dir>")
    status = sweep_status(args[0])
    print("  ".join(f"{k}: {len(v)}" for k, v in status.items()))
    for name in status["started"]:
        print(f"started, not finished: {name}")


if __name__ == "__main__":
    main()
