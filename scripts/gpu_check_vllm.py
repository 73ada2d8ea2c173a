"""The GPU check of the vllm backend (``generation=vllm``): one short script, each check
reported PASS/FAIL with its timing, exit code 1 if any failed. The device check
(tests/gpu/test_gpu_check.py) runs it as its ``vllm`` check when ``import vllm`` works.

    python scripts/gpu_check_vllm.py                 # on one GPU
    python scripts/gpu_check_vllm.py --device cpu    # the same on the CPU build (.venv-vllm)

Needs only installed wheels (``pip install -e '.[dev,gpu]'``) and no hub: the model is a tiny
RANDOM Qwen2 built here and saved with ``save_pretrained`` to a temporary directory.

1. ``env``        versions, the device.
2. ``engine``     ``VLLMGenerator`` starts on the saved model (CUDA graphs unless
                  ``--enforce-eager``) and receives the trainer's weights.
3. ``generate``   rollouts on the arithmetic task's prompts: padding / mask / EOS conventions,
                  same seed -> same samples.
4. ``logprobs``   the engine's behaviour log-probs vs the trainer's recomputation
                  (``replay_exp.update.policy_logprobs``), within the dtype's tolerance.
5. ``rl_sync``    a few GRPO steps (``replay_exp.update.policy_update``; random advantages: a
                  random model earns no reward), each followed by ``sync_weights``; after each,
                  the engine agrees with the NEW weights and no longer with the OLD ones.
6. ``snapshot``   a lagging engine's snapshot (share_weights=False) restores its weights.
7. ``train``      ``python -m replay_exp.train generation=vllm`` for 3 steps on the tiny Qwen2
                  (sync every step), and ``train_lagging`` with ``schedule.sync_every=2``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # keep the report readable

import numpy as np  # noqa: E402
import torch  # noqa: E402

RESULTS: list[dict] = []
# Tolerances on |engine log-prob - trainer log-prob| over completion tokens: (max, mean).
TOL = {"float32": (1e-3, 1e-4), "bfloat16": (0.3, 0.03), "float16": (0.15, 0.015)}


def check(name: str):
    """Run the decorated function now as check ``name``; record PASS/FAIL, seconds, details."""

    def run(fn):
        t0 = time.perf_counter()
        try:
            detail = fn() or ""
            ok = True
        except Exception as e:  # a failed check is reported, and the next one still runs
            traceback.print_exc()
            detail, ok = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}", False
        secs = time.perf_counter() - t0
        RESULTS.append({"check": name, "ok": ok, "seconds": round(secs, 2), "detail": detail})
        print(f"[{'PASS' if ok else 'FAIL'}] {name} ({secs:.1f} s) {detail}", flush=True)
        return ok

    return run


def gaps(policy, batch, temperature: float) -> tuple[float, float]:
    """(max, mean) |behaviour log-prob - trainer's recomputation| over completion tokens."""
    from replay_exp.update import policy_logprobs

    with torch.no_grad():
        logp, _ = policy_logprobs(policy, batch, temperature)
    m = batch.completion_mask_BxC
    d = (logp.float().cpu()[m] - batch.behaviour_logp_BxC[m]).abs()
    return float(d.max()), float(d.mean())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: "
                    "bfloat16 on cuda, float32 on cpu)")  # fmt: skip
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs in checks 2-6")
    ap.add_argument("--rl-steps", type=int, default=3)
    ap.add_argument("--skip-train", action="store_true", help="skip the end-to-end runs")
    ap.add_argument("--train-timeout", type=int, default=None, help="seconds per run")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    tol_max, tol_mean = TOL[dtype]
    t_start = time.perf_counter()
    torch.manual_seed(0)
    tmp = tempfile.TemporaryDirectory(prefix="gpu_check_")  # removed at exit
    st: dict = {}

    @check("env")
    def _():
        import transformers
        import vllm

        info = f"torch {torch.__version__}, transformers {transformers.__version__}, "
        info += f"vllm {vllm.__version__}, python {sys.version.split()[0]}"
        if args.device == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("--device cuda but torch.cuda.is_available() is False")
            p = torch.cuda.get_device_properties(0)
            info += f"; {p.name}, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}"
            info += f", CUDA {torch.version.cuda}"
        print(info)
        return info

    @check("build")
    def _():
        from replay_exp.config.composition import compose
        from replay_exp.models import build_char_tokenizer, build_tiny_model
        from replay_exp.tasks import make_task

        cfg = compose(["model=tiny_qwen2", "model.warm_start.steps=0", "algo.lr=1e-2"])
        tok = build_char_tokenizer()
        policy = build_tiny_model(cfg.model, tok, seed=0)
        st["dir"] = Path(tmp.name) / "tiny-qwen2"
        policy.save_pretrained(st["dir"])
        tok.save_pretrained(st["dir"])
        with torch.no_grad():  # the trainer differs from the saved weights: start-up must push
            for p in policy.parameters():
                p.add_(0.02 * torch.randn_like(p))
        st.update(cfg=cfg, tok=tok, task=make_task(cfg.task))
        st["policy"] = policy.to(device=args.device, dtype=getattr(torch, dtype))
        n = sum(p.numel() for p in policy.parameters())
        return f"{n / 1e6:.2f} M params, {dtype}, saved to {st['dir']}"

    @check("engine")
    def _():
        from replay_exp.rollout.vllm_engine import VLLMGenerator

        t0 = time.perf_counter()
        st["gen"] = VLLMGenerator(
            st["policy"], st["tok"], str(st["dir"]), pad_id=st["tok"].pad_token_id,
            eos_id=st["tok"].eos_token_id, max_model_len=64, dtype=dtype, seed=0,
            gpu_memory_utilization=0.3, enforce_eager=args.enforce_eager, share_weights=False,
            device=args.device,
        )  # fmt: skip
        mode = "CUDA graphs + torch.compile" if args.device == "cuda" else "torch.compile"
        graphs = "eager" if args.enforce_eager else mode
        return f"start {time.perf_counter() - t0:.1f} s ({graphs}), first sync " + (
            f"{st['gen'].last_sync_seconds:.3f} s"
        )

    from replay_exp.rollout import SamplingParams
    from replay_exp.rollout.collect import generate_rollouts

    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=16)
    G = 8

    def rollouts(seed: int, n_prompts: int = 16, p: SamplingParams = params):
        problems = st["task"].sample_train(np.random.default_rng(seed), n_prompts)
        return generate_rollouts(
            st["gen"], st["tok"], st["task"], problems, G, p, seed=seed, step=0, first_uid=0,
            first_group=0,
        )  # fmt: skip

    @check("generate")
    def _():
        t0 = time.perf_counter()
        a = rollouts(1)
        secs = time.perf_counter() - t0
        b = rollouts(1)
        ids, mask, logp = a.completion_ids_BxC, a.completion_mask_BxC, a.behaviour_logp_BxC
        eos, pad = st["tok"].eos_token_id, st["tok"].pad_token_id
        lengths = mask.sum(1)
        assert torch.equal(mask, torch.arange(ids.shape[1])[None] < lengths[:, None]), "mask"
        assert (ids[~mask] == pad).all() and (logp[~mask] == 0).all(), "padding"
        assert torch.isfinite(logp).all() and (logp[mask] <= 0).all(), "log-probs"
        finished = ids.gather(1, (lengths - 1)[:, None]).squeeze(1) == eos
        assert ((lengths == params.max_new_tokens) | finished).all(), "early stop without EOS"
        assert torch.equal(a.completion_ids_BxC, b.completion_ids_BxC), "same seed differs"
        assert not torch.equal(a.completion_ids_BxC, rollouts(2).completion_ids_BxC), "seed"
        st["batch"] = a
        tokens = int(lengths.sum())
        return (
            f"{len(a)} rollouts, {tokens} tokens in {secs:.2f} s ({tokens / secs:.0f} tok/s), "
            f"{int(finished.sum())} finished; same seed -> same samples"
        )

    @check("logprobs")
    def _():
        out = []
        for temperature in (1.0, 0.7):
            p = SamplingParams(temperature, 1.0, 16)
            mx, mean = gaps(st["policy"], rollouts(3, p=p), temperature)
            out.append(f"T={temperature}: max {mx:.2e} mean {mean:.2e}")
            assert mx <= tol_max and mean <= tol_mean, f"{out[-1]} > tol ({tol_max}, {tol_mean})"
        return "; ".join(out) + f" (tol max {tol_max}, mean {tol_mean})"

    @check("rl_sync")
    def _():
        from replay_exp.update import policy_update

        gen, policy, algo = st["gen"], st["policy"], st["cfg"].algo
        opt = torch.optim.AdamW(policy.parameters(), lr=algo.lr, betas=tuple(algo.betas))
        lines = []
        for step in range(1, args.rl_steps + 1):
            batch = rollouts(10 + step)
            batch.advantage_B = torch.randn(len(batch))  # a random model earns no reward
            old = copy.deepcopy(policy)
            stats = policy_update(policy, opt, batch, algo, 1.0, params.max_new_tokens)
            gen.sync_weights(policy, step)
            fresh = rollouts(100 + step)
            new_max, new_mean = gaps(policy, fresh, 1.0)
            old_max, old_mean = gaps(old, fresh, 1.0)
            lines.append(
                f"step {step}: loss {stats['loss']:+.3f}, sync {gen.last_sync_seconds:.3f} s, "
                f"|engine-new| mean {new_mean:.2e} max {new_max:.2e}, "
                f"|engine-old| mean {old_mean:.2e}"
            )
            print("  " + lines[-1], flush=True)
            assert fresh.version_B.eq(step).all(), f"rollouts carry version {fresh.version_B[0]}"
            assert new_max <= tol_max and new_mean <= tol_mean, "engine != new weights"
            assert old_mean > max(5 * new_mean, tol_mean), "engine still matches OLD weights"
        return f"{args.rl_steps} steps; last: {lines[-1]}"

    @check("snapshot")
    def _():
        gen, policy = st["gen"], st["policy"]
        state = copy.deepcopy(gen.state_dict())
        noisy = {k: v + 0.05 * torch.randn_like(v) for k, v in policy.state_dict().items()}
        gen.sync_weights(noisy, 99)
        moved = gaps(policy, rollouts(20), 1.0)[1]
        gen.load_state_dict(state)
        back_max, back_mean = gaps(policy, rollouts(20), 1.0)
        assert moved > 5 * tol_mean, f"noisy weights did not reach the engine ({moved:.2e})"
        assert back_max <= tol_max and back_mean <= tol_mean, "restored weights differ"
        return f"noisy: mean {moved:.2e}; restored (v{gen.version}): mean {back_mean:.2e}"

    if "gen" in st:
        st["gen"].close()
    st.pop("gen", None)
    st.pop("policy", None)
    if args.device == "cuda":
        torch.cuda.empty_cache()

    def train(name: str, extra: list[str]):
        @check(name)
        def _():
            run_dir = Path(tmp.name) / name
            # -S passes on (the kit emulation of tests/test_gpu_kit.py runs without site).
            python = [sys.executable, *(["-S"] if sys.flags.no_site else [])]
            cmd = [
                *python, "-m", "replay_exp.train", "generation=vllm", "model=tiny_qwen2",
                "model.warm_start.steps=0", "debug=smoke", f"run_dir={run_dir}",
                "logger.progress=false", "checkpoint.every=0", "save_final_model=false",
                f"device={args.device}", "generation.enforce_eager=true", *extra,
            ]  # fmt: skip
            if args.device == "cpu":
                cmd.append("threads=2")
            print("  $ " + " ".join(cmd), flush=True)
            timeout = args.train_timeout or (240 if args.device == "cuda" else 600)
            proc = subprocess.run(  # cwd: never import the project from the current folder
                cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp.name
            )
            if proc.returncode != 0:
                print("\n".join((proc.stdout + proc.stderr).splitlines()[-40:]))
                raise RuntimeError(f"exit code {proc.returncode}")
            summary = json.loads((run_dir / "summary.json").read_text())
            rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
            assert summary.get("status") == "finished", f"status {summary.get('status')}"
            steps = [r["step"] for r in rows if "policy/generator_version" in r]
            versions = [r["policy/generator_version"] for r in rows if r["step"] in steps]
            return f"{len(steps)} steps logged, generator versions {versions}"

    if not args.skip_train:
        train("train", [])
        train("train_lagging", ["schedule.sync_every=2"])

    failed = [r["check"] for r in RESULTS if not r["ok"]]
    total = time.perf_counter() - t_start
    print("\n==== gpu_check summary ====")
    for r in RESULTS:
        print(f"{'PASS' if r['ok'] else 'FAIL'}  {r['check']:<14} {r['seconds']:>7.1f} s")
    print(f"{len(RESULTS) - len(failed)}/{len(RESULTS)} passed in {total:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": RESULTS, "seconds": total}, indent=2))
    tmp.cleanup()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
