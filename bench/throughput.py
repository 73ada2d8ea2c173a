"""Trainer and generation throughput at Qwen3-0.6B's shape on one device (run by hand, on a GPU).

    python bench/throughput.py [--device cuda|cpu] [--out FILE] [--max-seconds 170]
                               [--shape qwen3-0.6b|tiny] [--layers N] [--prompt-len 256]
                               [--lengths 1024 4096] [--batch 64 16] [--micro-batch 8 2]
                               [--warmup 2] [--steps 3] [--checkpointing auto|on|off]
                               [--compute-dtype bfloat16|float32] [--gen-prompts 64]
                               [--gen-tokens 1024] [--no-train] [--no-gen] [--threads N] [--smoke]

The model: ``Qwen3ForCausalLM`` of Qwen3-0.6B's published config (``replay_exp.models.tiny_hub.
QWEN3_0_6B``, the shape ``bench/qwen3_width.py`` runs: width 1024, 28 layers, 16 query / 8
key-value heads of 128, vocabulary 151,936, head untied; ~0.75 B parameters) with RANDOM weights
(no hub here), float32 master weights computing in bfloat16 through
``replay_exp.models.precision.compute_in`` (autocast hooks; default on cuda; float32 compute on
cpu). ``--layers N`` keeps the width with N layers (a CPU sanity run); ``--shape tiny`` is the
tiny Qwen3 of the tests. One device, one process.

1. Trainer. For each response length L of ``--lengths`` a batch of B rollouts (``--batch``, one
   per length: default 64 x 1024 and 16 x 4096, ~70-80 k tokens per step) with prompts of
   ``--prompt-len`` tokens, built by ``replay_exp.rollout.synthetic.rollout_batch``: random token
   ids (every prompt distinct, so no prompt forward is shared and every row costs a full
   [prompt | completion] forward), no padding, advantages N(0, 1), behaviour log-probs
   -log(V) + N(0, 0.01) (the random policy's level: ratios near 1). One update is the project's
   ``replay_exp.update.policy_update`` with ``algo=grpo`` composed from conf/ (``compose``) and
   ``algo.micro_batch_size`` = ``--micro-batch`` (gradients accumulated over B / m micro-batches,
   one AdamW step, the algo's lr / betas, grad clip 1.0). ``--checkpointing auto`` runs a length
   without gradient checkpointing and, on a CUDA out-of-memory error, again with it
   (``gradient_checkpointing_enable(use_reentrant=False)``); ``on`` / ``off`` force it. ``--warmup``
   updates are not timed; the result is the median of ``--steps`` timed updates
   (``torch.cuda.synchronize`` around each on cuda).

   tokens/s = B (P + L) / median seconds (every token the forward and backward run over; the
   loss tokens, B L, are in the JSON). FLOPs of one update, the compute ledger's model
   (``replay_exp.compute.ledger``'s functions, called here): ``(3 + extra_forwards) x
   forward_flops`` with
   ``forward_flops = sum over rows of 2 N T + 2 n_layers a T^2``, T = P + L, N =
   ``ledger.flop_params`` (every parameter but the input embedding: the untied lm_head included;
   596.0 M at Qwen3-0.6B's shape), a = the attention width (query heads x head_dim = 2048 for
   Qwen3-0.6B, twice its hidden size; QK^T and AV contract over it: ``ledger.attention_width``,
   what the training loop's ledger uses too). So one update costs
   6 N T + 6 n_layers a T^2 per row: the attention term is the causal half of the usual
   12 n_layers a T^2 (PaLM's convention counts the masked half too). Gradient checkpointing's
   extra forward is NOT counted (MFU, not hardware FLOPs utilisation). MFU = FLOPs / (median
   seconds x peak), printed against two peaks: the measured matmul peak of this device (cuda:
   8192^3 bfloat16, mean of 10 after 3 warm-ups, CUDA events; cpu: 1024^3 float32, best of 10,
   torch's thread count: as ``tests/gpu/test_gpu_check.py``'s ``matmul_peak``) and the
   datasheet's bfloat16 dense peak where the device name is one we know (H100 SXM: 989 TFLOP/s;
   H200: 989 TFLOP/s; none for H100 PCIe / NVL or any other card).

2. Generation with the hf backend (``replay_exp.rollout.hf.HFGenerator``, sharing the trainer's
   module): ``--gen-prompts`` distinct random prompts of ``--prompt-len`` tokens, one sample
   each, ``--gen-tokens`` new tokens at temperature 1, top_p 1. No row stops early: the EOS id
   given to the generator is V (the vocabulary size), which no sampler can draw (ids are < V);
   the table says whether every row reached the full length. Rows: ``sampler=cached_loop``;
   ``sampler=static`` with and without ``compile=True`` only where "static" is in
   ``replay_exp.rollout.hf.SAMPLERS`` (and ``HFGenerator`` takes ``compile``), "not available"
   otherwise (checked at run time); vLLM (``replay_exp.rollout.vllm_engine.VLLMGenerator``,
   bfloat16, the model saved to a temporary dir, EOS id V as its stop token) only where
   ``import vllm`` works, "vllm not installed" otherwise. Each row:
   one untimed warm-up generation (16 new tokens; the full length under compile, so that the
   timed call does not compile again), then one timed generation; tokens/s = generated tokens /
   seconds (prefill included).

3. One table: our rows beside published numbers of others (labelled "others'": the prime-rl
   trainer baselines for Qwen3-0.6B on 1 x H100, from PrimeIntellect-ai/prime-rl
   ``benchmarks/baselines/*.json``, their settings in the row). No verl or NeMo-RL row: their
   published performance pages (searched) give no single-GPU Qwen3-0.6B trainer number. Results
   as JSON with ``--out``.

``--max-seconds`` (default 170): a section is skipped, and its row says so, when by an estimate it
would end after that many seconds of wall time: a trainer length, the last length's wall time
scaled by tokens per step; a generation row, its own warm-up's rate (the eager samplers warm up
on 16 tokens, the estimate includes their start-up), before that the cached loop's seconds for
the eager static sampler, and 60 s for ``compile=True`` or for vLLM. The rows run in the order
cached loop, static compiled, static eager, vLLM, so the last ones are dropped first. With
``--out`` the JSON is rewritten after every row, so a run killed from outside keeps what it
measured. The wall time is printed. First H100 run (2026-12-05, gpu_check's budget of 129 s):
the trainer rows fit, then the cached loop's 64 x 1024-token decode ran past the limit (the
check killed it at 154 s) — the reason for the warm-up estimate.

``--smoke``: the tiny Qwen3, lengths 32 / 64, batch 4 in micro-batches of 2, prompts of 16,
1 warm-up + 1 timed update, 4 prompts x 16 new tokens, bfloat16 compute (the GPU run's code
path), no ``compile=True`` row (its compile alone takes ~20 s on CPU): seconds on CPU;
tests/test_bench.py runs it (no timing asserted).
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from replay_exp.compute.ledger import attention_width, flop_params, forward_flops
from replay_exp.compute.peak import matmul_peak as measured_peak
from replay_exp.config.composition import compose
from replay_exp.models import count_params
from replay_exp.models.precision import compute_in
from replay_exp.models.tiny_hub import (
    QWEN3_0_6B,
    TINY_QWEN3,
    build_bpe_tokenizer,
    build_qwen3,
    save_hub_model,
)
from replay_exp.rollout import hf
from replay_exp.rollout.base import SamplingParams
from replay_exp.rollout.synthetic import rollout_batch
from replay_exp.update import policy_update

SHAPES = {"qwen3-0.6b": QWEN3_0_6B, "tiny": TINY_QWEN3}
# bfloat16 dense tensor-core peaks from NVIDIA's datasheets (FLOP/s), by device-name substring.
DATASHEET_BF16_DENSE = (("H200", 989e12), ("H100", 989e12))
# Published numbers of others (not measured here). prime-rl's trainer benchmark baselines:
# PrimeIntellect-ai/prime-rl, benchmarks/baselines/benchmark-1xh100-Qwen--Qwen3-0.6B-rl-full-1gpu-
# Recompute-flash_attention_3-{16384,65536}-cp1-ep1.json (timestamp 2026-01-15, "device_name":
# "NVIDIA H100 80GB HBM3", "micro_batches": 2). Means over their steps; throughput, step time
# and MFU as prime-rl defines them (its own FLOP model and peak), not re-derived here.
ANCHORS = [
    {
        "who": "prime-rl (others')",
        "phase": "train, RL full",
        "setting": "1xH100 80GB HBM3, Qwen3-0.6B, seq 16384, synthetic, 2 micro-batches, "
        "recompute (AC), FA3",
        "tokens_per_s": 11896.0,
        "seconds_per_step": 1.992,
        "mfu": 0.1108,
        "peak_mem_gib": 12.5,
        "source": "PrimeIntellect-ai/prime-rl benchmarks/baselines/benchmark-1xh100-Qwen--Qwen3-"
        "0.6B-rl-full-1gpu-Recompute-flash_attention_3-16384-cp1-ep1.json",
    },
    {
        "who": "prime-rl (others')",
        "phase": "train, RL full",
        "setting": "1xH100 80GB HBM3, Qwen3-0.6B, seq 65536, synthetic, 2 micro-batches, "
        "recompute (AC), FA3",
        "tokens_per_s": 10147.0,
        "seconds_per_step": 12.18,
        "mfu": 0.268,
        "peak_mem_gib": 19.6,
        "source": "PrimeIntellect-ai/prime-rl benchmarks/baselines/benchmark-1xh100-Qwen--Qwen3-"
        "0.6B-rl-full-1gpu-Recompute-flash_attention_3-65536-cp1-ep1.json",
    },
]
# Rough guesses, for --max-seconds, of what the compiled static row (compile, CUDA graphs and
# two fast generations) and the vLLM row (engine start with CUDA graphs, two generations) cost.
COMPILE_GUESS_S, VLLM_START_GUESS_S = 60.0, 60.0
TABLE_HEAD = (
    "| who | phase | setting | tokens/s | s/step | MFU (measured peak) | MFU (datasheet) "
    "| peak mem GiB |"
)


# -- FLOPs and peaks ---------------------------------------------------------------------------


def update_flops(
    n_params: int, n_layers: int, attn_width: int, seq_lengths: torch.Tensor, extra_forwards=0
) -> float:
    """Model FLOPs of one update over rows of ``seq_lengths`` (prompt + completion) tokens: the
    compute ledger's ``(3 + extra_forwards) x forward_flops`` (module docstring)."""
    return (3 + extra_forwards) * forward_flops(n_params, n_layers, attn_width, seq_lengths)


