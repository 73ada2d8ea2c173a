"""The device check: the project on one GPU (or, with ``GPU_CHECK_DEVICE=cpu``, the same checks
at CI sizes), through the real train entrypoint, on the interpreter and packages it finds.

    bash scripts/gpu_check.sh [--kit .gpu_kit] [--device cpu]   # the lent machine; CI on CPU
    GPU_CHECK_DEVICE=cpu pytest -m gpu tests/gpu/test_gpu_check.py  # here, from the checkout

Without CUDA (and without ``GPU_CHECK_DEVICE``) every check skips: the default suite. Settings,
the JSON report and the summary table: tests/gpu/conftest.py. Every training run starts from a
temporary folder, so ``replay_exp`` is never imported from the current folder (the checkout
must be importable: gpu_check.sh puts it on PYTHONPATH, the project is never installed there).
A check that fails leaves the next ones to run; one that needs an earlier one's output (a run,
the hub model) fails with that one's error.

Two models, each on the device in its compute dtype (cuda: bfloat16 over float32 master
weights, 20 steps; cpu: float32, 4 steps), every run with ``deterministic=true``: ``default``,
the embedded default (tiny Llama, shipped warm start, cast to the compute dtype), and ``hub``, a
random Qwen2 saved like a hub checkpoint by ``replay_exp.models.tiny_hub`` (cuda: ~100 M
parameters; cpu: its tiny default sizes), loaded with ``model=<dir>``; both on the arithmetic
task. The checks run in this order, the ones issue 43 asks first (a cap that cuts the run cuts
the tail):

1. ``env``            versions, the device, its memory.
2. ``matmul_peak``    the matrix-product rate every MFU below is divided by, measured here
                      (cuda: 8192^3 in bfloat16, CUDA events; cpu: 1024^3 in float32, one
                      thread, as the runs; a loaded CPU makes every CPU MFU rough).
3. ``hub_model``      build and save the hub-format Qwen2.
4. ``mixed_precision`` bench/master_weights.py on the hub model: one AdamW step at lr 1e-6
                      under bf16 compute over float32 master weights keeps the float32 update
                      (>= 0.95 of it), pure bf16 weights lose it (< 0.1).
5. ``determinism``    the default model's FIFO run (y = 2) twice, same config and seed, with
                      ``deterministic=true``: metrics (wall clock aside), per-problem eval
                      results and final weights bitwise equal. If not, the size of the
                      difference is reported (FAIL).
6. ``resume``         the same run SIGKILLed once a snapshot past step 2 is on disk, relaunched:
                      equal to the uninterrupted run as in tests/test_resume.py; if not, the
                      difference against the run-to-run difference of check 5.
7. ``async_runtime``  runtime=distributed (replay_exp/runtime): one generator and one trainer
                      process sharing the device, hf generators, the default model: finished,
                      every rollout accounted for; reuse, mu T / W and steps/s reported.
8. ``throughput``     bench/throughput.py: trainer tokens/s and MFU at Qwen3-0.6B's shape,
                      generation tokens/s (hf cached loop, static fast path, vLLM if present)
                      beside the published anchors (cpu: its --smoke shape).
9. ``<model>/on_policy``  ``python -m replay_exp.train buffer=on_policy``: finished, loss finite
                      at every step, importance ratio 1 (fresh rollouts, mean and extremes within
                      the dtype's tolerance); generation tokens/s and training MFU (the run's
                      compute ledger: analytic FLOPs over measured seconds, steps 2..N), peak
                      device memory of the training process.
10. ``<model>/fifo``  the same through a FIFO buffer with reuse y = 2: finished, loss finite,
                      the buffer replayed (a batch held rollouts of an older policy).
11. ``<model>/shared_prefix``  the shared-prompt forward (replay_exp/models/shared_prefix.py)
                      against a full [prompt | completion] forward of the run's final model on
                      the device: log-probs and gradients within the dtype's tolerance.
12. ``async_runtime_vllm``  the async runtime with vLLM generators (generation=vllm, the hub
                      model, gpu_memory_utilization 0.3) when ``import vllm`` works; SKIP
                      otherwise.
13. ``vllm``          scripts/gpu_check_vllm.py (engine, log-probs, weight sync, snapshot,
                      ``generation=vllm`` runs) on the device, only when ``import vllm`` works;
                      SKIP otherwise.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
BENCH = SCRIPTS.parent / "bench"
# -S passes on to every child (tests/test_gpu_kit.py runs the check without site-packages).
PYTHON = [sys.executable, *(["-S"] if sys.flags.no_site else [])]
# Tolerances per dtype: |log-prob difference| (max, mean); relative gradient difference.
LOGP_TOL = {"float32": (1e-4, 1e-5), "bfloat16": (0.3, 0.03)}
GRAD_TOL = {"float32": 1e-3, "bfloat16": 0.1}
# On-policy importance ratio: |ratio_mean - 1| and max |ratio - 1| over tokens. Behaviour
# log-probs come from the sampler's cached forward, the update's from the trainer's: equal up to
# rounding (float32) or up to bfloat16's (the same bounds as the vLLM check's log-prob gaps).
RATIO_TOL = {"float32": (1e-4, 1e-3), "bfloat16": (0.03, 0.35)}
HUB_SIZES = {  # ~100 M parameters on cuda (vocab 512, tied); tiny_hub's defaults on cpu
    "cuda": {"hidden_size": 768, "num_layers": 12, "num_heads": 12, "intermediate_size": 2560},
    "cpu": {},
}
FIFO = ["buffer=fifo", "buffer.capacity=256", "schedule.reuse_ratio=2"]
# The real asynchronous runtime: W=1 generator + T=1 trainer process sharing the device.
DISTRIBUTED = [
    "runtime=distributed", "schedule=async", "schedule.gpus=null", "schedule.workers=1",
    "schedule.trainers=1", "buffer=fifo", "buffer.capacity=256", "buffer.shards=1",
]  # fmt: skip

# The training child: `python -m replay_exp.train` (runpy, as -m does) that writes its peak
# memory to the file given as its first argument when it exits.
TRAIN_CHILD = """\
import atexit, json, resource, runpy, sys
out = sys.argv.pop(1)
def peak():
    rec = {"max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        rec["max_memory_allocated"] = torch.cuda.max_memory_allocated()
        rec["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    with open(out, "w") as f:
        json.dump(rec, f)
atexit.register(peak)
runpy.run_module("replay_exp.train", run_name="__main__", alter_sys=True)
"""


# ---- training runs through the real entrypoint ----------------------------------------------


def train(overrides: list[str], run_dir: Path, timeout: float, kill_past: int | None = None):
    """Launch ``python -m replay_exp.train`` (cwd: the run's parent folder). Returns (exit code,
    log tail, peak-memory record). ``kill_past``: SIGKILL it once a snapshot of a step past it
    is committed (the return code is then that of the killed process)."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    mem = run_dir.parent / f"{run_dir.name}.{'killed' if kill_past else 'run'}.mem.json"
    log = run_dir.parent / f"{run_dir.name}.{'killed' if kill_past else 'run'}.log"
    cmd = [*PYTHON, "-c", TRAIN_CHILD, str(mem), f"run_dir={run_dir}", *overrides]
    print(f"  $ python -m replay_exp.train run_dir={run_dir} " + " ".join(overrides), flush=True)
    env = {**os.environ, "HYDRA_FULL_ERROR": "1", "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, cwd=run_dir.parent, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the run took more than {timeout:.0f} s")
            if kill_past is not None and any(
                int(p.name.removeprefix("step_")) > kill_past
                for p in (run_dir / "checkpoints").glob("step_*")
            ):
                os.kill(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    tail = "\n".join(log.read_text().splitlines()[-30:])
    peak = json.loads(mem.read_text()) if mem.exists() else {}
    return proc.returncode, tail, peak


def merge(*parts: list[str]) -> list[str]:
    """Concatenated override lists where a later ``key=value`` replaces an earlier one."""
    out: dict[str, str] = {}
    for part in parts:
        for o in part:
            out.pop(o.split("=", 1)[0], None)
            out[o.split("=", 1)[0]] = o
    return list(out.values())


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def finished(run_dir: Path, rc: int, tail: str, steps: int) -> list[dict]:
    """The run's metrics rows, after checking it finished ``steps`` steps with finite losses."""
    if rc != 0:
        print(tail)
        raise RuntimeError(f"train exited with {rc}: {tail.splitlines()[-1] if tail else ''}")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary.get("status") == "finished", f"status {summary.get('status')}"
    rows = read_rows(run_dir)
    train_rows = [r for r in rows if "loss/loss" in r]
    assert [r["step"] for r in train_rows] == list(range(1, steps + 1)), "steps logged"
    bad = [r["step"] for r in train_rows if not all(map(math.isfinite, _losses(r)))]
    assert not bad, f"non-finite loss / grad norm at steps {bad}"
    return rows


def _losses(row: dict) -> list[float]:
    return [row["loss/loss"], row["loss/pg_loss"], row["loss/grad_norm"]]


def speed(rows: list[dict], peak_flops: float | None) -> dict:
    """Generation tokens/s and MFU from the ledger's cumulative totals, steps 2..N (step 1
    holds the first calls' set-up: allocator, kernel selection)."""
    t = [r for r in rows if "loss/loss" in r]
    a, b = (t[0], t[-1]) if len(t) > 1 else ({k: 0.0 for k in t[0]}, t[0])

    def rate(key: str, secs: str) -> float:
        return (b[key] - a[key]) / max(b[secs] - a[secs], 1e-12)

    out = {
        "gen_tokens_per_s": rate("compute/gen_tokens", "compute/seconds_gen"),
        "train_tokens_per_s": rate("compute/train_tokens", "compute/seconds_train"),
        "gen_flops_per_s": rate("compute/flops_gen", "compute/seconds_gen"),
        "train_flops_per_s": rate("compute/flops_train", "compute/seconds_train"),
        "seconds_per_step": (b["compute/seconds"] - a["compute/seconds"]) / max(len(t) - 1, 1),
    }
    if peak_flops:
        out["gen_mfu"] = out["gen_flops_per_s"] / peak_flops
        out["train_mfu"] = out["train_flops_per_s"] / peak_flops
    return out


def speed_line(nums: dict) -> str:
    mem = nums.get("peak_memory", {})
    gib = mem.get("max_memory_allocated", mem.get("max_rss_bytes", 0)) / 2**30
    what = "peak alloc" if "max_memory_allocated" in mem else "max RSS"
    mfu = f", train MFU {nums['train_mfu']:.2%}" if "train_mfu" in nums else ""
    return (
        f"gen {nums['gen_tokens_per_s']:.0f} tok/s{mfu}, {nums['seconds_per_step']:.2f} s/step, "
        f"{what} {gib:.2f} GiB"
    )


def compare_runs(a: Path, b: Path) -> dict:
    """Differences between two runs' outputs: metrics (wall clock aside), eval details, final
    weights. ``equal`` is bitwise equality of all three."""
    from replay_exp.rollout.synthetic import WALL_CLOCK_KEYS

    ra, rb = read_rows(a), read_rows(b)
    diffs, first = [], None
    for x, y in zip(ra, rb, strict=False):
        for k in sorted(set(x) | set(y)):
            if k.startswith(WALL_CLOCK_KEYS) or x.get(k) == y.get(k):
                continue
            first = first or f"step {x.get('step')} {k}: {x.get(k)} vs {y.get(k)}"
            u, v = x.get(k), y.get(k)
            if isinstance(u, int | float) and isinstance(v, int | float):
                diffs.append((abs(u - v) / max(abs(u), abs(v), 1e-12), k))
    out = {
        "metrics_equal": first is None and len(ra) == len(rb),
        "rows": [len(ra), len(rb)],
        "first_difference": first,
        "max_rel_diff": max(diffs)[0] if diffs else 0.0,
        "max_rel_diff_key": max(diffs)[1] if diffs else None,
        "n_differing_values": len(diffs),
    }
    details = "eval_details.jsonl"
    out["eval_details_equal"] = (a / details).read_bytes() == (b / details).read_bytes()
    w = "final_model/model.safetensors"
    if (a / w).exists() and (b / w).exists():
        out["weights_equal"] = (a / w).read_bytes() == (b / w).read_bytes()
    out["equal"] = out["metrics_equal"] and out["eval_details_equal"]
    out["equal"] = out["equal"] and out.get("weights_equal", True)
    return out


# ---- in-process measurements ----------------------------------------------------------------


def shared_prefix_gaps(model_dir: Path, device: str, dtype_name: str) -> dict:
    """Shared-prompt vs full forward of ``model_dir`` on the device: log-prob gaps on the valid
    completion tokens, and the relative difference of the gradients of a fixed weighting."""
    import torch

    from replay_exp.models.shared_prefix import completion_logits, positions
    from replay_exp.models.tiny import load_pretrained
    from replay_exp.rollout.collect import tokenize_prompts

    model, tok = load_pretrained(model_dir, dtype_name)
    model = model.to(device).train()  # dropout is 0 in these configs; train mode = the update's
    G = 4
    prompts = ["12+345=", "7+8=", "999+1=", "4021+77="]  # unequal lengths: left padding differs
    ids, mask = tokenize_prompts(tok, [p for p in prompts for _ in range(G)])
    gen = torch.Generator().manual_seed(0)
    comp = torch.randint(3, len(tok), (ids.shape[0], 12), generator=gen)
    comp_mask = torch.ones_like(comp, dtype=torch.bool)
    comp_mask[0, 5:] = False  # an early EOS: padding after it
    comp_mask[5, 1:] = False
    perm = torch.randperm(ids.shape[0], generator=gen)  # rows of a prompt scattered (replay)
    ids, mask, comp, comp_mask = (x[perm].to(device) for x in (ids, mask, comp, comp_mask))
    weights = torch.randn(comp.shape, generator=gen).to(device)

    def full(model, ids, mask, comp, comp_mask):
        all_ids, all_mask = torch.cat([ids, comp], 1), torch.cat([mask, comp_mask], 1)
        out = model(
            input_ids=all_ids, attention_mask=all_mask.long(), position_ids=positions(all_mask)
        )
        return out.logits[:, ids.shape[1] - 1 : -1]

    def logp_and_grads(fn):
        model.zero_grad(set_to_none=True)
        logits = fn(model, ids, mask, comp, comp_mask).float()
        logp = torch.log_softmax(logits, -1).gather(-1, comp[..., None]).squeeze(-1)
        (logp * weights * comp_mask).sum().backward()
        grads = torch.cat([p.grad.float().flatten() for p in model.parameters()])
        return logp.detach()[comp_mask], grads

    shared, g_shared = logp_and_grads(completion_logits)
    ref, g_full = logp_and_grads(full)
    gap = (shared - ref).abs()
    model.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.empty_cache()
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "rows": int(ids.shape[0]),
        "distinct_prompts": len(prompts),
        "logp_absdiff_max": float(gap.max()),
        "logp_absdiff_mean": float(gap.mean()),
        "grad_rel_diff": float((g_shared - g_full).norm() / g_full.norm().clamp_min(1e-30)),
    }


def vllm_version(cwd: Path, timeout: float) -> str:
    """vllm's version, or SKIP (never a pass) where ``import vllm`` fails."""
    probe = subprocess.run(
        [*PYTHON, "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
        text=True, timeout=timeout, cwd=cwd,
    )  # fmt: skip
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"import vllm fails: {last[:200]}")
    return probe.stdout.strip()


# ---- the runs the checks share --------------------------------------------------------------


@dataclass
class Run:
    run_dir: Path
    overrides: list[str]
    steps: int
    rows: list[dict]
    peak_memory: dict

    @property
    def train_rows(self) -> list[dict]:
        return [r for r in self.rows if "loss/loss" in r]


class Lab:
    """The checks' shared state: the time budget, the folder, the measured matmul peak, the
    hub model and every training run, each made once (a run that failed fails again, with
    its error, in every check that needs it)."""

    def __init__(self, settings, tmp: Path):
        self.s = settings
        self.tmp = tmp
        self.t0 = time.perf_counter()
        self.peak_flops: float | None = None  # test_matmul_peak's; None: no MFU
        self.hub_dir: Path | None = None  # test_hub_model's
        self.run_to_run: float | None = None  # test_determinism's max rel. difference
        self.steps = settings.steps
        self.resume_steps = max(settings.steps, 8)  # room to kill after the snapshot of step 4
        self._runs: dict[str, Run | BaseException] = {}
        # Small evaluations (at the start and the end): a check, not a study.
        self.common = [
            f"device={settings.device}", f"model.dtype={settings.dtype}", "task.n_eval=64",
            "eval.sampled_problems=8", "logger.progress=false", "checkpoint.every=null",
            "save_final_model=false", f"schedule.max_steps={self.steps}",
            f"eval.every={self.steps}", "deterministic=true",
            *([] if settings.cuda else ["threads=1"]),
        ]  # fmt: skip

    def left(self) -> float:
        return self.s.budget_s - (time.perf_counter() - self.t0)

    def need(self, seconds: float) -> None:
        """FAIL (not run) when less than ``seconds`` of the budget is left."""
        if self.left() < seconds:
            pytest.fail(f"not run: {self.left():.0f} s of the budget left")

    def run_timeout(self) -> float:
        """Seconds one training run may take: 4 minutes (cpu: 2), within the budget."""
        return max(min(self.left() - 5, 240.0 if self.s.cuda else 120.0), 1.0)

    def model_args(self, model: str) -> list[str]:
        if model == "default":
            # The shipped warm start in every dtype (trained in float32, cast: never
            # retrained); the cache folder only matters if that ever breaks.
            return [f"model.warm_start.cache_dir={self.tmp / 'warm_start'}"]
        if self.hub_dir is None:
            raise RuntimeError("no hub model: hub_model failed")
        return [f"model={self.hub_dir}"]

    def run(self, key: str, overrides: list[str], steps: int) -> Run:
        """The finished run ``key`` (``<model>/<kind>``), trained on first use."""
        if key not in self._runs:
            run_dir = self.tmp / key
            try:
                rc, tail, peak = train(overrides, run_dir, self.run_timeout())
                self._runs[key] = Run(run_dir, overrides, steps,
                                      finished(run_dir, rc, tail, steps), peak)  # fmt: skip
            except Exception as e:
                self._runs[key] = e
        run = self._runs[key]
        if isinstance(run, BaseException):
            raise RuntimeError(f"the run {key} failed: {type(run).__name__}: {run}") from run
        return run

    def on_policy(self, model: str) -> Run:
        overrides = merge(
            self.model_args(model), self.common, ["buffer=on_policy", "save_final_model=true"]
        )
        return self.run(f"{model}/on_policy", overrides, self.steps)

    def fifo(self, model: str) -> Run:
        """FIFO with reuse 2; the default model's run is also the reference of determinism and
        resume (longer, snapshots every 2 steps, its final weights saved)."""
        n = self.resume_steps if model == "default" else self.steps
        extra = ["checkpoint.every=2", "save_final_model=true"] if model == "default" else []
        overrides = merge(self.model_args(model), self.common, FIFO,
                          [f"schedule.max_steps={n}", f"eval.every={n}", *extra])  # fmt: skip
        return self.run(f"{model}/fifo", overrides, n)


@pytest.fixture(scope="module")
def lab(settings):
    if not settings.required:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs CUDA (or GPU_CHECK_DEVICE=cpu: the same checks at CI sizes)")
    if settings.keep is not None:
        settings.keep.mkdir(parents=True, exist_ok=True)
        yield Lab(settings, settings.keep.resolve())
        return
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        yield Lab(settings, Path(tmp).resolve())


@pytest.fixture(scope="module", params=["default", "hub"])
def model(request) -> str:
    """The model of a per-model check (module scope: pytest runs one model's checks together)."""
    return request.param


# ---- the checks, in order -------------------------------------------------------------------


def test_env(lab, check):
    import torch
    import transformers

    nums, cuda = check.numbers, lab.s.cuda
    nums.update(
        python=platform.python_version(), torch=torch.__version__,
        torch_cuda=torch.version.cuda, transformers=transformers.__version__,
        cuda_available=torch.cuda.is_available(), no_site=bool(sys.flags.no_site),
    )  # fmt: skip
    for dist in ("hydra-core", "omegaconf", "math-verify", "numpy", "tokenizers",
                 "safetensors", "huggingface-hub"):  # fmt: skip
        nums[dist] = importlib.metadata.version(dist)
    import hydra  # noqa: F401  (the kit's or the image's: it must import)

    import replay_exp.train  # noqa: F401

    nums["replay_exp"] = str(Path(sys.modules["replay_exp"].__file__).parent.parent)
    if cuda:
        assert torch.cuda.is_available(), "device cuda but torch.cuda.is_available() is False"
        p = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info()
        nums.update(
            device_name=p.name, sm=f"{p.major}{p.minor}",
            multiprocessors=p.multi_processor_count, memory_total_gib=total / 2**30,
            memory_free_gib=free / 2**30,
        )  # fmt: skip
    else:
        torch.set_num_threads(1)  # the training runs use threads=1 too
        nums.update(device_name=platform.processor() or platform.machine(), threads=1)
    check.detail = ", ".join(f"{k} {v}" for k, v in nums.items() if k != "replay_exp")


def test_matmul_peak(lab, check):
    lab.need(5)
    cuda, dtype = lab.s.cuda, lab.s.dtype
    from replay_exp.compute.peak import matmul_peak

    check.numbers.update(matmul_peak(lab.s.device, dtype, 8192 if cuda else 1024))
    lab.peak_flops = check.numbers["flops_per_s"]
    check.detail = f"{check.numbers['n']}^3 {dtype}: {lab.peak_flops / 1e12:.3f} TFLOP/s"


def test_hub_model(lab, check):
    from safetensors import safe_open

    from replay_exp.models.tiny_hub import save_tiny_hub_model

    lab.need(5)
    sizes = HUB_SIZES[lab.s.device]
    out = save_tiny_hub_model(lab.tmp / "hub-qwen2", "qwen2", seed=0, **sizes)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        n = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118
    check.numbers.update(params=n, dir=str(out), **sizes)
    lab.hub_dir = out
    check.detail = f"{n / 1e6:.1f} M parameters (random), saved to {out}"


def test_mixed_precision(lab, check):
    """One AdamW step at lr 1e-6 on the hub model, three ways (bench/master_weights.py): bf16
    compute over float32 master weights keeps the float32 update, pure bf16 weights lose it
    (the bounds: tests/models/test_precision.py)."""
    lab.need(30)
    if lab.hub_dir is None:
        raise RuntimeError("no hub model: hub_model failed")
    out = lab.tmp / "master_weights.json"
    cmd = [*PYTHON, str(BENCH / "master_weights.py"), "--device", lab.s.device, "--model",
           str(lab.hub_dir), "--lrs", "1e-6", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=lab.tmp, capture_output=True, text=True,
                          timeout=max(min(lab.left() - 5, 120), 1))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {r["way"]: r for r in json.loads(out.read_text())["rows"]}
    check.numbers.update(rows=list(rows.values()))
    mp, pure = rows["master_bf16"], rows["pure_bf16"]
    check.detail = (
        f"lr 1e-6: bf16 compute + fp32 master keeps {mp['kept']:.4f} of the fp32 update "
        f"({mp['moved']:.1%} of entries moved); pure bf16 keeps {pure['kept']:.4f} "
        f"({pure['moved']:.1%} moved)"
    )
    assert mp["kept"] >= 0.95 and abs(mp["norm_ratio"] - 1) <= 0.05, "master weights lost it"
    assert pure["kept"] < 0.10, "pure bf16 kept the update: is the step above its resolution?"


def test_determinism(lab, check):
    lab.need(20)
    ref = lab.fifo("default")
    again = lab.tmp / "default" / "fifo_again"
    rc, tail, _ = train(ref.overrides, again, lab.run_timeout())
    finished(again, rc, tail, ref.steps)
    nums = check.numbers
    nums.update(compare_runs(ref.run_dir, again))
    lab.run_to_run = nums["max_rel_diff"]
    check.detail = f"{ref.steps} steps: metrics, eval details and final weights bitwise equal"
    assert nums["equal"], (
        f"two runs of the same config and seed differ: max rel. diff "
        f"{nums['max_rel_diff']:.2e} ({nums['max_rel_diff_key']}), first "
        f"{nums['first_difference']}"
        + ("; deterministic=true was on: an op without a deterministic kernel, or a "
           "setting the switch misses" if lab.s.cuda else "")
    )  # fmt: skip


def test_resume(lab, check):
    lab.need(30)
    ref = lab.fifo("default")
    killed = lab.tmp / "default" / "fifo_killed"
    train(ref.overrides, killed, lab.run_timeout(), kill_past=2)
    assert not (killed / "summary.json").exists(), "the run finished before it was killed"
    nums = check.numbers
    nums["rows_when_killed"] = len(read_rows(killed))
    rc, tail, _ = train(ref.overrides, killed, lab.run_timeout())
    finished(killed, rc, tail, ref.steps)
    assert "resuming from" in (killed / "train.log").read_text(), "did not resume"
    nums.update(compare_runs(ref.run_dir, killed))
    nums["run_to_run_max_rel_diff"] = lab.run_to_run
    check.detail = (
        f"killed with {nums['rows_when_killed']} rows logged, resumed: metrics, eval "
        "details and final weights bitwise equal to the uninterrupted run"
    )
    assert nums["equal"], (
        f"resumed run differs from the uninterrupted one: max rel. diff "
        f"{nums['max_rel_diff']:.2e} ({nums['max_rel_diff_key']}; two uninterrupted runs: "
        f"{lab.run_to_run}), first {nums['first_difference']}"
    )


def _async_runtime(lab, check, backend: str) -> None:
    """runtime=distributed, W=1 T=1 on the device: hf generators on the default model, or vLLM
    generators (sharing the GPU with the trainer process) on the hub model."""
    model = "default" if backend == "hf" else "hub"
    extra = []
    if backend == "vllm":
        extra = ["generation=vllm", "generation.gpu_memory_utilization=0.3"]
    run_dir = lab.tmp / model / f"async_{backend}"
    overrides = merge(lab.model_args(model), lab.common, DISTRIBUTED, extra)
    rc, tail, _ = train(overrides, run_dir, lab.run_timeout())
    finished(run_dir, rc, tail, lab.steps)
    rt = json.loads((run_dir / "summary.json").read_text())["runtime"]
    check.numbers.update({k: v for k, v in rt.items() if k != "off_policiness_hist"})
    check.detail = (
        f"{lab.steps} steps, W=1 T=1 ({backend}): reuse {rt['reuse']:.2f} (mu T/W "
        f"{rt['first_order_reuse']:.2f}), {rt['steps_per_second']:.2f} steps/s, "
        f"{rt['generated']} rollouts all accounted for"
    )
    assert rt["balanced"], f"rollouts unaccounted for: {rt}"


def test_async_runtime(lab, check):
    lab.need(30)
    _async_runtime(lab, check, "hf")


def test_throughput(lab, check):
    """bench/throughput.py on the device: trainer tokens/s and MFU at Qwen3-0.6B's shape
    (responses of 1 k and 4 k tokens), generation tokens/s (hf cached loop, the static fast
    path, vLLM where it imports), beside the published anchors; on CPU its --smoke shape."""
    lab.need(60)
    out = lab.tmp / "throughput.json"
    budget = max(min(lab.left() - 30, 200), 30)
    size = ["--max-seconds", str(int(budget))] if lab.s.cuda else ["--smoke", "--threads", "1"]
    cmd = [*PYTHON, str(BENCH / "throughput.py"), "--device", lab.s.device, "--out", str(out),
           *size]  # fmt: skip
    try:
        proc = subprocess.run(cmd, cwd=lab.tmp, capture_output=True, text=True,
                              timeout=budget + 25)  # fmt: skip
    except subprocess.TimeoutExpired as e:
        # The bench rewrites its JSON after every row: keep the rows it measured.
        print((e.stdout or b"").decode(errors="replace")[-6000:])
        if out.exists():
            check.numbers.update(json.loads(out.read_text()))
        raise
    print(proc.stdout[-6000:])
    assert proc.returncode == 0, proc.stderr[-2000:]
    check.numbers.update(json.loads(out.read_text()))
    check.detail = f"table above; {out.name} in the report's numbers"


def test_on_policy(lab, check, model):
    lab.need(20)
    run = lab.on_policy(model)
    t = run.train_rows
    dev_mean = max(abs(r["loss/ratio_mean"] - 1) for r in t)
    dev_max = max(max(r["loss/ratio_max"] - 1, 1 - r["loss/ratio_min"]) for r in t)
    nums = check.numbers
    nums.update(
        steps=run.steps, ratio_mean_dev_max=dev_mean, ratio_dev_max=dev_max,
        loss_last=t[-1]["loss/loss"], reward_first=t[0]["train/reward"],
        reward_last=t[-1]["train/reward"], peak_memory=run.peak_memory,
        **speed(run.rows, lab.peak_flops),
    )  # fmt: skip
    check.detail = (
        f"{run.steps} steps, |ratio_mean - 1| <= {dev_mean:.1e}, max |ratio - 1| "
        f"{dev_max:.1e}; {speed_line(nums)}"
    )
    tol_mean, tol_max = RATIO_TOL[lab.s.dtype]
    assert dev_mean <= tol_mean and dev_max <= tol_max, (
        f"on-policy importance ratio off 1: |mean - 1| {dev_mean:.2e}, max |r - 1| "
        f"{dev_max:.2e} > tol ({tol_mean}, {tol_max})"
    )


def test_fifo(lab, check, model):
    lab.need(20)
    run = lab.fifo(model)
    t = run.train_rows
    lag = max(r["buffer/batch_version_lag_max"] for r in t)
    nums = check.numbers
    nums.update(
        steps=run.steps, batch_version_lag_max=lag, loss_last=t[-1]["loss/loss"],
        ratio_min=min(r["loss/ratio_min"] for r in t),
        ratio_max=max(r["loss/ratio_max"] for r in t),
        peak_memory=run.peak_memory, **speed(run.rows, lab.peak_flops),
    )  # fmt: skip
    check.detail = f"{run.steps} steps, replayed up to {lag:.0f} versions old; {speed_line(nums)}"
    assert lag >= 1, "no batch held a replayed rollout of an older policy"


def test_shared_prefix(lab, check, model):
    lab.need(5)
    final = lab.on_policy(model).run_dir / "final_model"
    nums = check.numbers
    nums.update(shared_prefix_gaps(final, lab.s.device, lab.s.dtype))
    tol_max, tol_mean = LOGP_TOL[lab.s.dtype]
    check.detail = (
        f"log-prob gap max {nums['logp_absdiff_max']:.1e} mean "
        f"{nums['logp_absdiff_mean']:.1e}, gradient rel. diff {nums['grad_rel_diff']:.1e} "
        f"({lab.s.dtype}, tol {tol_max}, {tol_mean}, {GRAD_TOL[lab.s.dtype]})"
    )
    assert nums["logp_absdiff_max"] <= tol_max, f"log-prob gap > {tol_max}"
    assert nums["logp_absdiff_mean"] <= tol_mean, f"mean log-prob gap > {tol_mean}"
    assert nums["grad_rel_diff"] <= GRAD_TOL[lab.s.dtype], f"gradients > {GRAD_TOL[lab.s.dtype]}"


def test_async_runtime_vllm(lab, check):
    lab.need(60)
    if lab.s.skip_vllm:
        pytest.skip("GPU_CHECK_SKIP_VLLM")
    vllm_version(lab.tmp, min(120, lab.left()))
    _async_runtime(lab, check, "vllm")


def test_vllm(lab, check):
    """scripts/gpu_check_vllm.py, its own checks reported in ``numbers.results``."""
    lab.need(60)
    if lab.s.skip_vllm:
        pytest.skip("GPU_CHECK_SKIP_VLLM")
    nums = check.numbers
    nums["vllm"] = vllm_version(lab.tmp, min(120, lab.left()))
    out = lab.tmp / "vllm.json"
    cmd = [*PYTHON, str(SCRIPTS / "gpu_check_vllm.py"), "--device", lab.s.device, "--json",
           str(out), "--train-timeout", str(int(max(lab.left() / 4, 30)))]  # fmt: skip
    proc = subprocess.run(cmd, cwd=lab.tmp, timeout=max(lab.left() - 5, 1))
    sub = json.loads(out.read_text())["results"] if out.exists() else []
    nums["results"] = sub
    failed = [r["check"] for r in sub if not r["ok"]]
    check.detail = f"vllm {nums['vllm']}: {len(sub)}/{len(sub)} checks passed"
    assert proc.returncode == 0 and not failed, f"vllm checks failed: {failed or proc}"
