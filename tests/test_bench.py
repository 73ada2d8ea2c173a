"""Every ``bench/`` program runs: its ``--smoke`` mode (a few steps at tiny sizes) exits 0 and
prints its table, so that a refactor cannot leave a benchmark dead until someone re-measures.

Nothing here asserts a timing (a smoke run's numbers mean nothing); the full benchmarks are run
by hand, on a quiet machine, with the commands their docstrings and docs/results.md give.
Each case runs ``python bench/<program>.py --smoke`` in a subprocess, in a temporary folder
(its runs and any results file land there). Skipped cases say why:
- ``vs_trl`` needs TRL, which only the ``bench`` extra installs (``pip install -e '.[bench]'``);
  the default install has no trl, so the case is skipped there;
- the runtime=distributed benches (``async_runtime``, ``cross_host``, ``emergent_reuse``,
  ``generation_cost``) need ``torch.distributed``; ``cross_host`` measures its second host only
  as root with ``ip netns`` (it says SKIP otherwise), so it runs everywhere;
- ``qwen3_width``'s smoke mode runs in tests/models/test_qwen3.py, which checks more of it;
- ``sweep_throughput`` measures its SLURM launcher only when a SLURM cluster answers ``sinfo``
  (it says SKIP and measures the local launcher otherwise), so it runs everywhere.
No bench program needs vLLM.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"

NO_TRL = importlib.util.find_spec("trl") is None
NO_DIST = not torch.distributed.is_available()
needs_trl = pytest.mark.skipif(
    NO_TRL, reason="trl is not installed: pip install -e '.[bench]' (the default install has none)"
)
needs_dist = pytest.mark.skipif(NO_DIST, reason="torch.distributed is not available")
covered_elsewhere = pytest.mark.skip(
    reason="runs in tests/models/test_qwen3.py::test_bench_qwen3_width_smoke, which also checks "
    "the model's shape and the JSON it writes"
)

# program: (extra arguments after --smoke ("{tmp}" is the test's folder), a line of its table,
# marks). One thread where a program takes --threads: the smoke runs share the machine.
CASES = {
    "async_runtime": ([], "| (W,T) | in flight | reuse real |", [needs_dist]),
    "buffer_scale": ([], "fifo/recency(tau=8)", []),
    "calibrate_testbed": ([], '{"all_pass":', []),
    "corrections_cost": (["--threads", "1"], "grpo proximal=recompute", []),
    "cross_host": ([], "| hosts | steps/s | trainer wait ms/step |", [needs_dist]),
    "determinism_cost": (["--threads", "1"], "ratio now / before:", []),
    "embedded_default": ([], "median over 1 seeds:", []),
    "emergent_reuse": (["--out", "{tmp}/out"], "| launch | mu | (W,T) | variant |", [needs_dist]),
    "generation_cost": ([], "| mu target | realised | realised / target |", [needs_dist]),
    "generation_fastpath": (["--threads", "1"], "| model | params | arm | first call s |", []),
    "master_weights": ([], "| 1e-06 | pure_bf16 |", []),
    "qwen3_width": (["--threads", "1"], "tiny (--smoke):", [covered_elsewhere]),
    "sweep_throughput": ([], "local, sequential, default threads: 1 runs in", []),
    "throughput": (["--threads", "1", "--out", "{tmp}/out.json"], "| ours | train GRPO |", []),
    "vs_trl": (["--out", "{tmp}/results.json"], "| variant | s/step | vs (b) |", [needs_trl]),
}


def test_every_bench_program_has_a_smoke_case():
    """A new bench/ program needs a ``--smoke`` mode and a line in CASES."""
    assert sorted(p.stem for p in BENCH.glob("*.py")) == sorted(CASES)


@pytest.mark.bench
@pytest.mark.slow
@pytest.mark.parametrize(
    ("program", "args", "table"),
    [pytest.param(name, args, table, marks=marks, id=name)
     for name, (args, table, marks) in CASES.items()],
)  # fmt: skip
def test_bench_smoke(program: str, args: list[str], table: str, tmp_path: Path):
    """``bench/<program>.py --smoke`` exits 0 and prints its table."""
    cmd = [sys.executable, str(BENCH / f"{program}.py"), "--smoke"]
    cmd += [a.format(tmp=tmp_path) for a in args]
    env = {**os.environ, "TMPDIR": str(tmp_path), "WANDB_MODE": "disabled",
           "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
    assert table in proc.stdout, f"no '{table}' in the output:\n{proc.stdout[-3000:]}"
