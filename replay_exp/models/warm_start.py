"""Supervised warm start of the embedded model: shipped with the package, or trained and cached.

RL needs a policy that already solves some problems: the tiny model is first trained with
teacher forcing on the task's training split (loss on the answer and EOS tokens only).

- **Shipped**: the package carries the warm-started weights of the embedded default
  (``replay_exp/models/shipped/<recipe key>/``, a ``save_pretrained`` directory), so the
  default run starts from the same bytes on every machine (CPU float rounding makes a retrained
  copy differ between machines). A config whose recipe (:func:`recipe_key`: model sizes,
  tokenizer vocab, the task's training-data keys, warm-start settings) matches a shipped
  directory loads it, unless ``model.warm_start.shipped=false``. Rebuild it with
  ``python -m replay_exp.models.ship_warm_start [overrides]`` (prints the new SHA-256, pinned
  by ``tests/models/test_shipped_warm_start.py``).
- **Trained and cached**: any other recipe is trained here and saved under
  ``cache_dir/<key>``, where ``key`` (:func:`cache_key`) also hashes the library versions and
  :data:`WARM_START_VERSION`, so a second run loads it at once through ``from_pretrained``,
  the same path hub models use.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from omegaconf import OmegaConf
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from replay_exp.models.tokenizer import tokenizer_sha256
from replay_exp.tasks import TASKS, Task

log = logging.getLogger(__name__)

WARM_START_VERSION = 1  # bump when the supervised loop changes what it produces


SHIPPED_DIR = Path(__file__).parent / "shipped"
# Keys that do not change what the warm start produces: where it is cached, whether a shipped
# copy is used, labels, and options that act only after it (chat template, checkpointing).
# The tokenizer's name: its vocabulary (and, for a subword tokenizer, its file's hash) is in
# the recipe instead, so the embedded default's key is the one it had before the knob existed.
_NOT_RECIPE_MODEL = (
    "name", "chat_template", "gradient_checkpointing", "param_dtype", "save_dtype", "tokenizer",
)  # fmt: skip
_NOT_RECIPE_WARM = ("cache_dir", "shipped")


def recipe(mcfg: Any, task_cfg: Any, tokenizer: PreTrainedTokenizerBase) -> dict:
    """Everything that determines the warm-started weights (on a given machine)."""
    model_part = OmegaConf.to_container(mcfg, resolve=True)
    for key in _NOT_RECIPE_MODEL:
        model_part.pop(key, None)
    # The warm start is trained in float32 whatever the run computes in (a run in bfloat16
    # casts the same weights, it never trains its own): every dtype has the float32 key.
    model_part["dtype"] = "float32"
    for key in _NOT_RECIPE_WARM:
        model_part["warm_start"].pop(key, None)
    task_part = OmegaConf.to_container(task_cfg, resolve=True)
    # Task keys that leave the training problems and demonstrations unchanged (each task's
    # ``warm_start_ignores``: e.g. the arithmetic held-out list's length, a scorer's knobs).
    for key in TASKS[task_cfg.name].warm_start_ignores:
        task_part.pop(key, None)
    out = {
        "model": model_part,
        "task": task_part,
        "vocab": sorted(tokenizer.get_vocab().items()),
        "warm_start_version": WARM_START_VERSION,
    }
    subword = tokenizer_sha256(mcfg.get("tokenizer", "char"))
    if subword is not None:
        out["tokenizer_sha256"] = subword
    return out


def _hash(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def recipe_key(mcfg: Any, task_cfg: Any, tokenizer: PreTrainedTokenizerBase) -> str:
    """The shipped directory's name: a hash of :func:`recipe` (no library versions)."""
    return _hash(recipe(mcfg, task_cfg, tokenizer))


def cache_key(mcfg: Any, task_cfg: Any, tokenizer: PreTrainedTokenizerBase) -> str:
    """The local cache's key: the recipe plus the library versions that trained it."""
    payload = recipe(mcfg, task_cfg, tokenizer)
    payload["versions"] = [torch.__version__, transformers.__version__]
    return _hash(payload)


