"""Hydra multiruns through SLURM (``launcher=slurm``: hydra-submitit-launcher's submitit_slurm).

Needs a reachable SLURM cluster with a ``debug`` partition: ``scripts/slurm_up.sh`` starts a
single-node one on this machine (``.ci/run`` does). Without ``sbatch`` on PATH or an answering
``sinfo`` the tests skip, except under ``CI=true``, where they fail: CI must never skip them.

- A 2-job sweep finishes through sbatch: both run directories hold a finished summary.json and a
  complete metrics.jsonl, the jobs used ``$SLURM_CPUS_PER_TASK`` torch threads, and the submitit
  logs name their SLURM job ids.
- Preemption: ``scontrol requeue`` of a running job (what SLURM preemption with requeue does).
  Verified behaviour: SLURM sends SIGTERM, which submitit's job wrapper ignores ("Bypassing
  signal SIGTERM"), then SIGKILL after KillWait; the job returns to PENDING (held for
  ``AuthInfo=cred_expire`` seconds, 15 with scripts/slurm_up.sh, 120 by default), and SLURM
  reruns the same batch script under the same job id, which reloads the same pickled Hydra job
  from the submitit folder. The trainer finds its unfinished run_dir and resumes from the newest
  snapshot; the sweep's ``job.results()`` polling waits through the requeue and returns the
  second attempt's result. hydra-submitit-launcher itself does nothing here (its ``checkpoint``
  method only matters for submitit's USR2 timeout path, ``max_num_timeout``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replay_exp.runlog import read_metrics

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# Sweeps run with cwd=tmp_path: Hydra writes multirun.yaml into hydra.sweep.dir, which is ".".


@pytest.fixture(scope="module")
def _no_cluster_reason() -> str | None:
    """Why no SLURM cluster is usable here, or None (asked once: a dead sinfo takes ~10 s)."""
    if shutil.which("sbatch") is None:
        return "sbatch is not on PATH (start a local cluster with scripts/slurm_up.sh)"
    try:
        proc = subprocess.run(
            ["sinfo", "-h", "-o", "%P %T"], capture_output=True, text=True, timeout=15
        )
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 15 s"
    if proc.returncode != 0 or not proc.stdout.strip():
        return f"sinfo does not answer: {(proc.stderr or proc.stdout).strip()!r}"
    return None


# Idle cores the tests need at once (the W + T = 2 job); waited for up to _BUSY_WAIT_S.
_CORES_NEEDED, _BUSY_WAIT_S = 2, 90


@pytest.fixture(scope="module")
def _busy_reason(_no_cluster_reason) -> str | None:
    """Why the cluster cannot start the tests' jobs now (other jobs hold its cores), or None.
    Without this a queue full of someone's study jobs shows up as 400 s timeouts (it did once:
    a study sweep left running on the cluster CI then found and used)."""
    if _no_cluster_reason is not None:
        return None
    # Pending jobs that are not held would take the cores before the tests' jobs (older).
    pending = [
        line
        for line in subprocess.run(
            ["squeue", "-h", "-t", "PD", "-o", "%i %j %r"],
            capture_output=True,
            text=True,
            timeout=15,
        ).stdout.split("\n")
        if line and "JobHeld" not in line
    ]
    if pending:
        waiting = "; ".join(pending)
        return f"jobs wait in the queue ahead of the tests': {waiting} (scontrol hold ID)"
    deadline = time.monotonic() + _BUSY_WAIT_S
    while True:
        # %C: allocated/idle/other/total CPUs over the partition's nodes.
        cpus = subprocess.run(
            ["sinfo", "-h", "-p", "debug", "-o", "%C"], capture_output=True, text=True, timeout=15
        ).stdout.strip()
        idle = int(cpus.split("/")[1]) if cpus.count("/") == 3 else 0
        if idle >= _CORES_NEEDED or time.monotonic() > deadline:
            break
        time.sleep(5)
    if idle >= _CORES_NEEDED:
        return None
    jobs = subprocess.run(
        ["squeue", "-h", "-t", "R", "-o", "%i %j"], capture_output=True, text=True, timeout=15
    ).stdout.split("\n")
    return (
        f"partition debug has {idle} idle CPUs (allocated/idle/other/total {cpus}) after "
        f"{_BUSY_WAIT_S} s; the tests need {_CORES_NEEDED}. Running jobs: "
        f"{'; '.join(j for j in jobs if j) or 'none'} (suspend or cancel them: scontrol suspend ID)"
    )


@pytest.fixture(autouse=True)
def _slurm_cluster(_no_cluster_reason, _busy_reason):
    """Skip without a cluster or with its cores held by other jobs, or fail when CI=true (CI
    brings one up and must test it)."""
    for reason, what in ((_no_cluster_reason, "no SLURM cluster"), (_busy_reason, "busy")):
        if reason is not None:
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI=true but {what}: {reason}")
            pytest.skip(reason)


def _sweep(fast, tmp_path, *extra) -> list[str]:
    # run_dir named explicitly: stable across a requeue and short whatever the overrides are.
    return [
        sys.executable, "-m", "replay_exp.train", "-m", "launcher=slurm",
        "hydra.launcher.partition=debug", "hydra.launcher.timeout_min=10",
        "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1",
        *fast, f"output_root={tmp_path / 'out'}", "run_dir=${output_root}/job_${seed}", *extra,
    ]  # fmt: skip


def _env():
    return {**os.environ, "HYDRA_FULL_ERROR": "1"}


def _steps(run_dir: Path) -> list[int]:
    return [row["step"] for row in read_metrics(run_dir / "metrics.jsonl")]


def _finished(run_dir: Path) -> bool:
    path = run_dir / "summary.json"
    return path.exists() and json.loads(path.read_text()).get("status") == "finished"


def _submitit_logs(tmp_path) -> list[Path]:
    return sorted((tmp_path / "out" / ".submitit").glob("*/*/*_log.out"))


def test_sweep_through_slurm(fast, tmp_path):
    fast = [o for o in fast if not o.startswith("threads=")]  # threads=null: from SLURM
    cmd = _sweep(fast, tmp_path, "schedule.max_steps=2", "seed=0,1")
    proc = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, env=_env(), timeout=400
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for seed in (0, 1):
        run_dir = tmp_path / "out" / f"job_{seed}"
        assert _finished(run_dir), f"{run_dir} has no finished summary.json"
        assert _steps(run_dir) == [0, 1, 2]
        derived = (run_dir / "config.yaml").read_text()
        assert re.search(r"^  threads: 1$", derived, flags=re.M), "SLURM_CPUS_PER_TASK ignored"
    logs = _submitit_logs(tmp_path)
    assert len(logs) == 2, logs
    job_ids = set()
    for log in logs:
        found = re.search(r"job_id=(\d+_\d+|\d+)", log.read_text())
        assert found, f"no SLURM job id in {log}"
        job_ids.add(found.group(1))
    assert len(job_ids) == 2, job_ids
    # submitit returns once the result pickle exists; the job ends (COMPLETED) just after.
    deadline, states = time.monotonic() + 60, ""
    while states.count("COMPLETED") < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
        states = subprocess.run(
            ["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)],
            capture_output=True, text=True, timeout=30,
        ).stdout  # fmt: skip
    assert states.count("COMPLETED") == 2, states


def test_requeue_resumes_from_snapshot(fast, tmp_path):
    """``scontrol requeue`` of the running job, once it has a snapshot past step 2: SLURM kills
    it and reruns it (same job id, same pickled job); the run resumes from its newest snapshot
    and finishes with every step exactly once. (See the module docstring for the mechanism.)"""
    # Long enough that the kill (SIGKILL KillWait=5 s after the bypassed SIGTERM) lands mid-run:
    # at ~25 ms per step, 150 steps were once over before it landed (a flaky pass condition).
    steps = 600
    cmd = _sweep(fast, tmp_path, f"schedule.max_steps={steps}", "checkpoint.every=2", "seed=0")
    run_dir, job_id = tmp_path / "out" / "job_0", None
    with open(tmp_path / "sweep.log", "w") as out:
        sweep = subprocess.Popen(
            cmd, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, env=_env()
        )
    try:
        deadline = time.monotonic() + 300
        while not any(
            int(p.name.removeprefix("step_")) > 2 for p in (run_dir / "checkpoints").glob("step_*")
        ):
            assert sweep.poll() is None, (tmp_path / "sweep.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no snapshot past step 2 within 300 s"
            time.sleep(0.05)
        (log,) = _submitit_logs(tmp_path)
        job_id = log.parent.name  # the submitit folder's %j: the SLURM job id
        requeue = subprocess.run(
            ["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=30
        )
        assert requeue.returncode == 0, requeue.stderr
        assert sweep.wait(timeout=500) == 0, (tmp_path / "sweep.log").read_text()[-3000:]
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
            if job_id is not None:
                subprocess.run(["scancel", job_id], timeout=30)
    train_log = (run_dir / "train.log").read_text()
    assert re.search(r"resuming from \S+step_\d+ \(step \d+\)", train_log), train_log[-3000:]
    assert _finished(run_dir)
    assert _steps(run_dir) == list(range(steps + 1))  # complete, no duplicates
    assert "Bypassing signal SIGTERM" in log.read_text() + (log.with_suffix(".err")).read_text()


def test_distributed_run_is_one_slurm_job_with_w_plus_t_tasks(fast, tmp_path):
    """``runtime=distributed`` under ``launcher=slurm``: one job whose W + T = 2 tasks are the
    ranks (task 0 the trainer, task 1 the generator); it finishes with every rollout
    accounted for."""
    cmd = _sweep(
        fast, tmp_path, "hydra.launcher.tasks_per_node=2", "hydra.launcher.mem_gb=2",
        "runtime=distributed", "schedule=async", "schedule.gpus=null", "schedule.workers=1",
        "schedule.trainers=1", "schedule.max_steps=8", "seed=0",
    )  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, env=_env(), timeout=400
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = tmp_path / "out" / "job_0"
    assert _finished(run_dir)
    rt = json.loads((run_dir / "summary.json").read_text())["runtime"]
    assert rt["balanced"] and rt["generated"] == rt["received"] > 0
    log = (run_dir / "train.log").read_text()
    assert "rank0 " in log and "rank1 " in log  # both ranks ran, as tasks of one job
    logs = _submitit_logs(tmp_path)
    job_ids = {re.search(r"job_id=(\d+)", p.read_text()).group(1) for p in logs}
    assert len(job_ids) == 1, job_ids
