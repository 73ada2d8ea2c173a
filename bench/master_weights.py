"""What one Adam step keeps at post-training learning rates: float32, bf16 compute over float32
master weights (``models.precision``), pure bf16 weights.

    python bench/master_weights.py [--device cuda] [--model DIR] [--json FILE] [--smoke]

Builds a random Qwen2 (``--model DIR``: a ``save_pretrained`` folder, e.g. the device check's
99.5 M hub-format Qwen2; default: hidden 128, 2 layers, the char tokenizer), one fixed batch of
32 rollouts (12 prompt + 16 completion tokens, random ids, advantages +-1), and takes one
``policy_update`` (GRPO, AdamW, no weight decay) from the same weights in three ways, at each
learning rate of ``--lrs``. For each it prints the share of entries that moved and the share of
the float32 update kept, ``<d, d_fp32> / |d_fp32|^2`` (tests/models/test_precision.py derives
the bounds: >= 0.95 for master weights, < 0.1 for pure bf16 at lr 1e-6). ``--smoke``: one lr.
The device check runs it on CUDA (tests/gpu/test_gpu_check.py, ``mixed_precision``).
"""

from __future__ import annotations

import argparse
import copy
import json

import torch

from replay_exp.config.composition import compose
from replay_exp.models import build_char_tokenizer, build_tiny_model, load_pretrained
from replay_exp.models.precision import compute_in
from replay_exp.rollout.synthetic import rollout_batch
from replay_exp.update import policy_update

LRS = (6e-5, 1e-6, 6.8e-8)  # a small-model lr; a post-training one; the README's Qwen2.5-7B line
WAYS = ("float32", "master_bf16", "pure_bf16")


def setup(model_dir: str | None = None, device: str = "cpu", seed: int = 0):
    """(algo node, float32 model on ``device``, batch, completion length)."""
    cfg = compose([
        "model.arch=qwen2", "model.hidden_size=128", "model.num_layers=2",
        "model.intermediate_size=256", "algo.weight_decay=0.0",
    ])  # fmt: skip
    if model_dir:
        model, tok = load_pretrained(model_dir)
    else:
        tok = build_char_tokenizer()
        model = build_tiny_model(cfg.model, tok, seed=seed)
    g = torch.Generator().manual_seed(seed)
    B, P, C, V = 32, 12, 16, len(tok)
    batch = rollout_batch(
        torch.randint(4, V, (B, P), generator=g),
        torch.randint(4, V, (B, C), generator=g),
        advantage=torch.randint(0, 2, (B,), generator=g).float() * 2 - 1,
    )
    return cfg.algo, model.to(device), batch, C


def prepared(model: torch.nn.Module, way: str) -> torch.nn.Module:
    """A copy of the float32 ``model`` set up the ``way`` of :data:`WAYS`."""
    model = copy.deepcopy(model)
    if way == "master_bf16":
        return compute_in(model, "bfloat16")
    return model.to(torch.bfloat16) if way == "pure_bf16" else model


def adam_step(model: torch.nn.Module, algo, batch, C: int, lr: float) -> torch.Tensor:
    """One AdamW step at ``lr``; the change of every parameter, flattened, in float32."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    before = [p.detach().float().clone() for p in model.parameters()]
    policy_update(model, opt, batch, algo, 1.0, C, version=0)
    params = list(model.parameters())
    return torch.cat(
        [(p.detach().float() - b).flatten() for p, b in zip(params, before, strict=True)]
    ).cpu()


def kept(d: torch.Tensor, ref: torch.Tensor) -> float:
    """The share of the reference update ``ref`` that ``d`` holds: <d, ref> / |ref|^2."""
    d, ref = d.double(), ref.double()
    return float(torch.dot(d, ref) / torch.dot(ref, ref))


def measure(model, algo, batch, C: int, lrs=LRS) -> list[dict]:
    rows = []
    for lr in lrs:
        d = {way: adam_step(prepared(model, way), algo, batch, C, lr) for way in WAYS}
        for way in WAYS:
            rows.append({
                "lr": lr, "way": way, "moved": float((d[way] != 0).float().mean()),
                "kept": kept(d[way], d["float32"]),
                "norm_ratio": float(d[way].double().norm() / d["float32"].double().norm()),
            })  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=None, help="a save_pretrained folder (default: tiny)")
    ap.add_argument("--lrs", type=float, nargs="+", default=list(LRS))
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="one learning rate (1e-6)")
    args = ap.parse_args()
    algo, model, batch, C = setup(args.model, args.device)
    n = sum(p.numel() for p in model.parameters())
    rows = measure(model, algo, batch, C, [1e-6] if args.smoke else args.lrs)
    print(f"{n / 1e6:.1f} M parameters on {args.device}; one AdamW step, batch 32 x (12 + 16)")
    print("| lr | way | entries moved | update kept | norm / float32's |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['lr']:.2g} | {r['way']} | {r['moved']:.2%} | {r['kept']:.4f} | "
              f"{r['norm_ratio']:.4f} |")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"params": n, "device": args.device, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
