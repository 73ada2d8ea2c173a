"""Golden regression test: a short run of the embedded default must log exactly the metrics
pinned in ``tests/golden/default_small.json``, so any numerical change between commits is seen
(a refactor that should change nothing must leave it green).

Regenerate after an intended change (and say why in the commit):

    REPLAY_EXP_REGEN_GOLDEN=1 pytest tests/test_golden.py

The pinned values hold for the machine kind, torch version and CPU capability recorded in the
file; elsewhere floats are compared to 1e-4 relative (CPU kernels round differently).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from replay_exp.config import compose, resolve
from replay_exp.logging import read_metrics
from replay_exp.testing import without_wall_clock
from replay_exp.train import run

pytestmark = pytest.mark.slow

GOLDEN = Path(__file__).parent / "golden" / "default_small.json"
# conftest.default_overrides without the cache dir (a shipped warm start needs none), 6 steps,
# two threads (a fixed split of the work, whatever the core count).
OVERRIDES = [
    "schedule.reuse_ratio=2", "task.n_eval=64", "eval.sampled_problems=16", "eval.every=3",
    "logger.progress=false", "schedule.max_steps=6", "seed=7", "threads=2",
]  # fmt: skip


def _platform() -> dict:
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def _metrics(tmp_path) -> list[dict]:
    cfg, derived = resolve(compose([*OVERRIDES, f"run_dir={tmp_path / 'run'}"]))
    run(cfg, derived, tmp_path / "run")
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    return without_wall_clock(rows)


def test_a_short_default_run_logs_the_pinned_metrics(tmp_path):
    got = _metrics(tmp_path)
    if os.environ.get("REPLAY_EXP_REGEN_GOLDEN"):
        GOLDEN.write_text(json.dumps({"platform": _platform(), "rows": got}, indent=1) + "\n")
        pytest.skip(f"regenerated {GOLDEN}")
    golden = json.loads(GOLDEN.read_text())
    want = golden["rows"]
    assert [r["step"] for r in got] == [r["step"] for r in want]
    if golden["platform"] == _platform():
        assert got == want  # bitwise
        return
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for k, v in w.items():
            if isinstance(v, float) and isinstance(g[k], float) and math.isfinite(v):
                assert g[k] == pytest.approx(v, rel=1e-4, abs=1e-7), (g["step"], k)
            else:
                assert g[k] == v, (g["step"], k)
