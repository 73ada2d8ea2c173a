"""The device check's settings and report (tests/gpu/test_gpu_check.py).

Settings come from the environment, which scripts/gpu_check.sh sets from its arguments:

- ``GPU_CHECK_DEVICE``  ``cuda`` or ``cpu``. Unset: cuda, and every check SKIPs where CUDA is
  unavailable (the default suite on a CPU machine). Set (gpu_check.sh always sets it): the
  checks run on that device, and a missing GPU is a FAIL, never a SKIP.
- ``GPU_CHECK_STEPS``   GRPO steps per run (default: cuda 20, cpu 4).
- ``GPU_CHECK_BUDGET_S`` seconds for all checks (default 450); a check the budget leaves no
  room for is a FAIL ("not run").
- ``GPU_CHECK_JSON``    write the report here: ``{device, dtype, steps, seconds, counts,
  results: [{check, status, seconds, detail, numbers}]}``.
- ``GPU_CHECK_KEEP``    keep the run directories in this folder (default: a temporary one).
- ``GPU_CHECK_SKIP_VLLM=1``  report the vLLM checks as SKIP.

Each test is one check, named as before the move to pytest (``env``, ``default/on_policy``,
``determinism``, ...); its status is PASS, FAIL (a failure or an error in set-up) or SKIP (a
SKIP is never a pass). The hooks below print one line per check and a summary table at the
end, and write the JSON.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Settings:
    device: str  # cuda | cpu
    required: bool  # GPU_CHECK_DEVICE was set: run there, never skip for want of CUDA
    steps: int  # GRPO steps per run
    budget_s: float
    json: Path | None
    keep: Path | None
    skip_vllm: bool

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"

    @property
    def dtype(self) -> str:
        return "bfloat16" if self.cuda else "float32"


def _settings() -> Settings:
    env = os.environ
    device = env.get("GPU_CHECK_DEVICE") or "cuda"
    if device not in ("cuda", "cpu"):
        raise pytest.UsageError(f"GPU_CHECK_DEVICE={device}: choose cuda or cpu")
    return Settings(
        device=device,
        required=bool(env.get("GPU_CHECK_DEVICE")),
        steps=int(env.get("GPU_CHECK_STEPS") or (20 if device == "cuda" else 4)),
        budget_s=float(env.get("GPU_CHECK_BUDGET_S") or 450.0),
        json=Path(env["GPU_CHECK_JSON"]) if env.get("GPU_CHECK_JSON") else None,
        keep=Path(env["GPU_CHECK_KEEP"]) if env.get("GPU_CHECK_KEEP") else None,
        skip_vllm=env.get("GPU_CHECK_SKIP_VLLM", "") not in ("", "0"),
    )


SETTINGS = _settings()


@dataclass
class Check:
    """One check's record: the test fills ``numbers`` and a one-line ``detail``."""

    name: str
    numbers: dict = field(default_factory=dict)
    detail: str = ""
    status: str | None = None
    seconds: float = 0.0


CHECK = pytest.StashKey[Check]()
RESULTS = pytest.StashKey[list]()
SPAN = pytest.StashKey[list]()  # [first start, last stop] (epoch seconds)
MODEL_CASES = ("on_policy", "fifo", "shared_prefix")  # per model: named <model>/<case>


def _check(item: pytest.Item) -> Check:
    if CHECK not in item.stash:
        name = item.originalname.removeprefix("test_")
        params = getattr(getattr(item, "callspec", None), "params", {})
        if name in MODEL_CASES and "model" in params:
            name = f"{params['model']}/{name}"
        item.stash[CHECK] = Check(name)
    return item.stash[CHECK]


@pytest.fixture(scope="session")
def settings() -> Settings:
    return SETTINGS


@pytest.fixture
def check(request) -> Check:
    """The running check's record (name, numbers, detail) for the report."""
    return _check(request.node)


def _detail(report: pytest.TestReport, call: pytest.CallInfo) -> str:
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
        return str(reason).removeprefix("Skipped: ")
    e = call.excinfo.value if call.excinfo is not None else None
    if e is None:
        return ""
    msg = str(e).strip().splitlines()[0][:400] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "teardown":
        return
    rec = _check(item)
    rec.seconds += report.duration
    span = item.config.stash.setdefault(SPAN, [call.start, call.stop])
    span[1] = call.stop
    if report.when == "setup" and report.passed:
        return  # the call decides
    rec.status = "PASS" if report.passed else "SKIP" if report.skipped else "FAIL"
    if rec.status != "PASS":
        rec.detail = _detail(report, call)
    item.config.stash.setdefault(RESULTS, []).append(rec)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    results: list[Check] = config.stash.get(RESULTS, [])
    if not any(r.status != "SKIP" for r in results):
        return  # nothing ran (no CUDA here): no report
    write = terminalreporter.write_line
    start, stop = config.stash[SPAN]
    total = stop - start
    counts = {s: sum(r.status == s for r in results) for s in ("PASS", "FAIL", "SKIP")}
    write("")
    for r in results:
        write(f"[{r.status}] {r.name} ({r.seconds:.1f} s) {r.detail}")
    write("\n==== gpu_check summary ====")
    for r in results:
        write(f"{r.status:<4}  {r.name:<22} {r.seconds:>7.1f} s")
    write(
        f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped "
        f"in {total:.0f} s ({SETTINGS.device})"
    )
    if SETTINGS.json is not None:
        report = {
            "device": SETTINGS.device, "dtype": SETTINGS.dtype, "steps": SETTINGS.steps,
            "seconds": total, "counts": counts,
            "results": [
                {"check": r.name, "status": r.status, "seconds": round(r.seconds, 2),
                 "detail": r.detail, "numbers": r.numbers}
                for r in results
            ],
        }  # fmt: skip
        SETTINGS.json.write_text(json.dumps(report, indent=2, default=str))
        write(f"wrote {SETTINGS.json}")
