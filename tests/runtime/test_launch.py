"""runtime/launch.py on real parts: the rendezvous store (a real ``TCPStore`` on localhost, a
client in another thread), the SLURM task arithmetic, and what the supervisor does when a rank
raises: the rank's traceback in train.log, one line per failed rank in the supervisor's log,
one ``RankFailed`` line that says how to go on, and no rank left running.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.runtime.launch import (
    LOADED_KEY,
    START_KEY,
    RankFailed,
    _store,
    free_port,
    join_job,
    local_rank,
    run_distributed,
    slurm_address,
    slurm_rank,
    spawn_local,
    task_address,
    task_rank,
)

DISTRIBUTED = [
    "runtime=distributed", "schedule=async", "schedule.gpus=null", "schedule.workers=1",
    "schedule.trainers=1", "buffer.shards=1", "schedule.max_steps=2",
]  # fmt: skip
SLURM_VARS = ("SLURM_NTASKS", "SLURM_PROCID", "SLURM_JOB_ID", "SLURM_STEP_NODELIST",
              "SLURM_JOB_NODELIST", "SLURM_LOCALID")  # fmt: skip
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")


@pytest.fixture
def no_slurm(monkeypatch):
    """No launcher's variables: neither SLURM's nor torchrun's."""
    for var in (*SLURM_VARS, *TORCHRUN_VARS):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_the_rendezvous_store_hands_over_the_start_and_the_loaded_policy():
    """Rank 0 hosts the store and sets the start; another rank connects, reads it and waits
    until rank 0 says the policy is built (run_rank's handshake)."""
    port = free_port()
    master = _store("127.0.0.1", port, True, 10)  # wait_for_workers=False: returns at once
    master.set(START_KEY, json.dumps({"snapshot": "/runs/a/checkpoints/step_4"}))
    seen = {}

    def rank1():
        client = _store("127.0.0.1", port, False, 10)
        seen["start"] = json.loads(client.get(START_KEY))
        t0 = time.monotonic()
        client.wait([LOADED_KEY], timedelta(seconds=10))
        seen["waited"] = time.monotonic() - t0
        client.add("ranks_ready", 1)

    thread = threading.Thread(target=rank1, daemon=True)
    thread.start()
    time.sleep(0.5)  # rank 0 builds its policy meanwhile
    assert "waited" not in seen
    master.set(LOADED_KEY, "1")
    thread.join(10)
    assert seen["start"] == {"snapshot": "/runs/a/checkpoints/step_4"}
    assert seen["waited"] >= 0.3 and master.add("ranks_ready", 0) == 1


def test_rendezvous_timeouts_fail_loudly():
    """A key that never comes and a store nobody hosts both fail after the timeout
    (runtime.rendezvous_timeout_s), never hang."""
    port = free_port()
    master = _store("127.0.0.1", port, True, 10)
    client = _store("127.0.0.1", port, False, 10)
    t0 = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="wait timeout"):
        client.wait([LOADED_KEY], timedelta(seconds=1))
    assert time.monotonic() - t0 < 8
    del master
    t0 = time.monotonic()
    with pytest.raises(dist.DistNetworkError, match="timed out"):
        _store("127.0.0.1", free_port(), False, 1)
    assert time.monotonic() - t0 < 8


def test_slurm_task_arithmetic(no_slurm):
    assert slurm_rank() is None  # not under SLURM
    no_slurm.setenv("SLURM_NTASKS", "1")
    no_slurm.setenv("SLURM_PROCID", "0")
    assert slurm_rank() is None  # one task: not a distributed job step
    no_slurm.setenv("SLURM_NTASKS", "3")
    no_slurm.setenv("SLURM_PROCID", "2")
    assert slurm_rank() == (2, 3)
    no_slurm.setenv("SLURM_JOB_ID", "123456")
    assert slurm_address() == ("127.0.0.1", 20000 + 123456 % 20000)  # no node list: this host


