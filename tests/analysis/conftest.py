"""Two real tiny sweeps (Hydra multiruns of the train entrypoint, a few steps each), produced
once per test session for the report, loader and notebook tests:

- ``compute``: the on-policy baseline vs FIFO replay at y = 2, 2 seeds each (4 runs);
- ``heatmap``: the async emulation over N in {32, 64} x T in {2, 4} trainers, 2 seeds (8 runs).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SWEEPS = {
    "compute": ["experiment=on_policy,replay_reuse2", "seed=0,1"],
    "heatmap": ["schedule=async", "buffer.capacity=32,64", "schedule.trainers=2,4", "seed=0,1"],
}


@pytest.fixture(scope="session")
def tiny_sweeps(tmp_path_factory, fast_session) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sweeps")
    common = [
        *fast_session,
        "schedule.max_steps=4",
        "eval.every=2",
        "compute.mu=6.84",
        "save_final_model=false",
        f"output_root={root / 'runs'}",
    ]
    out = {}
    for name, params in SWEEPS.items():
        proc = subprocess.run(
            [sys.executable, "-m", "replay_exp.train", "-m", *common, f"sweep_name={name}",
             *params],
            cwd=root, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[name] = root / "runs" / name
    return out
