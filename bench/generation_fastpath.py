"""Tokens per second of hf generation: cached_loop vs static vs static + compile (run by hand).

    python bench/generation_fastpath.py [--batch 64] [--groups 8] [--new-tokens 128]
                                        [--repeats 3] [--device cpu|cuda] [--dtype auto]
                                        [--threads N] [--seed 0] [--smoke]

For each model it builds an ``HFGenerator`` per arm (``sampler=cached_loop``,
``sampler=static``, ``sampler=static`` with ``compile=True``), all sampling the same module, and
times ``generate`` on one batch: ``--batch`` rows, ``--batch / --groups`` distinct held-out
prompts of the embedded task repeated ``--groups`` times (a GRPO batch: each distinct prompt is
prefilled once), ``--new-tokens`` tokens per row at temperature 1 (top_p 1). EOS is disabled
(the generators get an end id no token has), so every arm generates exactly batch x new-tokens
tokens. Models: the embedded default (the shipped warm-started tiny Llama, hidden 128, 3 layers)
and a random Qwen2 at hidden 512, 8 layers, 8 heads, MLP 1536 (both with the char tokenizer's
small vocabulary). Each arm runs once untimed (the compile arm compiles then: its first-call
seconds are printed), then ``--repeats`` timed calls with the same seed; the table gives the
median seconds, tokens/s, the ratio to cached_loop, and whether the arm drew the same tokens as
cached_loop (the samplers' contract: the same draws up to float rounding of the logits).

The arms alternate within each repeat, so a machine whose load drifts hurts them alike; on a
shared machine the numbers still move by tens of percent between runs. ``--device cuda`` on a
GPU is where the compile arm's CUDA graphs matter (docs/real-models.md, "The fast path").
``--smoke`` (batch 8, 8 tokens, 1 repeat, the embedded default only: seconds, most of them
compiling) only checks that it all runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from replay_exp.config.composition import compose
from replay_exp.models import build_tiny_model, load_policy
from replay_exp.models.precision import compute_in
from replay_exp.rollout import HFGenerator, SamplingParams
from replay_exp.rollout.collect import tokenize_prompts
from replay_exp.tasks import make_task

ARMS = {"cached_loop": ("cached_loop", False), "static": ("static", False),
        "static+compile": ("static", True)}  # fmt: skip
QWEN2 = {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "intermediate_size": 1536}


def models(smoke: bool):
    """(label, policy, tokenizer, task) for the embedded default and (not in ``--smoke``) the
    larger random Qwen2."""
    cfg = compose([])
    task = make_task(cfg.task)
    policy, tok, _ = load_policy(cfg.model, cfg.task, task)
    yield "embedded default (tiny llama)", policy, tok, task
    if smoke:  # one model, one compile: tests/rollout/test_static_sampler.py covers Qwen2 / 3
        return
    sizes = QWEN2
    qcfg = compose(["model.arch=qwen2", "model.max_position_embeddings=4096",
                    *(f"model.{k}={v}" for k, v in sizes.items())])  # fmt: skip
    label = f"random qwen2 h{sizes['hidden_size']} x{sizes['num_layers']}"
    yield label, build_tiny_model(qcfg.model, tok, seed=0), tok, task


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def bench_model(policy, tok, task, args) -> list[dict]:
    prompts = [p.prompt for p in task.eval_problems()[: args.batch // args.groups]]
    ids, mask = tokenize_prompts(tok, [p for p in prompts for _ in range(args.groups)])
    params = SamplingParams(1.0, 1.0, args.new_tokens)
    no_eos = -1  # no token has it: every row runs new_tokens steps
    gens = {name: HFGenerator(policy, tok.pad_token_id, no_eos, chunk_size=args.batch,
                              sampler=sampler, compile=comp)
            for name, (sampler, comp) in ARMS.items()}  # fmt: skip
    first, times, out = {}, {name: [] for name in ARMS}, {}
    for rep in range(args.repeats + 1):  # repeat 0: warm-up (compiles), untimed
        for name, gen in gens.items():
            sync(args.device)
            t0 = time.perf_counter()
            g = gen.generate(ids, mask, params, seed=args.seed)
            sync(args.device)
            dt = time.perf_counter() - t0
            if rep == 0:
                first[name], out[name] = dt, g.completion_ids_BxC
            else:
                times[name].append(dt)
    rows = []
    for name in ARMS:
        med = statistics.median(times[name])
        rows.append({"arm": name, "first_s": first[name], "median_s": med,
                     "tok_s": ids.shape[0] * args.new_tokens / med,
                     "same": torch.equal(out[name], out["cached_loop"])})  # fmt: skip
    base = rows[0]["tok_s"]
    for r in rows:
        r["ratio"] = r["tok_s"] / base
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--groups", type=int, default=8, help="rows per distinct prompt")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto", help="compute dtype: auto = bfloat16 on cuda")
    ap.add_argument("--threads", type=int, default=None, help="default: torch's")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="batch 8, 8 tokens, 1 repeat")
    args = ap.parse_args()
    if args.smoke:
        args.batch, args.new_tokens, args.repeats = 8, 8, 1
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    dtype = args.dtype if args.dtype != "auto" else (
        "bfloat16" if args.device == "cuda" else "float32")  # fmt: skip
    header = (f"device {args.device}, compute dtype {dtype}, threads {torch.get_num_threads()}, "
              f"batch {args.batch} ({args.batch // args.groups} prompts x {args.groups}), "
              f"{args.new_tokens} new tokens per row, T=1, seed {args.seed}, median of "
              f"{args.repeats} repeats after 1 untimed")  # fmt: skip
    tables = []
    for label, policy, tok, task in models(args.smoke):
        policy = compute_in(policy.to(args.device).eval(), dtype)
        n = sum(p.numel() for p in policy.parameters())
        for r in bench_model(policy, tok, task, args):
            tables.append((label, n, r))
            print(label, r, flush=True)
    print()
    print(header)
    print("| model | params | arm | first call s | median s | tokens/s | vs cached_loop "
          "| same tokens |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for label, n, r in tables:
        print(f"| {label} | {n / 1e6:.2f} M | {r['arm']} | {r['first_s']:.2f} | "
              f"{r['median_s']:.3f} | {r['tok_s']:.0f} | {r['ratio']:.2f}x | "
              f"{'yes' if r['same'] else 'NO'} |")  # fmt: skip


if __name__ == "__main__":
    main()
