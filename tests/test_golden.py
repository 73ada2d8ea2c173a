"""Golden regression test: a short run of the embedded default must log the metrics pinned in
``tests/golden/default_small.json``, so any numerical change between commits is seen (a
refactor that should change nothing must leave it green).

Regenerate after an intended change (and say why in the commit):

    REPLAY_EXP_REGEN_GOLDEN=1 pytest tests/test_golden.py

Bitwise where it can be: on a machine whose platform record (:func:`platform_record`: torch's
version and build, the CPU's ISA level, model, flags, cache and core count) equals the file's.
Two machines with the same torch and capability string can still run other kernels (another
Xeon: 91 values off by ~1e-7, found by a fresh-machine run at cff922d), hence the CPU fields.

Elsewhere every value must match to :data:`REL` / :data:`ABS`, tolerances measured, not
guessed, by running the same 6 steps with other kernels on the pinning machine
(``ATEN_CPU_CAPABILITY=avx2`` and ``=default`` against AVX512, threads=2, seed 7, 64 problems):
no discrete value (reward, pass@k, lengths, counts) moved, and 82-89 of 571 floats did; the
largest relative difference of a float above 1e-3 was 7.6e-6 (``diag/lag1-3/ratio_dev`` at
step 6), the largest absolute difference of a smaller float 1.35e-7 (``diag/lag0/ratio_dev``,
a value that is itself rounding noise near 1e-7). REL and ABS are ~13x and ~15x those.
``test_another_kernel_set_is_within_the_tolerance`` re-measures it on every run. A sampled
token flipped by rounding on some machine would move discrete values too: that fails here, on
purpose, with the step and key.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.rollout.synthetic import without_wall_clock
from replay_exp.runlog import read_metrics
from replay_exp.train import run

pytestmark = pytest.mark.slow

GOLDEN = Path(__file__).parent / "golden" / "default_small.json"
# conftest.default_overrides without the cache dir (a shipped warm start needs none), 6 steps,
# two threads (a fixed split of the work, whatever the core count).
OVERRIDES = [
    "schedule.reuse_ratio=2", "task.n_eval=64", "eval.sampled_problems=16", "eval.every=3",
    "logger.progress=false", "schedule.max_steps=6", "seed=7", "threads=2",
]  # fmt: skip
REL, ABS = 1e-4, 2e-6  # measured (module docstring)


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    first = text.split("\n\n")[0]
    return {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in first.splitlines())}


def platform_record() -> dict:
    """What selects the CPU kernels a run executes: torch's version and build configuration
    (MKL, oneDNN, compiler), the ISA level torch dispatches to, and the processor (vendor,
    model, stepping, flag set, cache size, logical cores)."""
    cpu = _cpuinfo()
    digest = lambda s: hashlib.sha256(s.encode()).hexdigest()[:16]  # noqa: E731
    return {
        "torch": torch.__version__,
        "torch_config": digest(torch.__config__.show()),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu": " ".join(cpu.get(k, "?") for k in ("vendor_id", "cpu family", "model", "stepping")),
        "cpu_model": cpu.get("model name", "?"),
        "cpu_flags": digest(" ".join(sorted(cpu.get("flags", "").split()))),
        "cache": cpu.get("cache size", "?"),
        "cores": os.cpu_count(),
    }


def golden_rows(run_dir: Path) -> list[dict]:
    cfg, derived = resolve(compose([*OVERRIDES, f"run_dir={run_dir}"]))
    run(cfg, derived, run_dir)
    return without_wall_clock(read_metrics(run_dir / "metrics.jsonl"))


def mismatches(got: list[dict], want: list[dict], bitwise: bool) -> list[str]:
    """Every (step, key) where ``got`` differs from ``want``: at all (``bitwise``), else
    beyond REL / ABS for finite floats and at all for anything else."""
    if [r["step"] for r in got] != [r["step"] for r in want]:
        return [f"steps {[r['step'] for r in got]} != {[r['step'] for r in want]}"]
    out = []
    for g, w in zip(got, want, strict=True):
        if g.keys() != w.keys():
            out.append(f"step {w['step']}: keys differ: {sorted(g.keys() ^ w.keys())}")
        for k in w.keys() & g.keys():
            a, b = g[k], w[k]
            if bitwise or not (isinstance(b, float) and isinstance(a, float) and math.isfinite(b)):
                if a != b:
                    out.append(f"step {w['step']} {k}: {a!r} != pinned {b!r}")
            elif not math.isclose(a, b, rel_tol=REL, abs_tol=ABS):
                out.append(f"step {w['step']} {k}: {a!r} vs pinned {b!r} (beyond the tolerance)")
    return out


def test_a_short_default_run_logs_the_pinned_metrics(tmp_path):
    got = golden_rows(tmp_path / "run")
    if os.environ.get("REPLAY_EXP_REGEN_GOLDEN"):
        GOLDEN.write_text(json.dumps({"platform": platform_record(), "rows": got}, indent=1) + "\n")
        pytest.skip(f"regenerated {GOLDEN}")
    golden = json.loads(GOLDEN.read_text())
    bitwise = golden["platform"] == platform_record()
    bad = mismatches(got, golden["rows"], bitwise)
    kind = "bitwise (the pinning machine)" if bitwise else f"to rel {REL} / abs {ABS}"
    assert not bad, f"{len(bad)} values differ {kind}:\n" + "\n".join(bad[:20])


def test_the_comparison_fails_on_a_real_change():
    """The tolerance path is not a pass-everything: a discrete change, a float beyond REL, a
    lost key each fail; rounding-sized float noise passes."""
    want = [{"step": 1, "train/reward": 0.25, "loss/loss": 0.5, "diag/kl": 1e-9, "n": 3}]
    ok = [{"step": 1, "train/reward": 0.25, "loss/loss": 0.5 * (1 + 1e-5), "diag/kl": 3e-9,
           "n": 3}]  # fmt: skip
    assert mismatches(ok, want, bitwise=False) == []
    assert len(mismatches(ok, want, bitwise=True)) == 2
    assert mismatches([{**ok[0], "train/reward": 0.28125}], want, bitwise=False)
    assert mismatches([{**ok[0], "loss/loss": 0.5 * (1 + 1e-3)}], want, bitwise=False)
    assert mismatches([{**ok[0], "n": 4}], want, bitwise=False)
    assert mismatches([{k: v for k, v in ok[0].items() if k != "diag/kl"}], want, bitwise=False)


def test_another_kernel_set_is_within_the_tolerance(tmp_path):
    """A second machine, as far as one machine can be one: the same run with torch's AVX2
    kernels (``ATEN_CPU_CAPABILITY=avx2``; on a machine without AVX512 the default ones)
    against the pin, through the tolerance path, as a machine whose record differs sees it."""
    script = (
        "import json, sys; sys.path.insert(0, sys.argv[2]); import test_golden as t; "
        "from pathlib import Path; "
        "print(json.dumps(t.golden_rows(Path(sys.argv[1]))))"
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "run"), str(Path(__file__).parent)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    bad = mismatches(got, json.loads(GOLDEN.read_text())["rows"], bitwise=False)
    assert not bad, f"{len(bad)} values beyond rel {REL} / abs {ABS}:\n" + "\n".join(bad[:20])
