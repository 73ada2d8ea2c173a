"""Rebuild the warm start shipped with the package (``replay_exp/models/shipped/``):

    python -m replay_exp.models.ship_warm_start [key=value ...] [--force]
    python -m replay_exp.models.ship_warm_start --tokenizer NAME [--vocab-size V] [key=value ...]

trains the warm start of the config composed from the overrides (the embedded default with
none) with one thread and writes it as the shipped copy of its recipe, with its recipe and the
SHA-256 of its weights in ``warm_start.json`` (``replay_exp.models.warm_start``). With
``--tokenizer`` it instead trains a byte-level BPE on the text of the composed task's training
problems (:data:`TOKENIZER_PROBLEMS` of them, drawn with seed 0; never held-out ones) and
writes it as ``replay_exp/models/tokenizers/NAME.json`` (``model.tokenizer=NAME``). A command-line
tool above the config layer: nothing in the package imports it.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM

from replay_exp.config.composition import compose
from replay_exp.models.precision import DTYPES
from replay_exp.models.tiny import build_tiny_model
from replay_exp.models.tokenizer import TOKENIZER_DIR, build_tokenizer, train_bpe_tokenizer
from replay_exp.models.warm_start import (
    SHIPPED_DIR,
    file_sha256,
    recipe,
    recipe_key,
    train_and_save,
)
from replay_exp.tasks import make_task

TOKENIZER_PROBLEMS = 20_000  # training problems whose text trains a shipped subword tokenizer


def ship_tokenizer(name: str, vocab_size: int, overrides: list[str], force: bool = False) -> Path:
    """Train a byte-level BPE on the composed task's training problems (prompt, a space, the
    answer) and write it as the shipped tokenizer ``name``; returns its file."""
    import numpy as np

    target = TOKENIZER_DIR / f"{name}.json"
    if target.exists() and not force:
        raise SystemExit(f"{target} exists; pass --force to rebuild it")
    task = make_task(compose(overrides).task)
    problems = task.sample_train(np.random.default_rng(0), TOKENIZER_PROBLEMS)
    tok = train_bpe_tokenizer([f"{p.prompt} {p.answer}" for p in problems], vocab_size)
    TOKENIZER_DIR.mkdir(exist_ok=True)
    tok.backend_tokenizer.save(str(target))
    target.chmod(0o644)
    return target


def ship(overrides: list[str], force: bool = False, dtype: str = "float32") -> Path:
    """Train the warm start of the config composed from ``overrides`` and save it as the
    package's shipped copy of that recipe (module docstring); returns its directory.
    ``dtype``: the stored weights' dtype (trained in float32 either way; ``bfloat16`` halves
    the file, and every run loads the same rounded weights, cast back to its own dtype)."""
    cfg = compose(overrides)
    if cfg.model.pretrained or cfg.model.warm_start.steps == 0:
        raise SystemExit("only a warm-started tiny model (model.pretrained=null, steps > 0) ships")
    tok = build_tokenizer(cfg.model.tokenizer)
    key = recipe_key(cfg.model, cfg.task, tok)
    target = SHIPPED_DIR / key
    if target.exists():
        if not force:
            raise SystemExit(f"{target} exists; pass --force to rebuild it")
        shutil.rmtree(target)
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    with torch.random.fork_rng(devices=[]):
        torch.set_num_threads(1)  # the same reduction order whatever the core count
        train_and_save(
            lambda: build_tiny_model(cfg.model, tok, cfg.model.warm_start.seed),
            cfg.model, make_task(cfg.task), tok, target, key,
            extra={
                "recipe": recipe(cfg.model, cfg.task, tok),
                "trained_with": versions,
            },
        )  # fmt: skip
    info = json.loads((target / "warm_start.json").read_text())
    if dtype != "float32":
        model = AutoModelForCausalLM.from_pretrained(str(target), dtype=DTYPES[dtype])
        model.save_pretrained(target)
        info["stored_dtype"] = dtype
    info["sha256"] = file_sha256(target / "model.safetensors")
    (target / "warm_start.json").write_text(json.dumps(info, indent=2) + "\n")
    target.chmod(0o755)  # package data: readable by everyone (mkdtemp makes 0700 / 0600)
    for f in target.iterdir():
        f.chmod(0o644)
    return target


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m replay_exp.models.ship_warm_start",
        description="Train the embedded warm start and ship it with the package.",
    )
    p.add_argument("overrides", nargs="*", help="train-config overrides (key=value)")
    p.add_argument("--force", action="store_true", help="replace an existing shipped copy")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="dtype of the stored weights (default float32)")  # fmt: skip
    p.add_argument("--tokenizer", metavar="NAME", help="ship a subword tokenizer instead")
    p.add_argument("--vocab-size", type=int, default=320, help="with --tokenizer (default 320)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.tokenizer:
        target = ship_tokenizer(args.tokenizer, args.vocab_size, args.overrides, args.force)
        print(f"shipped tokenizer {target.name}: {len(build_tokenizer(args.tokenizer))} tokens")
        return
    target = ship(args.overrides, args.force, args.dtype)
    info = json.loads((target / "warm_start.json").read_text())
    print(f"shipped {target.name}: model.safetensors sha256 {info['sha256']}")
    print("update SHIPPED_SHA256 in tests/models/test_shipped_warm_start.py and the README")


if __name__ == "__main__":
    main()
