"""Run directories never collide: a unique default name per composed config, and a lock that
keeps a second live run out of a directory (a stale lock is taken over with a warning)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.rundir import LOCK_FILE, RunDirBusy, RunLock, lock_holder, process_start
from replay_exp.runlog import read_metrics
from replay_exp.train import run


def _finished(run_dir) -> bool:
    return json.loads((run_dir / "summary.json").read_text())["status"] == "finished"


@pytest.mark.slow
def test_two_runs_started_together_get_two_directories(fast, tmp_path):
    """Two commands launched in the same second with the default run_dir: two directories,
    each with one run's rows (the old per-second name made them share one)."""
    cmd = [sys.executable, "-m", "replay_exp.train", *fast, "schedule.max_steps=2",
           f"output_root={tmp_path / 'runs'}"]  # fmt: skip
    procs = [
        subprocess.Popen(
            [*cmd, f"seed={s}"],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for s in (0, 1)
    ]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()[-3000:]
    dirs = sorted((tmp_path / "runs").iterdir())
    assert len(dirs) == 2, dirs
    seeds = set()
    for d in dirs:
        assert _finished(d) and not (d / LOCK_FILE).exists()
        assert [r["step"] for r in read_metrics(d / "metrics.jsonl")] == [0, 1, 2]
        seeds.add(int(next(line for line in (d / "config.yaml").read_text().splitlines()
                           if line.startswith("seed:")).split()[1]))  # fmt: skip
    assert seeds == {0, 1}


def test_two_runs_in_one_process_get_two_directories(fast, tmp_path):
    """A notebook composing and running twice: two directories, both runs trained."""
    out = []
    for _ in range(2):
        cfg, derived = resolve(compose([*fast, "schedule.max_steps=1",
                                        f"output_root={tmp_path}"]))  # fmt: skip
        assert run(cfg, derived, cfg.run_dir)["status"] == "finished"
        out.append(cfg.run_dir)
    assert out[0] != out[1]
    assert all(_finished(tmp_path / p.split("/")[-1]) for p in out)


def test_a_live_lock_keeps_a_second_run_out(fast, tmp_path):
    run_dir = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run_dir.mkdir()
        owner = {"pid": holder.pid, "host": socket.gethostname(),
                 "start": process_start(holder.pid), "slurm_job_id": None,
                 "since": "earlier"}  # fmt: skip
        (run_dir / LOCK_FILE).write_text(json.dumps(owner))
        assert lock_holder(run_dir) == owner
        proc = subprocess.run(
            [sys.executable, "-m", "replay_exp.train", *fast, f"run_dir={run_dir}"],
            cwd=tmp_path, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines() == [
            f"config error: run_dir={run_dir} is in use by process {holder.pid} on "
            f"{owner['host']} (since earlier); wait for it to end or choose another run_dir "
            f"(a lock left by a process that is gone is taken over: {run_dir / LOCK_FILE})"
        ]
        assert sorted(p.name for p in run_dir.iterdir()) == [LOCK_FILE]  # nothing written
        with pytest.raises(RunDirBusy), RunLock(run_dir):
            pass
    finally:
        holder.kill()
        holder.wait()
    # Its holder gone, the lock is stale: the next run takes it over, says so, and releases it.
    assert lock_holder(run_dir) is None
    cfg, derived = resolve(compose([*fast, "schedule.max_steps=1", f"run_dir={run_dir}"]))
    assert run(cfg, derived, run_dir)["status"] == "finished"
    assert "took over a stale lock" in (run_dir / "train.log").read_text()
    assert not (run_dir / LOCK_FILE).exists()


def test_a_reused_pid_does_not_hold_the_lock(tmp_path):
    """A lock written by a process that is gone, whose pid now belongs to another process
    (here: this one, with a different recorded start time), is stale."""
    (tmp_path / LOCK_FILE).write_text(json.dumps(
        {"pid": os.getppid(), "host": socket.gethostname(), "start": "0", "slurm_job_id": None}
    ))  # fmt: skip
    assert lock_holder(tmp_path) is None


def test_the_same_slurm_job_takes_over_its_earlier_attempt(tmp_path, monkeypatch):
    """A requeued SLURM job reruns with the same job id: its earlier attempt's lock is stale,
    even when written on another node."""
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    (tmp_path / LOCK_FILE).write_text(json.dumps(
        {"pid": 1, "host": "another-node", "start": "1", "slurm_job_id": "4242"}
    ))  # fmt: skip
    assert lock_holder(tmp_path) is None
    monkeypatch.setenv("SLURM_JOB_ID", "4243")
    assert lock_holder(tmp_path)["host"] == "another-node"  # another job elsewhere: held
    with (
        pytest.raises(RunDirBusy, match=r"if that run is gone, delete .*\.lock"),
        RunLock(tmp_path),
    ):
        pass