def test_torchrun_rank_arithmetic(no_slurm):
    env = {"RANK": "2", "WORLD_SIZE": "3", "MASTER_ADDR": "host-b", "MASTER_PORT": "29511"}
    for k, v in env.items():
        assert task_rank() is None  # until every one of the four is set
        no_slurm.setenv(k, v)
    assert task_rank() == (2, 3) and task_address() == ("host-b", 29511)
    assert local_rank(2) == 2  # no LOCAL_RANK: the rank
    no_slurm.setenv("LOCAL_RANK", "0")
    assert local_rank(2) == 0
    no_slurm.setenv("WORLD_SIZE", "1")
    assert task_rank() is None  # a world of one: this process spawns the ranks
    # SLURM's variables win: a step of 2 tasks, this one task 1, its store from the job id.
    no_slurm.setenv("WORLD_SIZE", "3")
    no_slurm.setenv("SLURM_NTASKS", "2")
    no_slurm.setenv("SLURM_PROCID", "1")
    no_slurm.setenv("SLURM_JOB_ID", "7")
    no_slurm.setenv("SLURM_LOCALID", "1")
    assert task_rank() == (1, 2) and task_address() == ("127.0.0.1", 20007)
    assert local_rank(1) == 1


def test_a_torchrun_world_of_the_wrong_size_is_refused(no_slurm, tmp_path, fast):
    cfg, d = resolve(compose([*fast, *DISTRIBUTED]))
    for k, v in {"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29511"}.items():  # fmt: skip
        no_slurm.setenv(k, v)
    with pytest.raises(RuntimeError, match=r"needs W \+ T = 2 ranks \(WORLD_SIZE\), the job has "
                       r"3 \(start WORLD_SIZE=2\)"):  # fmt: skip
        run_distributed(cfg, d, tmp_path, None)


def test_a_slurm_job_of_the_wrong_size_is_refused(no_slurm, tmp_path, fast):
    cfg, d = resolve(compose([*fast, *DISTRIBUTED]))
    no_slurm.setenv("SLURM_NTASKS", "3")
    no_slurm.setenv("SLURM_PROCID", "0")
    with pytest.raises(RuntimeError, match=r"needs W \+ T = 2 SLURM tasks, the job has 3 \(set "
                       r"hydra.launcher.tasks_per_node=2\)"):  # fmt: skip
        run_distributed(cfg, d, tmp_path, None)


def test_a_slurm_task_of_a_finished_run_does_nothing(no_slurm, tmp_path, fast):
    cfg, d = resolve(compose([*fast, *DISTRIBUTED]))
    (tmp_path / "summary.json").write_text(json.dumps({"status": "finished"}))
    no_slurm.setenv("SLURM_NTASKS", "2")
    no_slurm.setenv("SLURM_PROCID", "1")
    assert join_job(cfg, d, tmp_path) is None  # task 0 reports it; no store is joined


@pytest.mark.slow
def test_a_failing_rank_is_reported_and_every_rank_stopped(no_slurm, tmp_path, fast, caplog):
    """Trainer rank 0 raises while loading its policy (the model folder is missing); the
    generator waits for it meanwhile. The supervisor reports and stops everything."""
    cfg, d = resolve(compose([*fast, *DISTRIBUTED]))
    cfg.model.pretrained = str(tmp_path / "no-such-model")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with caplog.at_level(logging.INFO, logger="replay_exp"), pytest.raises(RankFailed) as err:
        spawn_local(cfg, d, run_dir, None)
    # One line that says which rank and how to go on.
    assert str(err.value) == (
        "trainer 0 (rank 0) exited with code 3; relaunch to resume from the newest snapshot"
    )
    # The supervisor's line per failed rank, with its pid.
    pids = [int(p) for p in re.search(r"pids \[(\d+), (\d+)\]", caplog.text).groups()]
    assert f"rank 0 (trainer 0, pid {pids[0]}) exited with code 3" in caplog.text
    # The rank's own report: its message and traceback in the run's train.log.
    log = (run_dir / "train.log").read_text()
    assert re.search(r"rank0 replay_exp rank 0 failed: .*no-such-model", log), log[-2000:]
    assert "Traceback (most recent call last)" in log
    # No rank outlives the supervisor (the generator was waiting for the policy).
    deadline = time.monotonic() + 30
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _alive(p)]
        time.sleep(0.1)
    assert pids == [], f"ranks still running: {pids}"


def _alive(pid: int) -> bool:
    """Running (a zombie has exited: its parent has yet to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
