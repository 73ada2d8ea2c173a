"""Policy models: tiny from-config models with a cached supervised warm start, or any
``from_pretrained`` directory / hub id."""

from __future__ import annotations

from functools import partial
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from replay_exp.models.gguf import local_folder
from replay_exp.models.precision import DTYPES, compute_in
from replay_exp.models.tiny import (
    build_tiny_model,
    count_params,
    load_pretrained,
    untie_embeddings,
)
from replay_exp.models.tokenizer import build_char_tokenizer, build_tokenizer, load_tokenizer
from replay_exp.models.warm_start import cached_warm_start
from replay_exp.tasks import Task

__all__ = [
    "build_char_tokenizer",
    "build_tokenizer",
    "build_tiny_model",
    "count_params",
    "load_policy",
    "load_pretrained",
    "load_tokenizer",
    "untie_embeddings",
]


def load_policy(
    mcfg: Any,
    task_cfg: Any,
    task: Task,
    device: str = "cpu",
    dtype: str = "float32",
    compute_dtype: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, str]:
    """The initial policy and its tokenizer, and where they were loaded from.

    The weights are in ``dtype`` (the run's ``param_dtype``); its forwards compute in
    ``compute_dtype`` (the run's resolved ``model.dtype``; None: ``dtype``) through
    ``models.precision.compute_in``.

    - ``model.pretrained`` set: ``from_pretrained(model.pretrained)`` (a ``gguf:`` spec: its
      converted folder, ``models.gguf``), untied if ``model.tie_word_embeddings`` is false.
    - otherwise a tiny model of ``model.arch`` with its ``model.tokenizer`` (char, or a
      shipped subword tokenizer); with
      ``model.warm_start.steps > 0`` it is warm-started (cached; trained in float32, so one
      warm start serves every dtype: it is cast, never retrained) and loaded back from the
      cache with ``from_pretrained``; with 0 steps it is the random init (seed
      ``warm_start.seed``), cast to ``dtype``.

    ``model.gradient_checkpointing`` is switched on here (it acts in training mode only).
    """
    if mcfg.pretrained:
        source = local_folder(mcfg.pretrained)  # a GGUF spec: its converted, cached folder
        model, tok = load_pretrained(source, dtype)
        if mcfg.tie_word_embeddings is False:
            untie_embeddings(model)
    else:
        tok = build_tokenizer(mcfg.get("tokenizer", "char"))
        build = partial(build_tiny_model, mcfg, tok, mcfg.warm_start.seed)
        if mcfg.warm_start.steps == 0:
            model, source = build().to(DTYPES[dtype]), "random-init"
        else:
            path = cached_warm_start(build, mcfg, task_cfg, task, tok, device)
            model, tok = load_pretrained(path, dtype)
            source = str(path)
    if mcfg.get("gradient_checkpointing"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return compute_in(model.to(device), compute_dtype or dtype), tok, source
