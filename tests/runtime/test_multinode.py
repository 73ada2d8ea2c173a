"""runtime=distributed across two hosts: the emulated hosts of scripts/two_hosts.sh (two
network namespaces with their own hostnames and addresses on a veth pair; the filesystem is
shared, as on a cluster), each rank started by hand under torchrun's contract (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT), as a launcher on a real cluster starts them.

What is checked: the harness itself; a lockstep run (``runtime.lockstep=true``) across hosts
writes the same metrics as on one host, bit for bit, for W = 1 generator on host A and T = 1
trainer on host B, and for a trainer group split over both hosts (T = 2); a free-running run
across hosts keeps the runtime's contract (every rollout accounted for, bitwise replicas)
and, killed whole, resumes; a generator host that goes away (its link cut) is reported in one
line and the job stops with a snapshot it resumes from; a trainer host that goes away ends
the job, and the relaunch resumes bit for bit; a host whose name resolves to no address is
refused in one line before the rendezvous (gloo would bind the loopback and hang its peers).

And SLURM over the two hosts (scripts/slurm_two_hosts.sh: slurmctld on host b, a slurmd on
each): ``sinfo`` shows two nodes; a ``launcher=slurm`` distributed job with one task per node
(trainer on one, generator on the other) equals the one-host run, bit for bit, under lockstep;
a multirun's jobs run on both nodes.

Needs root and ``ip netns`` (skipped otherwise, with the reason), and for the SLURM ones
slurm-wlm and munge (scripts/slurm_up.sh installs them); marked ``multinode``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_distributed import _check_finished, _snapshots

from replay_exp.rollout.synthetic import without_wall_clock
from replay_exp.runlog import read_metrics

HARNESS = Path(__file__).resolve().parents[2] / "scripts" / "two_hosts.sh"
SLURM_TWO = HARNESS.parent / "slurm_two_hosts.sh"
# Names of this session's own: two test sessions at once (CI in a clean clone beside a local
# run) must not share namespaces or addresses.
TAG = os.getpid() % 10000
ENV = {**os.environ, "TWO_HOSTS_PREFIX": f"rx{TAG}-", "TWO_HOSTS_NET": f"10.231.{TAG % 250}",
       "HYDRA_FULL_ERROR": "0"}  # fmt: skip

pytestmark = [pytest.mark.multinode, pytest.mark.slow]

STEPS = 12


def _harness(*args, check=True) -> subprocess.CompletedProcess:
    return subprocess.run([str(HARNESS), *args], env=ENV, capture_output=True, text=True,
                          check=check, timeout=60)  # fmt: skip


@pytest.fixture(scope="module")
def hosts():
    why = _harness("check", check=False)
    if why.returncode != 0:
        pytest.skip(f"two emulated hosts cannot be made here: {why.stdout.strip()}")
    _harness("up")
    yield {h: _harness("addr", h).stdout.strip() for h in "ab"}
    _harness("down")


_ports = iter(range(29511, 29611))


def _command(fast, run_dir, trainers: int, *extra) -> list[str]:
    return [
        sys.executable, "-m", "replay_exp.train", *fast, f"run_dir={run_dir}",
        "runtime=distributed", "schedule=async", "schedule.gpus=null", "schedule.workers=1",
        f"schedule.trainers={trainers}", f"buffer.shards={trainers}",
        f"schedule.max_steps={STEPS}", "eval.every=4", "checkpoint.every=4", "threads=1",
        "logger.log_every=1", *extra,
    ]  # fmt: skip


# Lockstep: each step trains on exactly its own B rollouts (R = B), each used once.
LOCKSTEP = ["runtime.lockstep=true", "buffer=on_policy"]


class Job:
    """The ranks of one job, each started on its host: ``placement[r]`` is rank r's host
    (ranks 0..T-1 train, T.. generate); rank 0's host holds the store."""

    def __init__(self, cmd, placement: str, cwd: Path, name: str):
        self.port = next(_ports)
        self.procs, self.logs = [], []
        world = len(placement)
        for rank, host in enumerate(placement):
            env = [f"RANK={rank}", f"WORLD_SIZE={world}", f"MASTER_ADDR=host-{placement[0]}",
                   f"MASTER_PORT={self.port}"]  # fmt: skip
            log = cwd / f"{name}.rank{rank}.log"
            self.logs.append(log)
            with open(log, "w") as out:
                self.procs.append(subprocess.Popen(
                    [str(HARNESS), "exec", host, "env", *env, *cmd], cwd=cwd, env=ENV,
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                ))  # fmt: skip
            if rank == 0:
                time.sleep(1.0)  # rank 0 takes the run's lock first

    def wait(self, timeout: float = 300) -> list[int]:
        deadline = time.monotonic() + timeout
        try:
            return [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in self.procs]
        finally:
            self.kill()

    def kill(self, ranks=None) -> None:
        for r, p in enumerate(self.procs):
            if (ranks is None or r in ranks) and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def text(self, rank: int) -> str:
        return self.logs[rank].read_text()


