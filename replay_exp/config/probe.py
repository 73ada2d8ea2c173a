"""The one part of ``resolve()`` that reads files (or the hub's cache): a local model's
``config.json`` and tokenizer (a GGUF spec's converted folder, made here once), and the task's
data; and the ``model=<dir or hub id>`` shorthand of the command line."""

from __future__ import annotations

import json
import os
import re

from omegaconf import DictConfig

from replay_exp.config.errors import fail, positive
from replay_exp.tasks import TASKS, make_task


def probe_inputs(cfg: DictConfig) -> tuple[int, int]:
    """The one part of ``resolve()`` that reads files (or the hub's cache): a local model's
    ``config.json`` and tokenizer, and the task's data. Returns (max prompt tokens, max new
    tokens), checked against the model's positions."""
    from replay_exp.models.gguf import local_folder

    m, g = cfg.model, cfg.generation
    # A GGUF spec (model.pretrained=gguf:...) is converted once into a cached hub-format
    # folder here, before anything is built; the config keeps the spec.
    pretrained = local_folder(m.pretrained)
    saved_model = pretrained_model_config(pretrained) if pretrained else None
    char = not pretrained and m.get("tokenizer", "char") == "char"
    if TASKS[cfg.task.name].needs_pretrained and char:
        fail(
            f"task.name={cfg.task.name} needs a model with a subword tokenizer "
            "(model=qwen2_5_0_5b, model=<local dir>, model.pretrained=..., or a tiny model's "
            "model.tokenizer=<shipped>); the embedded tiny model's char tokenizer cannot read it"
        )
    if m.chat_template and not _has_chat_template(pretrained):
        where = f"model.pretrained={pretrained}" if pretrained else "the tiny model"
        fail(
            f"model.chat_template=true, but the tokenizer of {where} has no chat template; set "
            "model.chat_template=false"
        )
    if g.backend == "hf" and g.sampler == "static" and saved_model:
        layers = set(saved_model.get("layer_types") or ["full_attention"])
        if saved_model.get("use_sliding_window") or layers != {"full_attention"}:
            fail(
                f"generation.sampler=static needs full attention in every layer; "
                f"model.pretrained={pretrained} has {sorted(layers)} (use_sliding_window="
                f"{saved_model.get('use_sliding_window')}); use generation.sampler=cached_loop"
            )
    task = make_task(cfg.task)
    max_prompt_len = task.max_prompt_tokens
    if pretrained is not None and not TASKS[cfg.task.name].needs_pretrained:
        max_prompt_len = char_task_prompt_tokens(task, pretrained, bool(m.chat_template))
    max_new = g.max_new_tokens if g.max_new_tokens is not None else task.max_new_tokens
    positive("generation.max_new_tokens", max_new)
    if pretrained is None:
        max_positions, where = m.max_position_embeddings, "model.max_position_embeddings"
    else:
        max_positions = (saved_model or {}).get("max_position_embeddings")
        where = f"max_position_embeddings of model.pretrained={pretrained}"
    if max_positions is not None and max_prompt_len + max_new > max_positions:
        fail(
            f"{where} = {max_positions} < prompt {max_prompt_len} + "
            f"generation.max_new_tokens={max_new} tokens"
        )
    return max_prompt_len, max_new


def char_task_prompt_tokens(task, pretrained: str, chat: bool) -> int:
    """The prompt width, in ``pretrained``'s tokens, of a task that bounds its prompts in
    characters (the embedded char tokenizer's units, e.g. ``task=arithmetic``): its longest
    prompt's characters plus the most that the special tokens or the chat template add to any
    held-out prompt, plus one token for a merge across the template's edge. (Byte-level BPE
    and SentencePiece spend at most one token per character of such ASCII prompts.) Reads the
    tokenizer from a local directory or the hub's cache, never from the hub."""
    from replay_exp.models.tokenizer import load_tokenizer
    from replay_exp.rollout.collect import prompt_lengths

    path = os.path.expanduser(pretrained)
    try:
        if os.path.isdir(path):
            tokenizer = load_tokenizer(path)
        else:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(pretrained, local_files_only=True)
    except (OSError, ValueError):
        fail(
            f"task.name={task.name} measures prompts in characters; on model.pretrained="
            f"{pretrained} the prompt width needs that model's tokenizer, which is not on this "
            "machine (neither a local dir nor in the hub's cache: download it first)"
        )
    prompts = [p.prompt for p in task.eval_problems()]
    lengths = prompt_lengths(tokenizer, prompts, chat)
    extra = max(n - len(p) for n, p in zip(lengths, prompts, strict=True))
    return task.max_prompt_chars + max(extra, 0) + 1


HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


def pretrained_model_config(name: str) -> dict | None:
    """``config.json`` of a local ``save_pretrained`` directory, or None for a hub id (not
    contacted here). Anything else fails with a one-line :class:`ConfigError`."""
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        file = os.path.join(path, "config.json")
        if not os.path.isfile(file):
            fail(f"model.pretrained={name} has no config.json (not a save_pretrained directory)")
        with open(file) as f:
            return json.load(f)
    if os.path.exists(path) or name.startswith((".", "/", "~")) or not HUB_ID.fullmatch(name):
        fail(f"model.pretrained={name} is neither a local model directory nor a hub id (org/name)")
    return None


def _has_chat_template(pretrained: str | None) -> bool:
    """Whether a local model directory's tokenizer has a chat template (a hub id: assumed, it is
    not contacted here; the tiny models' char tokenizer: never)."""
    if not pretrained:
        return False
    path = os.path.expanduser(pretrained)
    if not os.path.isdir(path):
        return True
    if os.path.isfile(os.path.join(path, "chat_template.jinja")):
        return True
    tok_cfg = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(tok_cfg):
        with open(tok_cfg) as f:
            return bool(json.load(f).get("chat_template"))
    return False


# ---------------------------------------------------------------------------------------------
# Composition.
# ---------------------------------------------------------------------------------------------
