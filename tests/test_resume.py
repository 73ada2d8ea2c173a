"""Resume equivalence through the real command line.

A run killed with SIGKILL once it has written a snapshot past step 2, then relaunched with the
same command, must end with the same metrics.jsonl as an uninterrupted run: bitwise on this
machine (same thread count) for every key except the wall-clock measurements, which differ
between any two runs, interrupted or not (``compute/seconds*``, ``compute/measured_mu``).
Also: relaunching a finished run exits 0 and changes nothing; relaunching an unfinished run
with a changed config fails with one line (exit 2) and changes nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from replay_exp.checkpoint import RUN_LAYOUT, load_latest
from replay_exp.rollout.synthetic import without_wall_clock
from replay_exp.runlog import read_metrics

pytestmark = pytest.mark.slow


def _command(fast, run_dir, *extra) -> list[str]:
    return [
        sys.executable, "-m", "replay_exp.train", *fast, f"run_dir={run_dir}",
        "checkpoint.every=2", "schedule.max_steps=8", *extra,
    ]  # fmt: skip


def _launch(cmd, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=300)


def _kill_after_snapshot_past(cmd, cwd, run_dir, step: int) -> None:
    """Start ``cmd``; SIGKILL it as soon as a snapshot of a step > ``step`` is committed."""
    with open(cwd / f"{run_dir.name}.killed.log", "w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    try:
        while not any(
            int(p.name.removeprefix("step_")) > step
            for p in (run_dir / "checkpoints").glob("step_*")
        ):
            assert proc.poll() is None, f"run ended (rc {proc.returncode}) before a snapshot"
            assert time.monotonic() < deadline, "no snapshot past step 2 within 300 s"
            time.sleep(0.01)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (run_dir / "summary.json").exists(), "the run finished before it was killed"


def _files(run_dir) -> dict:
    return {
        p.relative_to(run_dir): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize(
    ("base", "variant"),
    [
        ("fast", ["buffer=on_policy"]),
        # A private generator copy synced at steps 0, 3 and 6: the snapshot of step 4 (where
        # the kill lands, 10 ms after it appears) holds version 3 weights, which steps 4 and 5
        # sample from, so a resume that lost them would generate different rollouts. (With
        # sync_every=2 every snapshot step syncs at once, and a copy of version 0 equals the
        # freshly loaded policy: the copy would not matter.)
        ("fast", ["buffer=fifo", "schedule.sync_every=3"]),
        # The embedded default at its default thread count, replaying (conftest.default_small).
        ("default_small", []),
        # bfloat16 compute over float32 master weights (models/precision.py), the embedded
        # default at its default thread count: the snapshot holds the master weights and
        # Adam's float32 state, so the resume is bitwise too.
        ("default_small", ["model.dtype=bfloat16", "schedule.sync_every=3"]),
    ],
    ids=["on_policy", "fifo_sync3", "default_threads", "bf16_master"],
)
def test_killed_run_resumes_to_the_same_metrics(base, variant, request, tmp_path):
    fast = request.getfixturevalue(base)
    full, killed = tmp_path / "full", tmp_path / "killed"

    proc = _launch(_command(fast, full, *variant), tmp_path)  # uninterrupted reference
    assert proc.returncode == 0, proc.stderr[-3000:]

    _kill_after_snapshot_past(_command(fast, killed, *variant), tmp_path, killed, step=2)
    # The one snapshot layout of both runtimes (tests/runtime/test_distributed.py): one
    # buffer and one ledger in process.
    snap = load_latest(killed / "checkpoints")
    assert sorted(snap.states) == sorted(RUN_LAYOUT)
    assert len(snap.states["buffers"]) == len(snap.states["ledgers"]) == 1
    assert sorted(snap.states["source"]) == ["generator", "rng", "weight_history"]
    n_rows = len(read_metrics(killed / "metrics.jsonl"))
    assert 0 < n_rows < len(read_metrics(full / "metrics.jsonl"))

    # A changed config is refused with one line, and nothing in the run dir changes.
    before = _files(killed)
    proc = _launch(_command(fast, killed, *variant, "seed=1"), tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        f"config error: run_dir={killed} already holds a run with a different config: "
        "seed=0 there, 1 here (resuming needs the same config; or choose another run_dir)"
    ]
    assert _files(killed) == before

    # The same command resumes from the newest snapshot and finishes like the reference.
    proc = _launch(_command(fast, killed, *variant), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming from" in (killed / "train.log").read_text()
    got = without_wall_clock(read_metrics(killed / "metrics.jsonl"))
    want = without_wall_clock(read_metrics(full / "metrics.jsonl"))
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(9))
    assert got == want
    details = "eval_details.jsonl"  # per-problem eval results: truncated and continued too
    assert (killed / details).read_text() == (full / details).read_text()
    weights = "final_model/model.safetensors"
    assert (killed / weights).read_bytes() == (full / weights).read_bytes()

    # A finished run relaunched: exit 0, a message, and not a byte (or mtime) changed.
    before = _files(killed)
    proc = _launch(_command(fast, killed, *variant), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "run already finished" in proc.stdout
    assert _files(killed) == before