def _wait_for(pred, job: Job, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert job.procs[0].poll() is None, f"rank 0 ended before {what}: {job.text(0)[-2000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.05)


def _metrics(run_dir) -> list[dict]:
    return without_wall_clock(read_metrics(run_dir / "metrics.jsonl"))


def test_the_harness_makes_two_hosts_and_cuts_a_link(hosts, tmp_path):
    assert _harness("exec", "a", "hostname").stdout.strip() == "host-a"
    assert _harness("exec", "b", "hostname").stdout.strip() == "host-b"
    # Host a reaches a listener on host b by name, over the veth pair; with a's link down it
    # cannot, and with it up again it can.
    listen = ("import socket, sys; s = socket.socket(); s.bind(('0.0.0.0', 29999)); "
              "s.listen(); c, peer = s.accept(); print(peer[0], c.recv(5).decode())")  # fmt: skip
    send = ("import socket, sys; s = socket.create_connection(('host-b', 29999), timeout=3); "
            "s.send(b'hello')")  # fmt: skip
    server = subprocess.Popen([str(HARNESS), "exec", "b", sys.executable, "-c", listen],
                              env=ENV, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        time.sleep(1.0)
        _harness("link", "a", "down")
        cut = _harness("exec", "a", sys.executable, "-c", send, check=False)
        assert cut.returncode != 0  # no route while the link is down
        _harness("link", "a", "up")
        time.sleep(0.5)
        _harness("exec", "a", sys.executable, "-c", send)
        out, _ = server.communicate(timeout=10)
        assert out.split() == [hosts["a"], "hello"]
    finally:
        server.kill()


@pytest.mark.parametrize(("trainers", "placement"), [(1, "ba"), (2, "baa")],
                         ids=["W1-on-a_T1-on-b", "T2-split-over-a-and-b"])  # fmt: skip
def test_a_lockstep_run_across_hosts_equals_the_one_host_run(hosts, fast, tmp_path, trainers,
                                                             placement):  # fmt: skip
    one, two = tmp_path / "one_host", tmp_path / "two_hosts"
    local = subprocess.run(_command(fast, one, trainers, *LOCKSTEP), cwd=tmp_path, env=ENV,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert local.returncode == 0, local.stderr[-3000:]
    job = Job(_command(fast, two, trainers, *LOCKSTEP), placement, tmp_path, "two")
    assert job.wait() == [0] * len(placement), job.text(0)[-3000:]
    _check_finished(two, trainers, steps=STEPS, first_order_reuse=1.0)  # lockstep: y = 1
    summary = json.loads((two / "summary.json").read_text())
    assert summary["runtime"]["off_policiness_hist"][0] == summary["runtime"]["samples_trained"]
    assert _metrics(two) == _metrics(one)  # bit for bit, every row
    # The ranks really were on their hosts (their log lines name them).
    log = (two / "train.log").read_text()
    assert f"rank{trainers} " in log and "generator 0 done" in log


def test_a_free_run_across_hosts_keeps_the_contract_and_resumes_after_a_kill(hosts, fast,
                                                                            tmp_path):  # fmt: skip
    run_dir = tmp_path / "run"
    cmd = _command(fast, run_dir, 2, f"schedule.max_steps={2 * STEPS}")
    job = Job(cmd, "baa", tmp_path, "first")
    _wait_for(lambda: any(s >= 8 for s in _snapshots(run_dir)), job, "a snapshot past 4")
    job.kill()
    assert not (run_dir / "summary.json").exists(), "finished before it was killed"
    again = Job(cmd, "baa", tmp_path, "again")
    assert again.wait() == [0, 0, 0], again.text(0)[-3000:]
    # every rollout accounted for, replicas equal after every step, no row lost or doubled
    _check_finished(run_dir, 2, steps=2 * STEPS)
    assert "resuming from" in (run_dir / "train.log").read_text()


def test_a_lost_generator_host_stops_the_job_with_a_snapshot(hosts, fast, tmp_path):
    run_dir = tmp_path / "run"
    # Each rollout used at most twice: without its generator the trainer runs dry and waits.
    cmd = _command(fast, run_dir, 1, "runtime.heartbeat_timeout_s=3", "buffer.max_reuse=2",
                   f"schedule.max_steps={4 * STEPS}")  # fmt: skip
    job = Job(cmd, "ba", tmp_path, "first")
    try:
        _wait_for(lambda: any(s >= 4 for s in _snapshots(run_dir)), job, "a snapshot past 0")
        _harness("link", "a", "down")  # host a (the generator) is gone from the network
        assert job.procs[0].wait(timeout=120) != 0
    finally:
        _harness("link", "a", "up")
        job.kill()
    log = (run_dir / "train.log").read_text()
    assert "generator died: rank 1 (generator 0); snapshot at step" in log
    assert "runtime error:" in job.text(0)
    stopped = max(_snapshots(run_dir))
    assert stopped < 4 * STEPS
    again = Job(cmd, "ba", tmp_path, "again")
    assert again.wait() == [0, 0], again.text(0)[-3000:]
    _check_finished(run_dir, 1, steps=4 * STEPS)


def test_a_lost_trainer_host_ends_the_job_and_the_relaunch_resumes_bitwise(hosts, fast,
                                                                          tmp_path):  # fmt: skip
    full, run_dir = tmp_path / "full", tmp_path / "run"
    ref = Job(_command(fast, full, 2, *LOCKSTEP), "bab", tmp_path, "full")
    assert ref.wait() == [0, 0, 0], ref.text(0)[-3000:]
    cmd = _command(fast, run_dir, 2, *LOCKSTEP, "runtime.rendezvous_timeout_s=20")
    job = Job(cmd, "bab", tmp_path, "first")  # trainers 0 and generator on b, trainer 1 on a
    _wait_for(lambda: any(s >= 4 for s in _snapshots(run_dir)), job, "a snapshot past 0")
    job.kill(ranks={0, 2})  # host b's processes die at once
    codes = job.wait(timeout=120)  # trainer 1 on host a cannot go on either
    assert codes[1] != 0
    assert not (run_dir / "summary.json").exists()
    again = Job(cmd, "bab", tmp_path, "again")
    assert again.wait() == [0, 0, 0], again.text(0)[-3000:]
    assert _metrics(run_dir) == _metrics(full)  # resumed bit for bit, no row lost or doubled


def test_a_host_whose_name_resolves_to_nothing_is_refused_in_one_line(hosts, fast, tmp_path):
    # ip netns exec without the harness's hostname: this machine's own name, which the
    # namespace's hosts file does not know; gloo would fall back to the loopback.
    prefix = ENV["TWO_HOSTS_PREFIX"]
    env = ["env", "RANK=0", "WORLD_SIZE=2", f"MASTER_ADDR={hosts['b']}", "MASTER_PORT=29610"]
    t0 = time.monotonic()
    proc = subprocess.run(["ip", "netns", "exec", f"{prefix}b", *env,
                           *_command(fast, tmp_path / "run", 1)], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1
    line = [x for x in proc.stderr.splitlines() if x.startswith("runtime error:")]
    assert len(line) == 1 and "set GLOO_SOCKET_IFNAME" in line[0], proc.stderr[-2000:]
    assert f"this host's name {socket.gethostname()!r} resolves to no address" in line[0]
    assert time.monotonic() - t0 < 60  # before any rendezvous timeout


# --- SLURM over the two hosts -------------------------------------------------------------


def _slurm(*args, check=True, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([str(SLURM_TWO), *args], env=ENV, capture_output=True, text=True,
                          check=check, timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def slurm_two(hosts):
    missing = [b for b in ("slurmctld", "slurmd", "sinfo", "munged")
               if not any(Path(d, b).exists() for d in ("/usr/sbin", "/usr/bin"))]  # fmt: skip
    if missing:
        pytest.skip(f"no {', '.join(missing)} (scripts/slurm_up.sh installs slurm-wlm, munge)")
    up = _slurm("up", check=False)
    assert up.returncode == 0, up.stderr[-3000:]
    yield
    _slurm("down", check=False)


def _sweep(fast, tmp_path, *extra) -> list[str]:
    return [
        sys.executable, "-m", "replay_exp.train", "-m", "launcher=slurm",
        "hydra.launcher.partition=two", "hydra.launcher.timeout_min=10",
        "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1", *fast,
        f"output_root={tmp_path / 'out'}", "run_dir=${output_root}/job_${seed}", *extra,
    ]  # fmt: skip


def _task_hosts(tmp_path) -> list[str]:
    """The host each task of each job started on (submitit's log of every task)."""
    logs = sorted((tmp_path / "out" / ".submitit").glob("*/*/*_log.out"))
    return [re.search(r"hostname=(host-[ab])", p.read_text()).group(1) for p in logs]


def test_sinfo_shows_two_nodes_and_a_step_spans_them(slurm_two):
    nodes = _slurm("exec", "b", "sinfo", "-h", "-N", "-o", "%N %T").stdout.split("\n")
    assert sorted(x.split()[0] for x in nodes if x) == ["host-a", "host-b"]
    ran = _slurm("exec", "b", "srun", "-N2", "-n2", "hostname").stdout.split()
    assert sorted(ran) == ["host-a", "host-b"]


def test_a_distributed_slurm_job_over_two_nodes_equals_the_one_host_run(slurm_two, fast,
                                                                       tmp_path):  # fmt: skip
    run = ["runtime=distributed", "schedule=async", "schedule.gpus=null", "schedule.workers=1",
           "schedule.trainers=1", f"schedule.max_steps={STEPS}", "eval.every=4",
           "checkpoint.every=4", "logger.log_every=1", *LOCKSTEP, "seed=0"]  # fmt: skip
    one = tmp_path / "one_host"
    local = subprocess.run([sys.executable, "-m", "replay_exp.train", *fast, f"run_dir={one}",
                            *run], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert local.returncode == 0, local.stderr[-3000:]
    cmd = _sweep(fast, tmp_path, "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=1",
                 *run)  # fmt: skip
    proc = subprocess.run([str(SLURM_TWO), "exec", "b", *cmd], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=400)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(_task_hosts(tmp_path)) == ["host-a", "host-b"]  # one task on each node
    two = tmp_path / "out" / "job_0"
    _check_finished(two, 1, steps=STEPS, first_order_reuse=1.0)
    assert _metrics(two) == _metrics(one)


def test_a_multirun_spreads_over_both_nodes(slurm_two, fast, tmp_path):
    # One CPU a node and one a job: the two jobs run at once, one on each node.
    cmd = _sweep(fast, tmp_path, "schedule.max_steps=6", "eval.every=3", "seed=0,1")
    proc = subprocess.run([str(SLURM_TWO), "exec", "b", *cmd], cwd=tmp_path, env=ENV,
                          capture_output=True, text=True, timeout=400)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(_task_hosts(tmp_path)) == ["host-a", "host-b"]
    for seed in (0, 1):
        summary = json.loads((tmp_path / "out" / f"job_{seed}" / "summary.json").read_text())
        assert summary["status"] == "finished" and summary["steps"] == 6


def test_a_requeued_two_node_job_resumes_bitwise(slurm_two, fast, tmp_path):
    """``scontrol requeue`` of the running two-node job once it has a snapshot past step 10:
    SLURM kills both tasks and reruns the job on both nodes; it resumes from its newest
    snapshot and, under lockstep, ends with the uninterrupted one-host run's metrics."""
    steps = 800  # the kill (KillWait 5 s after SIGTERM) must land mid-run: ~30 ms a step
    run = ["runtime=distributed", "schedule=async", "schedule.gpus=null", "schedule.workers=1",
           "schedule.trainers=1", f"schedule.max_steps={steps}", "eval.every=200",
           "checkpoint.every=10", *LOCKSTEP, "seed=0"]  # fmt: skip
    one = tmp_path / "one_host"
    local = subprocess.run([sys.executable, "-m", "replay_exp.train", *fast, f"run_dir={one}",
                            *run], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert local.returncode == 0, local.stderr[-3000:]
    cmd = _sweep(fast, tmp_path, "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=1",
                 *run)  # fmt: skip
    run_dir = tmp_path / "out" / "job_0"
    with open(tmp_path / "sweep.log", "w") as out:
        sweep = subprocess.Popen([str(SLURM_TWO), "exec", "b", *cmd], cwd=tmp_path, env=ENV,
                                 stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    job_id = None
    try:
        deadline = time.monotonic() + 300
        while not any(s > 10 for s in _snapshots(run_dir)):
            assert sweep.poll() is None, (tmp_path / "sweep.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no snapshot past step 10 within 300 s"
            time.sleep(0.05)
        logs = sorted((tmp_path / "out" / ".submitit").glob("*/*/*_log.out"))
        job_id = logs[0].parent.name  # the submitit folder's %j: the SLURM job id
        _slurm("exec", "b", "scontrol", "requeue", job_id)
        assert sweep.wait(timeout=500) == 0, (tmp_path / "sweep.log").read_text()[-3000:]
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
            if job_id is not None:
                _slurm("exec", "b", "scancel", job_id, check=False)
    log = (run_dir / "train.log").read_text()
    assert re.search(r"resuming from \S+step_\d+ \(step \d+\)", log), log[-3000:]
    assert _metrics(run_dir) == _metrics(one)  # every step once, bit for bit
