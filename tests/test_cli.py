"""The command line: bad input fails with one line and exit code 2, writing nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def _train(args, cwd):
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(
        [sys.executable, "-m", "replay_exp.train", *args],
        cwd=cwd, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip


def test_resolve_error_is_one_line_exit_2_and_writes_nothing(tmp_path):
    proc = _train(["schedule.rollouts_per_step=12", "output_root=runs"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "config error: schedule.rollouts_per_step=12 is not a multiple of algo.group_size=8"
    ]
    assert list(tmp_path.iterdir()) == []


def test_existing_run_dir_is_not_clobbered(tmp_path):
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
    (run_dir / "config.yaml").write_text("seed: 0\n")
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    proc = _train([f"run_dir={run_dir}"], tmp_path)
    assert proc.returncode == 2
    assert "already holds a run" in proc.stderr
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
    # A bad config aimed at the same dir also leaves it untouched.
    proc = _train([f"run_dir={run_dir}", "buffer.capacity=8"], tmp_path)
    assert proc.returncode == 2
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before


def test_typo_in_a_key_fails_at_compose_time(tmp_path):
    proc = _train(["buffer.capcity=512"], tmp_path)
    assert proc.returncode != 0
    assert "capcity" in proc.stderr
    assert list(tmp_path.iterdir()) == []
