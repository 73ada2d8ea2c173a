"""Tiny causal LMs built from a transformers config (random init), and hub-style loading."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from replay_exp.models.precision import DTYPES
from replay_exp.models.tokenizer import load_tokenizer

ARCHS = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),  # Qwen2 plus RMS norms on queries and keys
}


def build_tiny_model(mcfg: Any, tokenizer: PreTrainedTokenizerBase, seed: int) -> PreTrainedModel:
    """A randomly initialised model of architecture ``mcfg.arch`` sized by ``mcfg``, in float32
    whatever the run's dtypes (the warm start trains it; the loader casts its result)."""
    config_cls, model_cls = ARCHS[mcfg.arch]
    # Qwen3 sets head_dim on its own (default 128, whatever the width): here hidden / heads.
    extra = {"head_dim": mcfg.hidden_size // mcfg.num_heads} if mcfg.arch == "qwen3" else {}
    config = config_cls(
        vocab_size=len(tokenizer),
        hidden_size=mcfg.hidden_size,
        intermediate_size=mcfg.intermediate_size,
        num_hidden_layers=mcfg.num_layers,
        num_attention_heads=mcfg.num_heads,
        num_key_value_heads=mcfg.num_heads,
        max_position_embeddings=mcfg.max_position_embeddings,
        tie_word_embeddings=mcfg.tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **extra,
    )
    return random_init(model_cls, config, seed)


def random_init(
    model_cls: type[PreTrainedModel], config: PreTrainedConfig, seed: int
) -> PreTrainedModel:
    """``model_cls(config)`` initialised from ``seed`` (the global RNG is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return model_cls(config)


class ModelLoadError(RuntimeError):
    """A model or tokenizer that ``from_pretrained`` could not load (one-line message)."""


def load_pretrained(
    path: str | Path, dtype: str = "float32"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a model and its tokenizer with ``from_pretrained`` (a local dir or a hub id).

    The warm-started embedded model is loaded through this same path from its cache dir.
    Failures (no such hub id, no network, missing weights) raise :class:`ModelLoadError`."""
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype])
        tokenizer = load_tokenizer(path)
    except (OSError, ValueError) as e:
        reason = " ".join(str(e).split())[:300]
        raise ModelLoadError(f"model.pretrained={path} could not be loaded: {reason}") from None
    return model, tokenizer


def untie_embeddings(model: PreTrainedModel) -> bool:
    """Give a tied output head its own weights, a copy of the input embedding (the paper
    trains Qwen3-0.6B untied). Returns whether anything changed; the config then says untied,
    so ``save_pretrained`` writes both matrices and reloading keeps them apart."""
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or head.weight is not embed.weight:
        model.config.tie_word_embeddings = False
        return False
    head.weight = torch.nn.Parameter(embed.weight.detach().clone())
    model.config.tie_word_embeddings = False
    return True


def count_params(model: torch.nn.Module, non_embedding: bool = False) -> int:
    """Parameter count; ``non_embedding`` leaves out the input embedding table (and a tied
    output head), as in the usual 2N / 6N FLOP estimates."""
    n = sum(p.numel() for p in model.parameters())
    if non_embedding:
        n -= model.get_input_embeddings().weight.numel()
    return n