def mfu(flops: float, seconds: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: ``flops`` done in ``seconds`` over ``peak`` FLOP/s (None: no
    peak known)."""
    if not peak or not seconds or not math.isfinite(seconds):
        return None
    return flops / seconds / peak


def datasheet_peak(device_name: str) -> float | None:
    """bfloat16 dense datasheet peak of an H100 SXM / H200 (by name); None for others (the
    PCIe and NVL parts have lower peaks)."""
    name = device_name.upper()
    if "PCIE" in name or "NVL" in name:
        return None
    return next((peak for key, peak in DATASHEET_BF16_DENSE if key in name), None)


def matmul_peak(device: str, n: int | None = None) -> float:
    """Measured matmul FLOP/s of ``device`` (``replay_exp.compute.peak``): cuda n^3 (8192) in
    bfloat16, cpu n^3 (1024) in float32."""
    cuda = device.startswith("cuda")
    dtype = "bfloat16" if cuda else "float32"
    return measured_peak(device, dtype, n or (8192 if cuda else 1024))["flops_per_s"]


# -- trainer -----------------------------------------------------------------------------------


def synthetic_batch(B: int, P: int, L: int, vocab: int, seed: int):
    """B rollouts of P distinct random prompt tokens and L completion tokens, no padding,
    advantages N(0, 1), behaviour log-probs near a random policy's -log(V)."""
    g = torch.Generator().manual_seed(seed)
    return rollout_batch(
        torch.randint(0, vocab, (B, P), generator=g),
        torch.randint(0, vocab, (B, L), generator=g),
        behaviour_logp_BxC=-math.log(vocab) + 0.01 * torch.randn(B, L, generator=g),
        advantage=torch.randn(B, generator=g),
        reward=(torch.rand(B, generator=g) > 0.5).float(),
    )


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "cpu " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"cpu {platform.processor()}".strip()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def set_checkpointing(model, on: bool) -> None:
    if on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()


def time_updates(model, batch, algo, L: int, device: str, warmup: int, steps: int) -> dict:
    """``warmup`` untimed then ``steps`` timed ``policy_update`` calls with a fresh AdamW."""
    opt = torch.optim.AdamW(
        model.parameters(), lr=algo.lr, betas=tuple(algo.betas), weight_decay=algo.weight_decay
    )
    times, stats = [], {}
    try:
        for i in range(warmup + steps):
            sync(device)
            t0 = time.perf_counter()
            stats = policy_update(model, opt, batch, algo, 1.0, L, version=1)
            sync(device)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    finally:
        opt.zero_grad(set_to_none=True)
        del opt
        free(device)
    return {"times": times, "stats": stats}


def free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def train_row(model, args, L: int, B: int, m: int, peaks: dict, shape: dict) -> dict:
    P, device = args.prompt_len, args.device
    algo = compose(["algo=grpo", f"algo.micro_batch_size={m}"]).algo
    batch = synthetic_batch(B, P, L, shape["vocab"], seed=L)
    modes = {"auto": [False, True], "on": [True], "off": [False]}[args.checkpointing]
    if not device.startswith("cuda") and args.checkpointing == "auto":
        modes = [False]
    out = None
    for ckpt in modes:
        free(device)  # after a failed try too (its tensors died with its traceback)
        set_checkpointing(model, ckpt)
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        try:
            out = time_updates(model, batch, algo, L, device, args.warmup, args.steps)
            break
        except torch.OutOfMemoryError:
            print(f"  L={L}: out of memory, gradient checkpointing {onoff(ckpt)}", flush=True)
    set_checkpointing(model, False)
    if out is None:
        free(device)
        return {"kind": "train", "L": L, "B": B, "micro": m, "error": "out of memory"}
    seconds = statistics.median(out["times"])
    lengths = batch.prompt_mask_BxP.sum(1) + batch.completion_mask_BxC.sum(1)
    flops = update_flops(
        shape["flop_params"], shape["layers"], shape["attn_width"], lengths,
        out["stats"].get("extra_forwards", 0),
    )  # fmt: skip
    tokens = int(lengths.sum())
    return {
        "kind": "train", "L": L, "P": P, "B": B, "micro": m, "checkpointing": ckpt,
        "tokens_per_step": tokens, "loss_tokens_per_step": int(out["stats"]["tokens"]),
        "seconds": out["times"], "seconds_median": seconds, "tokens_per_s": tokens / seconds,
        "loss_tokens_per_s": out["stats"]["tokens"] / seconds, "flops_per_step": flops,
        "mfu_measured": mfu(flops, seconds, peaks["measured"]),
        "mfu_datasheet": mfu(flops, seconds, peaks["datasheet"]),
        "peak_mem_gib": (torch.cuda.max_memory_allocated() / 2**30
                         if device.startswith("cuda") else None),
        "loss": out["stats"]["loss"],
    }  # fmt: skip


# -- generation --------------------------------------------------------------------------------


def gen_variants(smoke: bool = False) -> list[tuple[str, dict | None, str]]:
    """(name, HFGenerator keyword arguments or None = not run, why not), in the order they run:
    the compiled static sampler before the eager one, which --max-seconds drops first."""
    rows: list[tuple[str, dict | None, str]] = [("hf cached_loop", {"sampler": "cached_loop"}, "")]
    if "static" not in hf.SAMPLERS:
        why = f"not available (replay_exp.rollout.hf.SAMPLERS = {hf.SAMPLERS})"
        return rows + [("hf static compile", None, why), ("hf static", None, why)]
    if smoke:  # compiling takes ~20 s on CPU even at the tiny shape
        rows.append(("hf static compile", None, "skipped in --smoke"))
    elif "compile" in inspect.signature(hf.HFGenerator).parameters:
        rows.append(("hf static compile", {"sampler": "static", "compile": True}, ""))
    else:
        rows.append(("hf static compile", None, "not available (HFGenerator takes no compile)"))
    return rows + [("hf static", {"sampler": "static"}, "")]


def time_generation(
    gen, prompts, mask, n_tokens: int, warm_tokens: int, device: str, left=None
) -> dict:
    """A warm-up generation of ``warm_tokens``, then the timed one of ``n_tokens``. ``left()``
    (seconds before --max-seconds) skips the timed one when the warm-up's rate, which includes
    its start-up, puts it past the limit: a launch-bound decode of 1 k tokens can take minutes."""
    sync(device)
    t0 = time.perf_counter()
    gen.generate(prompts, mask, SamplingParams(1.0, 1.0, warm_tokens), seed=0)
    sync(device)
    warm_s = time.perf_counter() - t0
    expected_s = warm_s * n_tokens / warm_tokens
    if left is not None and expected_s > left():
        return {
            "warmup_seconds": warm_s, "expected_seconds": expected_s,
            "error": f"skipped (--max-seconds): {warm_tokens} warm-up tokens took {warm_s:.1f} s, "
            f"so {n_tokens} would take ~{expected_s:.0f} s, {left():.0f} s left",
        }  # fmt: skip
    t0 = time.perf_counter()
    out = gen.generate(prompts, mask, SamplingParams(1.0, 1.0, n_tokens), seed=1)
    sync(device)
    seconds = time.perf_counter() - t0
    tokens = int(out.completion_mask_BxC.sum())
    return {
        "warmup_seconds": warm_s, "seconds": seconds, "tokens": tokens,
        "tokens_per_s": tokens / seconds,
        "full_length": bool(tokens == prompts.shape[0] * n_tokens and not out.finished_B.any()),
    }  # fmt: skip


def gen_rows(model, tok, args, shape: dict, deadline, left, save) -> list[dict]:
    device, n, G, P = args.device, args.gen_prompts, args.gen_tokens, args.prompt_len
    V = shape["vocab"]
    eos = V  # never sampled: token ids are < V, so every row runs the full length
    g = torch.Generator().manual_seed(7)
    prompts = torch.randint(0, V, (n, P), generator=g)
    mask = torch.ones_like(prompts, dtype=torch.bool)
    setting = f"{n} prompts x ({P} + {G} new), no EOS"
    rows, first_s = [], 0.0  # first_s: the cached loop's seconds, an eager row's expected cost
    for name, kwargs, why in gen_variants(args.smoke):
        row = {"kind": "gen", "name": name, "setting": setting}
        if kwargs is None:
            rows.append(row | {"error": why})
        elif deadline(COMPILE_GUESS_S if kwargs.get("compile") else first_s):
            rows.append(row | {"error": "skipped (--max-seconds)"})
        else:
            warm = G if kwargs.get("compile") else min(16, G)
            gen = None
            try:
                gen = hf.HFGenerator(model, tok.pad_token_id, eos, chunk_size=n, **kwargs)
                rows.append(row | time_generation(gen, prompts, mask, G, warm, device, left))
                if "seconds" in rows[-1]:
                    first_s = first_s or rows[-1]["warmup_seconds"] + rows[-1]["seconds"]
            except Exception as e:  # an optional sampler failing must not sink the table
                if kwargs["sampler"] == "cached_loop":
                    raise
                rows.append(row | {"error": f"{type(e).__name__}: {str(e)[:200]}"})
            del gen  # a compiled static sampler keeps its cache while it lives
            free(device)
        print(f"  generation {name}: {fmt_gen(rows[-1])}", flush=True)
        save(rows)
    late = deadline(VLLM_START_GUESS_S)
    rows.append(vllm_row(model, tok, args, prompts, mask, eos, setting, late))
    print(f"  generation vllm: {fmt_gen(rows[-1])}", flush=True)
    return rows


def vllm_row(model, tok, args, prompts, mask, eos, setting, late: bool) -> dict:
    row = {"kind": "gen", "name": "vllm", "setting": setting + ", bfloat16"}
    try:
        import vllm  # noqa: F401
    except ImportError:
        return row | {"error": "vllm not installed"}
    if late:
        return row | {"error": "skipped (--max-seconds)"}
    from replay_exp.rollout.vllm_engine import VLLMGenerator

    gen = None
    try:
        with tempfile.TemporaryDirectory(prefix="throughput_vllm_") as tmp:
            save_hub_model(model, tok, tmp)
            t0 = time.perf_counter()
            gen = VLLMGenerator(
                model, tok, tmp, pad_id=tok.pad_token_id, eos_id=eos,
                max_model_len=args.prompt_len + args.gen_tokens, dtype="bfloat16",
                chunk_size=prompts.shape[0], device=args.device,
            )  # fmt: skip
            row["start_seconds"] = time.perf_counter() - t0
            row |= time_generation(gen, prompts, mask, args.gen_tokens, 16, args.device)
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        if gen is not None:
            gen.close()
        free(args.device)
    return row


# -- table -------------------------------------------------------------------------------------


def onoff(flag: bool) -> str:
    return "on" if flag else "off"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def fmt_gen(r: dict) -> str:
    if "error" in r:
        return r["error"]
    return (f"{r['tokens_per_s']:.0f} tokens/s ({r['tokens']} tokens in {r['seconds']:.2f} s, "
            f"warm-up {r['warmup_seconds']:.1f} s, full length {r['full_length']})")  # fmt: skip


def table(result: dict) -> list[str]:
    dev, prec = result["device_name"], result["precision"]
    lines = [TABLE_HEAD, "|---|---|---|---|---|---|---|---|"]
    for r in result["train"]:
        setting = f"{r['B']} x ({result['prompt_len']} + {r['L']}), micro {r['micro']}"
        if "error" in r:
            lines.append(f"| ours | train GRPO | {setting}, {dev} | {r['error']} | - | - | - | - |")
            continue
        mem = "-" if r["peak_mem_gib"] is None else f"{r['peak_mem_gib']:.1f}"
        lines.append(
            f"| ours | train GRPO | {setting}, ckpt {onoff(r['checkpointing'])}, "
            f"{prec}, {dev} | {r['tokens_per_s']:.0f} | {r['seconds_median']:.3f} | "
            f"{pct(r['mfu_measured'])} | {pct(r['mfu_datasheet'])} | {mem} |"
        )
    for r in result["gen"]:
        if "error" in r:
            lines.append(f"| ours | gen {r['name']} | {r['setting']}, {dev} | {r['error']} "
                         "| - | - | - | - |")  # fmt: skip
        else:
            lines.append(
                f"| ours | gen {r['name']} | {r['setting']}, {dev} | {r['tokens_per_s']:.0f} | "
                f"{r['seconds']:.2f} (1 call) | - | - | - |"
            )
    for a in ANCHORS:
        lines.append(f"| {a['who']} | {a['phase']} | {a['setting']} | {a['tokens_per_s']:.0f} | "
                     f"{a['seconds_per_step']:.2f} | {pct(a['mfu'])} (theirs) | - | "
                     f"{a['peak_mem_gib']:.1f} |")  # fmt: skip
    return lines


# -- main --------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b")
    ap.add_argument("--layers", type=int, help="keep the width, this many layers")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 16], help="one per length")
    ap.add_argument("--micro-batch", type=int, nargs="+", default=[8, 2], help="one per length")
    ap.add_argument("--warmup", type=int, default=2, help="untimed updates per length")
    ap.add_argument("--steps", type=int, default=3, help="timed updates per length (median)")
    ap.add_argument("--checkpointing", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--compute-dtype", choices=["bfloat16", "float32"], default=None,
                    help="default: bfloat16 on cuda (and --smoke), float32 on cpu")  # fmt: skip
    ap.add_argument("--gen-prompts", type=int, default=64)
    ap.add_argument("--gen-tokens", type=int, default=1024)
    ap.add_argument("--no-train", action="store_true")
    ap.add_argument("--no-gen", action="store_true")
    ap.add_argument("--max-seconds", type=float, default=170.0,
                    help="skip sections that would start later than this")  # fmt: skip
    ap.add_argument("--threads", type=int, default=None, help="torch threads (cpu)")
    ap.add_argument("--smoke", action="store_true", help="tiny shape, seconds on CPU")
    args = ap.parse_args(argv)
    if args.smoke:
        args.shape, args.layers, args.prompt_len = "tiny", None, 16
        args.lengths, args.batch, args.micro_batch = [32, 64], [4, 4], [2, 2]
        args.warmup, args.steps, args.gen_prompts, args.gen_tokens = 1, 1, 4, 16
        args.compute_dtype = args.compute_dtype or "bfloat16"  # the GPU run's code path
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    if not len(args.lengths) == len(args.batch) == len(args.micro_batch):
        ap.error("--lengths, --batch and --micro-batch need one value each per length")
    if args.compute_dtype is None:
        args.compute_dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    return args


