"""A few GRPO steps at Qwen3-0.6B's real width on CPU: memory and seconds per step (run by hand).

    python bench/qwen3_width.py [--out DIR] [--json FILE] [--steps 2] [--batch 8] [--group 4]
                                [--micro-batch 2] [--max-new-tokens 16] [--threads N]
                                [--smoke] [OVERRIDE ...]

Builds a Qwen3 with Qwen3-0.6B's published config (``replay_exp.models.tiny_hub.QWEN3_0_6B``:
width 1024, 28 layers, 16 query / 8 key-value heads of 128, vocabulary 151,936, head UNTIED as
the paper trains it; ~0.75 B parameters) with RANDOM weights (no hub is reachable here) and the
tiny BPE tokenizer of ``tiny_hub`` (436 tokens: the model's vocabulary is larger, as the real
one is larger than its tokenizer), saves it like a hub checkpoint (to a temporary directory, or
``--out`` to keep it: ~3 GB in float32), then runs the real entry point on it,

    python -m replay_exp.train model=<dir> task=gsm8k task.path=<fixture> ...

on the GSM8K-format test fixture with the chat template, ``--steps`` on-policy updates of
``--batch`` rollouts (groups of ``--group``), ``--max-new-tokens`` per completion, forward and
backward ``--micro-batch`` rollouts at a time (so micro-batching is exercised), no checkpoints,
no final model, one tiny evaluation at the end. Trailing ``OVERRIDE``s go to the train command
as they are (e.g. ``device=cuda``, ``logger.diagnostics=false``).

Prints and writes (``--json``) the parameter count, the child's peak resident memory
(``ru_maxrss``; host memory only, not GPU memory), seconds of generation and of the update per
step (``compute/seconds_gen`` / ``seconds_train`` from ``metrics.jsonl``; the first step
includes warm-up) and the child's wall time. ``--smoke`` runs the same at the tiny Qwen3's width
(``TINY_QWEN3``) in seconds: the test suite runs it (tests/models/test_qwen3.py) so the script
cannot rot.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from replay_exp.models import count_params
from replay_exp.models.tiny_hub import (
    QWEN3_0_6B,
    TINY_QWEN3,
    build_bpe_tokenizer,
    build_qwen3,
    save_hub_model,
)
from replay_exp.runlog import read_metrics

GSM8K = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "math" / "gsm8k.jsonl"


def train_overrides(args: argparse.Namespace, model_dir: Path, run_dir: Path) -> list[str]:
    """The train command line after ``python -m replay_exp.train``."""
    return [
        f"model={model_dir}", "model.chat_template=true",
        "task=gsm8k", f"task.path={args.gsm8k}", "task.n_eval=1",
        "buffer=on_policy", f"schedule.batch_size={args.batch}",
        f"schedule.max_steps={args.steps}", f"algo.group_size={args.group}",
        f"algo.micro_batch_size={args.micro_batch}",
        f"generation.max_new_tokens={args.max_new_tokens}",
        "eval.at_start=false", f"eval.every={args.steps}", "eval.n_samples=1",
        "eval.pass_k=[1]", "eval.sampled_problems=1",
        "logger.progress=false", "checkpoint.every=null", "save_final_model=false",
        *([] if any(o.startswith("device=") for o in args.overrides) else ["device=cpu"]),
        *([f"threads={args.threads}"] if args.threads else []),
        f"run_dir={run_dir}", *args.overrides,
    ]  # fmt: skip


def per_step(rows: list[dict]) -> list[dict]:
    """Generation and update seconds of each step, from the cumulative compute/* columns."""
    out, gen0, train0 = [], 0.0, 0.0
    for r in rows:
        if "loss/loss" not in r:
            continue
        gen, train = r["compute/seconds_gen"], r["compute/seconds_train"]
        out.append({
            "step": r["step"], "seconds_gen": gen - gen0, "seconds_train": train - train0,
            "loss": r["loss/loss"], "ratio_min": r["loss/ratio_min"],
            "ratio_max": r["loss/ratio_max"], "response_len": r["train/response_len"],
            "tokens": r["loss/tokens"],
        })  # fmt: skip
        gen0, train0 = gen, train
    return out


def run(args: argparse.Namespace, workdir: Path) -> dict:
    config = TINY_QWEN3 if args.smoke else QWEN3_0_6B
    model_dir = Path(args.out) if args.out else workdir / "model"
    t0 = time.perf_counter()
    tok = build_bpe_tokenizer()
    model = build_qwen3(config, tok, seed=0)
    build_s = time.perf_counter() - t0
    n_params, n_non_embedding = count_params(model), count_params(model, non_embedding=True)
    t0 = time.perf_counter()
    save_hub_model(model, tok, model_dir)
    save_s = time.perf_counter() - t0
    del model  # the child loads its own copy
    gc.collect()
    print(f"built {n_params / 1e6:.1f} M params in {build_s:.1f} s, saved in {save_s:.1f} s "
          f"to {model_dir}", flush=True)  # fmt: skip

    run_dir = workdir / "run"
    cmd = [sys.executable, "-m", "replay_exp.train", *train_overrides(args, model_dir, run_dir)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall_s = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"train failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    # ru_maxrss of the waited-for children: KiB on Linux (only the train child was waited for).
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    steps = per_step(read_metrics(run_dir / "metrics.jsonl"))
    later = steps[1:] or steps  # the first step includes warm-up
    return {
        "width": "tiny (--smoke)" if args.smoke else "Qwen3-0.6B",
        "config": config,
        "params": n_params,
        "params_non_embedding": n_non_embedding,
        "peak_rss_gib": peak_kib / 2**20,
        "build_seconds": build_s,
        "save_seconds": save_s,
        "train_wall_seconds": wall_s,
        "steps": steps,
        "seconds_gen_per_step": sum(s["seconds_gen"] for s in later) / len(later),
        "seconds_train_per_step": sum(s["seconds_train"] for s in later) / len(later),
        "finite_loss": all(math.isfinite(s["loss"]) for s in steps),
        "command": " ".join(cmd),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--out", help="keep the saved model here (default: a temporary dir)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8, help="rollouts per update (B = R)")
    ap.add_argument("--group", type=int, default=4, help="samples per prompt (G)")
    ap.add_argument("--micro-batch", type=int, default=2, help="algo.micro_batch_size")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None, help="default: the trainer's default")
    ap.add_argument("--gsm8k", default=str(GSM8K), help="GSM8K-format problems file")
    ap.add_argument("--smoke", action="store_true", help="the tiny Qwen3's width, in seconds")
    ap.add_argument("overrides", nargs="*", help="more train overrides, passed as they are")
    args = ap.parse_args(argv)
    if args.micro_batch >= args.batch:
        ap.error(f"--micro-batch {args.micro_batch} must be < --batch {args.batch}")
    with tempfile.TemporaryDirectory(prefix="qwen3_width_") as tmp:
        result = run(args, Path(tmp))
    r = result
    print(f"{r['width']}: {r['params'] / 1e6:.1f} M params ({r['params_non_embedding'] / 1e6:.1f}"
          f" M without the input embedding), peak RSS {r['peak_rss_gib']:.2f} GiB, train child "
          f"{r['train_wall_seconds']:.1f} s; per step after the first: generation "
          f"{r['seconds_gen_per_step']:.2f} s, update "
          f"{r['seconds_train_per_step']:.2f} s")  # fmt: skip
    for s in result["steps"]:
        print(f"  step {s['step']}: generation {s['seconds_gen']:.2f} s, update "
              f"{s['seconds_train']:.2f} s, loss {s['loss']:.4g}, ratio [{s['ratio_min']:.6f}, "
              f"{s['ratio_max']:.6f}], {s['tokens']} completion tokens")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
