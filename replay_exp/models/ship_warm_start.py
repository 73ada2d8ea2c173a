"""Rebuild the warm start shipped with the package (``replay_exp/models/shipped/``):

    python -m replay_exp.models.ship_warm_start [key=value ...] [--force]

trains the warm start of the config composed from the overrides (the embedded default with
none) with one thread and writes it as the shipped copy of its recipe, with its recipe and the
SHA-256 of its weights in ``warm_start.json`` (``replay_exp.models.warm_start``). A command-line
tool above the config layer: nothing in the package imports it.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
import transformers

from replay_exp.config.composition import compose
from replay_exp.models.tiny import build_tiny_model
from replay_exp.models.tokenizer import build_char_tokenizer
from replay_exp.models.warm_start import (
    SHIPPED_DIR,
    file_sha256,
    recipe,
    recipe_key,
    train_and_save,
)
from replay_exp.tasks import make_task


def ship(overrides: list[str], force: bool = False) -> Path:
    """Train the warm start of the config composed from ``overrides`` and save it as the
    package's shipped copy of that recipe (module docstring); returns its directory."""
    cfg = compose(overrides)
    if cfg.model.pretrained or cfg.model.warm_start.steps == 0:
        raise SystemExit("only a warm-started tiny model (model.pretrained=null, steps > 0) ships")
    tok = build_char_tokenizer()
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
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    target = ship(args.overrides, args.force)
    info = json.loads((target / "warm_start.json").read_text())
    print(f"shipped {target.name}: model.safetensors sha256 {info['sha256']}")
    print("update SHIPPED_SHA256 in tests/models/test_shipped_warm_start.py and the README")


if __name__ == "__main__":
    main()