def run(args: argparse.Namespace) -> dict:
    t_start = time.perf_counter()

    def left() -> float:
        return args.max_seconds - (time.perf_counter() - t_start)

    def deadline(expected_s: float = 0.0) -> bool:
        """Would a section expected to take ``expected_s`` end past --max-seconds?"""
        return expected_s > left()

    def save() -> None:
        """Write what is measured so far, so that a run killed from outside keeps its rows."""
        if args.out:
            result["wall_seconds"] = time.perf_counter() - t_start
            Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")

    if args.threads:
        torch.set_num_threads(args.threads)
    config = SHAPES[args.shape] | ({"num_hidden_layers": args.layers} if args.layers else {})
    tok = build_bpe_tokenizer()
    t0 = time.perf_counter()
    model = build_qwen3(config, tok, seed=0).to(args.device)
    compute_in(model, args.compute_dtype)
    build_s = time.perf_counter() - t0
    shape = {
        "vocab": model.config.vocab_size, "layers": model.config.num_hidden_layers,
        "hidden": model.config.hidden_size, "attn_width": attention_width(model.config),
        "params": count_params(model), "flop_params": flop_params(model),
    }  # fmt: skip
    cuda = args.device.startswith("cuda")
    name = torch.cuda.get_device_name(args.device) if cuda else cpu_name()
    peaks = {"measured": matmul_peak(args.device, 256 if args.smoke else None),
             "datasheet": datasheet_peak(name) if cuda else None}  # fmt: skip
    sheet = "-" if not peaks["datasheet"] else f"{peaks['datasheet'] / 1e12:.0f}"
    layers = f" ({args.layers} layers)" if args.layers else ""
    print(f"{args.shape}{layers}: {shape['params'] / 1e6:.1f} M params, N = "
          f"{shape['flop_params'] / 1e6:.1f} M (FLOP params), built in {build_s:.1f} s; {name}, "
          f"{torch.get_num_threads()} threads; fp32 weights, {args.compute_dtype} compute; "
          f"matmul peak measured {peaks['measured'] / 1e12:.3f} TFLOP/s, datasheet {sheet} "
          "TFLOP/s", flush=True)  # fmt: skip
    result = {
        "device": args.device, "device_name": name, "shape": args.shape, "config": config,
        **shape, "precision": f"fp32 weights/{args.compute_dtype} compute",
        "prompt_len": args.prompt_len, "peak_measured": peaks["measured"],
        "peak_datasheet": peaks["datasheet"], "torch": torch.__version__,
        "warmup": args.warmup, "steps": args.steps, "train": [], "gen": [], "anchors": ANCHORS,
        "command": " ".join(sys.argv),
    }  # fmt: skip
    if not args.no_train:
        # A row's expected cost: the last measured row's wall time scaled by tokens per step.
        last_s, last_tokens = 0.0, None
        for L, B, m in zip(args.lengths, args.batch, args.micro_batch, strict=True):
            tokens = B * (args.prompt_len + L)
            expected_s = last_s * tokens / last_tokens if last_tokens else 0.0
            if deadline(expected_s):
                result["train"].append({"kind": "train", "L": L, "B": B, "micro": m,
                                        "error": "skipped (--max-seconds)",
                                        "expected_seconds": expected_s})  # fmt: skip
                continue
            t_row = time.perf_counter()
            r = train_row(model, args, L, B, m, peaks, shape)
            last_s, last_tokens = time.perf_counter() - t_row, tokens
            result["train"].append(r)
            save()
            if "error" not in r:
                print(f"  train L={L}: {B} x ({args.prompt_len} + {L}) = {r['tokens_per_step']} "
                      f"tokens/step, micro {m}, checkpointing {onoff(r['checkpointing'])}: median "
                      f"{r['seconds_median']:.3f} s/step, {r['tokens_per_s']:.0f} tokens/s, MFU "
                      f"{pct(r['mfu_measured'])} (measured peak) / {pct(r['mfu_datasheet'])} "
                      "(datasheet)", flush=True)  # fmt: skip
    if not args.no_gen:

        def save_gen(rows: list[dict]) -> None:
            result["gen"] = rows
            save()

        result["gen"] = gen_rows(model, tok, args, shape, deadline, left, save_gen)
    result["wall_seconds"] = time.perf_counter() - t_start
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    result = run(args)
    print()
    print("\n".join(table(result)))
    print(f"\nFLOPs/update = 3 x sum_rows(2 N T + 2 n_layers a T^2), N = "
          f"{result['flop_params']}, n_layers = {result['layers']}, a = {result['attn_width']} "
          "(recompute not counted); others' rows: their published numbers, not measured "
          "here.")  # fmt: skip
    print(f"wall time {result['wall_seconds']:.1f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
