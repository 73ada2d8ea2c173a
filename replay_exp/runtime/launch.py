"""Starting the W + T ranks: a local spawn, or one process per rank started by the job (the
tasks of a SLURM job step, or any launcher that sets torchrun's variables).

- Locally (``run_distributed`` called by the trainer's entrypoint, which holds the run's
  lock and has prepared ``run_dir``), this process hosts the rendezvous store, starts W + T
  processes (ranks 0..T-1 train, T..T+W-1 generate) and supervises them: a generator that
  exits early is reported in one line while the trainers save a snapshot and stop; a trainer
  that fails stops them all. The run resumes from its newest snapshot when relaunched.
- Under SLURM (``launcher=slurm hydra.launcher.tasks_per_node=<W+T>``), submitit runs the
  trainer's entrypoint once per task; task 0 takes the lock, prepares ``run_dir`` and hosts
  the store, every task is the rank given by ``SLURM_PROCID``; the store is on the first node
  of the step's node list, at a port from the job id.
- Started by hand or by another launcher, one process per rank on any hosts that share the
  run's filesystem: torchrun's contract, ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` (the host
  of rank 0, which hosts the store) and ``MASTER_PORT`` (``torchrun --nnodes 2 --node-rank i
  --nproc-per-node n --master-addr A --master-port P -m replay_exp.train ...`` sets them, as
  does ``scripts/two_hosts.sh`` for the emulated hosts of the multinode tests). Rank 0 plays
  task 0. SLURM's variables win when both are set.

Across hosts, gloo binds the address the host's name resolves to, or the interface named by
``GLOO_SOCKET_IFNAME`` (``NCCL_SOCKET_IFNAME`` for NCCL); docs/runtime.md, "More than one host".

The store carries the start (the snapshot to resume from, if any) and the generators'
heartbeats; the process group (gloo) carries rollouts and weights; the trainers' own group
(gloo or NCCL) carries their gradients.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import logging
import multiprocessing
import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from replay_exp.config.errors import RunStopped
from replay_exp.runtime.process import set_up_process

log = logging.getLogger("replay_exp")

START_KEY = "start"
# Set by rank 0 once the policy (and its warm-start cache) is built; the other ranks wait for it.
LOADED_KEY = "policy_loaded"
STOPPED = 4  # a rank's exit code: it stopped early on purpose, with a snapshot (RunStopped)
# Imported once by the fork server that starts the ranks (a fresh process, not a fork of this
# one: no CUDA or thread state is inherited), so each rank is forked with them loaded
# instead of importing torch and transformers anew; later runs of this process reuse it.
PRELOAD = ["replay_exp.runtime.trainer", "replay_exp.runtime.generator", "replay_exp.loop"]


class RankFailed(RuntimeError):
    """A rank of a distributed run exited with an error; the message is one line saying which
    and how to go on (relaunch: the run resumes from its newest snapshot)."""


TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def slurm_rank() -> tuple[int, int] | None:
    """(rank, world size) inside a SLURM job step with several tasks, else None."""
    n = int(os.environ.get("SLURM_NTASKS", "1") or 1)
    if n <= 1 or "SLURM_PROCID" not in os.environ:
        return None
    return int(os.environ["SLURM_PROCID"]), n


def torchrun_rank() -> tuple[int, int] | None:
    """(rank, world size) of a process started under torchrun's contract (every one of
    ``TORCHRUN_VARS`` set, a world of several), else None."""
    if not all(os.environ.get(k) for k in TORCHRUN_VARS):
        return None
    n = int(os.environ["WORLD_SIZE"])
    return (int(os.environ["RANK"]), n) if n > 1 else None


def task_rank() -> tuple[int, int] | None:
    """(rank, world size) of a process the job started as one of its ranks (SLURM's task,
    else torchrun's contract), or None: this process spawns the ranks itself."""
    return slurm_rank() or torchrun_rank()


def task_address() -> tuple[str, int]:
    """Where rank 0 hosts the store: SLURM's first node and a port from the job id, else
    ``MASTER_ADDR``:``MASTER_PORT``."""
    if slurm_rank() is None:
        return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    return slurm_address()


def local_rank(rank: int) -> int:
    """This rank's index among the ranks of its host (its GPU): ``SLURM_LOCALID``, torchrun's
    ``LOCAL_RANK``, else the rank."""
    return int(os.environ.get("SLURM_LOCALID", os.environ.get("LOCAL_RANK", rank)))


def interface_problem(master: str) -> str | None:
    """Why the ranks on other hosts could not reach this rank's gloo connections, or None.

    Without ``GLOO_SOCKET_IFNAME`` gloo binds the address this host's name resolves to, and
    the loopback when that fails; a job whose store (``master``, rank 0's host) is not on the
    loopback spans hosts, and a loopback address there hangs the peers until their timeout
    (seen on the emulated hosts of scripts/two_hosts.sh). Checked before the rendezvous."""
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return None
    try:
        if ipaddress.ip_address(socket.gethostbyname(master)).is_loopback:
            return None  # every rank on this host
    except OSError:
        return None  # the store's own connection error names it
    name = socket.gethostname()
    try:
        mine = socket.gethostbyname(name)
    except OSError:
        mine = None
    if mine is not None and not ipaddress.ip_address(mine).is_loopback:
        return None
    return (
        f"this host's name {name!r} resolves to {mine or 'no address'}, so gloo would bind the "
        f"loopback and the ranks on other hosts (the store is on {master}) could not connect: "
        "set GLOO_SOCKET_IFNAME to the interface of the network the hosts share (and "
        "NCCL_SOCKET_IFNAME under runtime.backend=nccl), or make the name resolve to its address"
    )


def task_store(cfg, master: bool) -> dist.TCPStore:
    """The rendezvous store of a rank the job started: hosted by rank 0 (``master``), joined
    by the others; refused in one line first where gloo could not reach this host."""
    host, port = task_address()
    problem = interface_problem(host)
    if problem:
        raise RankFailed(problem)
    return _store(host, port, master, cfg.runtime.rendezvous_timeout_s)


def slurm_address() -> tuple[str, int]:
    """Host of task 0 (the job's first node) and a port from the job id."""
    import subprocess

    nodes = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST", "")
    host = "127.0.0.1"
    if nodes:
        out = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True,
                             text=True, check=False)  # fmt: skip
        first = out.stdout.split()
        host = first[0] if first else host
    job = int(os.environ.get("SLURM_JOB_ID", "0"))
    return host, 20000 + job % 20000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def world_size(d) -> int:
    return d.trainers + d.workers


