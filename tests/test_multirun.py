"""A real Hydra multirun: runs are named by their overrides and a relaunch skips finished runs."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
import yaml

from replay_exp.config.sweep import sweep_status
from replay_exp.rundir import LOCK_FILE, process_start
from replay_exp.runlog import read_provenance

pytestmark = pytest.mark.slow


def _multirun(args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "replay_exp.train", "-m", *args],
        cwd=cwd, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_sweep_runs_are_named_by_overrides_and_a_relaunch_skips_them(fast, tmp_path):
    args = [*fast, "schedule.max_steps=2", f"output_root={tmp_path / 'runs'}", "sweep_name=demo",
            "seed=0,1", "logger.log_every=1", "save_final_model=false"]  # fmt: skip
    first = _multirun(args, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    runs = sorted(p for p in (tmp_path / "runs" / "demo").iterdir() if p.is_dir())
    assert len(runs) == 2
    # Named by the sorted overrides (cosmetic keys such as logger.log_every left out); this long
    # override list is cut to a readable head plus a hash of the whole.
    assert all(r.name.startswith("algo.group_size=4,buffer.capacity=32,") for r in runs)
    assert all("log_every" not in r.name and "save_final" not in r.name for r in runs)
    seeds = {yaml.safe_load((r / "config.yaml").read_text())["seed"] for r in runs}
    assert seeds == {0, 1}
    for r in runs:
        summary = json.loads((r / "summary.json").read_text())
        assert summary["status"] == "finished"
        # each job records the code that made it (config.yaml, summary.json)
        (record,) = read_provenance(r)
        assert record["step"] == 0 and "commit" in record and record["versions"]["torch"]
        assert summary["provenance"] == [record]
    before = {r.name: (r / "metrics.jsonl").read_bytes() for r in runs}
    assert (tmp_path / "runs" / "demo" / "multirun.yaml").is_file()  # Hydra's sweep record
    assert {p.name for p in tmp_path.iterdir()} == {"runs", "cache"}  # nothing else in the cwd
    assert "[sweep] 2 runs queued" in first.stdout
    assert "[sweep] run 2/2 running (done 1, queued 0)" in first.stdout
    assert sweep_status(tmp_path / "runs" / "demo") == {
        "finished": [r.name for r in runs], "started": [], "empty": [],
    }  # fmt: skip

    again = _multirun(args, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("run already finished") == 2
    assert {r.name: (r / "metrics.jsonl").read_bytes() for r in runs} == before

    # A run directory that another live process holds is skipped with one line, and the sweep
    # goes on to its next job (a sweep split over processes by overlapping lists).
    seed0 = next(r for r in runs if yaml.safe_load((r / "config.yaml").read_text())["seed"] == 0)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        owner = {"pid": holder.pid, "host": socket.gethostname(),
                 "start": process_start(holder.pid), "slurm_job_id": None,
                 "since": "earlier"}  # fmt: skip
        (seed0 / LOCK_FILE).write_text(json.dumps(owner))
        split = _multirun([*args[:-3], "seed=0,2", *args[-2:]], tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert split.returncode == 0, split.stderr[-3000:]
    assert split.stderr.count("skipped, another process runs it: ") == 1
    assert f"run_dir={seed0} is in use by process {holder.pid}" in split.stderr
    assert {r.name: (r / "metrics.jsonl").read_bytes() for r in runs} == before
    assert "[sweep] run 2/2 running (done 1, queued 0)" in split.stdout
    assert len(sweep_status(tmp_path / "runs" / "demo")["finished"]) == 3  # seed 2 ran