def shipped_warm_start(mcfg: Any, task_cfg: Any, tokenizer: PreTrainedTokenizerBase) -> Path | None:
    """The shipped directory of this recipe, or None (none shipped, or
    ``model.warm_start.shipped=false``)."""
    if not mcfg.warm_start.get("shipped", True):
        return None
    path = SHIPPED_DIR / recipe_key(mcfg, task_cfg, tokenizer)
    return path if (path / "warm_start.json").is_file() else None


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def encode_supervised(
    tokenizer: PreTrainedTokenizerBase, prompts: list[str], answers: list[str]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded [BOS prompt answer EOS] ids, attention mask and labels (-100 off answer)."""
    rows, label_rows = [], []
    for p, a in zip(prompts, answers, strict=True):
        p_ids = tokenizer(p)["input_ids"]  # BOS + prompt
        a_ids = tokenizer(a, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(p_ids + a_ids)
        label_rows.append([-100] * len(p_ids) + a_ids)
    L = max(len(r) for r in rows)
    ids = torch.full((len(rows), L), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), L), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), L), dtype=torch.long)
    for i, (r, lab) in enumerate(zip(rows, label_rows, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        labels[i, : len(lab)] = torch.tensor(lab)
        mask[i, : len(r)] = 1
    return ids, mask, labels


def supervised_train(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    device: str = "cpu",
) -> list[float]:
    """Teacher-forced training on ``steps`` batches of training problems; returns the losses."""
    model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(steps):
        problems = task.sample_train(rng, batch_size)
        answers = [task.demonstration(p, rng) for p in problems]
        ids, mask, labels = encode_supervised(tokenizer, [p.prompt for p in problems], answers)
        out = model(
            input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device)
        )
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(out.loss.item())
    model.eval()
    return losses


def cached_warm_start(
    build_model,
    mcfg: Any,
    task_cfg: Any,
    task: Task,
    tokenizer: PreTrainedTokenizerBase,
    device: str = "cpu",
) -> Path:
    """Return the directory of the warm-started model: the shipped one if this recipe is
    shipped (module docstring), else the cached one, training and saving it if needed.

    ``build_model()`` returns a fresh randomly initialised model. Writes are atomic (a temporary
    directory renamed into place), so concurrent runs never read a half-written checkpoint."""
    shipped = shipped_warm_start(mcfg, task_cfg, tokenizer)
    if shipped is not None:
        log.info("warm start: shipped with the package (%s)", shipped.name)
        return shipped
    ws = mcfg.warm_start
    root = Path(os.path.expanduser(ws.cache_dir))
    key = cache_key(mcfg, task_cfg, tokenizer)
    target = root / key
    if (target / "warm_start.json").is_file():
        log.info("warm start: cached %s", target)
        return target
    log.info("warm start: %d supervised steps (cached afterwards in %s)", ws.steps, target)
    return train_and_save(build_model, mcfg, task, tokenizer, target, key, device)


def train_and_save(
    build_model,
    mcfg: Any,
    task: Task,
    tokenizer: PreTrainedTokenizerBase,
    target: Path,
    key: str,
    device: str = "cpu",
    extra: dict | None = None,
) -> Path:
    """Run the supervised warm start and save it atomically as ``target`` (a
    ``save_pretrained`` directory plus ``warm_start.json``, which also records ``extra``)."""
    ws = mcfg.warm_start
    root = target.parent
    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ws.seed)
        model = build_model()
        losses = supervised_train(
            model, tokenizer, task, ws.steps, ws.batch_size, ws.lr, ws.seed, device
        )
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{key}-"))
    model.to("cpu").save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    info = {
        "key": key,
        "steps": ws.steps,
        "final_loss": float(np.mean(losses[-20:])) if losses else None,
        "seconds": time.perf_counter() - t0,
        **(extra or {}),
    }
    (tmp / "warm_start.json").write_text(json.dumps(info, indent=2))
    try:
        tmp.rename(target)
    except OSError:  # another run finished first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("warm start: done in %.1fs, loss %.4f", info["seconds"], info["final_loss"] or 0)
    return target