def run_distributed(cfg, d, run_dir: Path, snapshot) -> dict:
    """Run ``cfg`` as W + T ranks writing into ``run_dir`` (prepared, locked by the caller);
    ``snapshot``: the Snapshot to resume from, or None. Returns the run's summary."""
    snapshot_path = None if snapshot is None else str(snapshot.path)
    task = task_rank()
    if task is not None:
        rank, world = task
        if world != world_size(d):
            how = ("SLURM tasks", "set hydra.launcher.tasks_per_node") if slurm_rank() else (
                "ranks (WORLD_SIZE)", "start WORLD_SIZE")  # fmt: skip
            raise RuntimeError(
                f"runtime=distributed needs W + T = {world_size(d)} {how[0]}, the job has "
                f"{world} ({how[1]}={world_size(d)})"
            )
        store = task_store(cfg, master=True)
        store.set(START_KEY, json.dumps({"snapshot": snapshot_path}))
        return run_rank(cfg, d, run_dir, rank, world, store)
    return spawn_local(cfg, d, run_dir, snapshot_path)


def join_job(cfg, d, run_dir: Path) -> dict | None:
    """A rank other than 0 started by the job (a SLURM task, a torchrun process): wait for
    rank 0's start, then run this rank."""
    summary = run_dir / "summary.json"
    if summary.is_file() and json.loads(summary.read_text()).get("status") == "finished":
        return None  # task 0 reports it
    rank, world = task_rank()
    store = task_store(cfg, master=False)
    return run_rank(cfg, d, run_dir, rank, world, store)


def _store(host: str, port: int, master: bool, timeout: float) -> dist.TCPStore:
    return dist.TCPStore(
        host, port, None, is_master=master, timeout=timedelta(seconds=timeout),
        wait_for_workers=False,
    )  # fmt: skip


def spawn_local(cfg, d, run_dir: Path, snapshot_path: str | None) -> dict:
    """Host the store, start the W + T rank processes, supervise them (module docstring)."""
    T, W, world = d.trainers, d.workers, world_size(d)
    port = free_port()
    store = _store("127.0.0.1", port, True, cfg.runtime.rendezvous_timeout_s)
    store.set(START_KEY, json.dumps({"snapshot": snapshot_path}))
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    container = OmegaConf.to_container(cfg)
    procs = []
    for rank in range(world):
        p = ctx.Process(
            target=_child, args=(container, d, str(run_dir), rank, world, port),
            name=f"replay_exp-rank{rank}", daemon=False,
        )  # fmt: skip
        p.start()
        procs.append(p)
    log.info("runtime=distributed: %d trainer + %d generator processes (pids %s)", T, W,
             [p.pid for p in procs])  # fmt: skip
    reported: set[int] = set()
    role = lambda rank: f"trainer {rank}" if rank < T else f"generator {rank - T}"  # noqa: E731
    try:
        while True:
            failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if any(r < T for r in failed):  # a generator's death often ends a trainer: both
                time.sleep(0.5)  # exit codes come from the fork server; let the others arrive
                failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            for rank in failed:
                if rank not in reported:
                    reported.add(rank)
                    log.error("rank %d (%s, pid %d) exited with code %s", rank, role(rank),
                              procs[rank].pid, procs[rank].exitcode)  # fmt: skip
            trainer = next((r for r in failed if r < T), None)
            if trainer is not None:  # the trainers' collectives cannot go on
                code = procs[trainer].exitcode
                why = "stopped with a snapshot" if code == STOPPED else f"exited with code {code}"
                raise RankFailed(
                    f"{role(trainer)} (rank {trainer}) {why}; relaunch to resume from the "
                    "newest snapshot"
                )
            if procs[0].exitcode is not None:
                break
            time.sleep(0.2)
        deadline = time.monotonic() + 60
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
    if procs[0].exitcode != 0:
        raise RankFailed(
            f"trainer rank 0 exited with code {procs[0].exitcode} (see {run_dir}/train.log); "
            "relaunch to resume from the newest snapshot"
        )
    return json.loads((run_dir / "summary.json").read_text())


def _child(container: dict, d, run_dir: str, rank: int, world: int, port: int) -> None:
    _die_with_parent()
    cfg = OmegaConf.create(container)
    store = _store("127.0.0.1", port, False, cfg.runtime.rendezvous_timeout_s)
    try:
        run_rank(cfg, d, Path(run_dir), rank, world, store)
    except RunStopped as e:  # expected (a generator died): one line, no traceback
        log.error("rank %d stopped: %s", rank, e)
        sys.exit(STOPPED)
    except Exception as e:
        log.exception("rank %d failed: %s", rank, e)
        sys.exit(3)


def run_rank(cfg, d, run_dir: Path, rank: int, world: int, store) -> dict | None:
    """One rank, from the rendezvous to its clean exit. Rank 0 returns the summary."""
    from replay_exp.models import load_policy
    from replay_exp.runtime.channels import open_links
    from replay_exp.runtime.generator import run_generator, snapshot_read_key
    from replay_exp.runtime.trainer import run_trainer
    from replay_exp.tasks import make_task

    T = d.trainers
    timeout = timedelta(seconds=cfg.runtime.rendezvous_timeout_s)
    if d.device.startswith("cuda"):
        local = local_rank(rank) % max(1, torch.cuda.device_count())
        d = dataclasses.replace(d, device=f"cuda:{local}")
        torch.cuda.set_device(local)
    set_up_process(d.rank_threads, cfg.deterministic)  # threads: config.rank_sizes
    _log_to(run_dir / "train.log", rank, console=rank == 0)
    snapshot_path = json.loads(store.get(START_KEY))["snapshot"]
    loaded = None
    if rank == 0:  # builds (and caches) the warm start once, before the other ranks load it
        loaded = load_policy(
            cfg.model, cfg.task, make_task(cfg.task), d.device, d.param_dtype, d.dtype
        )
        store.set(LOADED_KEY, "1")
    else:
        store.wait([LOADED_KEY], timeout)
    links = open_links(store, rank, world, timeout)  # the channels' group (channels.py)
    if rank >= T:  # no default process group in a generator: an engine that makes its own
        # torch.distributed world (vLLM) must be free to
        run_generator(cfg, d, rank, store, links, run_dir, snapshot_path)
        return None
    if snapshot_path is not None:  # keep the snapshot until every generator has read it
        store.wait([snapshot_read_key(w) for w in range(world - T)], timeout)
    dist.init_process_group(
        "gloo", store=dist.PrefixStore("pg", store), rank=rank, world_size=T, timeout=timeout
    )
    backend = cfg.runtime.backend
    if backend == "auto":
        backend = "nccl" if d.device.startswith("cuda") else "gloo"
    trainers = dist.new_group(list(range(T)), backend=backend)
    try:
        return run_trainer(cfg, d, rank, trainers, store, links, run_dir, snapshot_path, loaded)
    finally:
        dist.destroy_process_group()


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent (the supervisor) dies, so killing the
    job's main process never leaves ranks behind."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _log_to(path: Path, rank: int, console: bool) -> None:
    """This rank's log lines into the run's train.log (appends; one line per write)."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    root = logging.getLogger()
    fmt = logging.Formatter(f"%(asctime)s rank{rank} %(name)s %(message)s")
    mine = [h for h in root.handlers if isinstance(h, logging.FileHandler)
            and Path(h.baseFilename) == path.resolve()]  # fmt: skip
    if mine:  # SLURM task 0 runs in the entrypoint's process, which already writes train.log
        mine[0].setFormatter(fmt)
    else:
        handler = logging.FileHandler(path)
        handler.setFormatter(fmt)
        root.addHandler(handler)
    if console and not any(isinstance(h, logging.StreamHandler) and not isinstance(
            h, logging.FileHandler) for h in root.handlers):  # fmt: skip
        root.addHandler(logging.StreamHandler())
    root.setLevel(logging.INFO)
