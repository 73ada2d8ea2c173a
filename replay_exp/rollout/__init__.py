"""Generation backends behind one interface; ``generation.backend`` picks one."""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from replay_exp.rollout.base import Generation, Generator, SamplingParams, completion_mask
from replay_exp.rollout.hf import HFGenerator
from replay_exp.rollout.vllm_engine import VLLMGenerator  # imports vllm only when built

BACKENDS: dict[str, type[Generator]] = {"hf": HFGenerator, "vllm": VLLMGenerator}
# Values of generation.behaviour_logp: whose log-probs are stored with a rollout (the
# generator's own, or recomputed by the trainer's forward, rollout.collect).
BEHAVIOUR_LOGP_SOURCES = ("engine", "trainer")


def make_generator(
    gcfg: Any,
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    *,
    share_weights: bool,
    model_dir: str | None = None,
    max_model_len: int | None = None,
    dtype: str = "float32",
    seed: int = 0,
    device: str = "cpu",
) -> Generator:
    """The backend ``gcfg.backend`` sampling ``policy``'s weights (``generation`` config node).

    ``hf`` samples from the trainer's module (or a private copy when ``share_weights`` is
    False). ``vllm`` starts an offline engine from ``model_dir`` (a ``save_pretrained``
    directory or hub id with the policy's architecture) and pushes ``policy``'s weights into
    it; ``max_model_len`` bounds prompt + completion tokens."""
    pad_id, eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    if gcfg.backend == "hf":
        return HFGenerator(
            policy, pad_id, eos_id, share_weights=share_weights, chunk_size=gcfg.chunk_size,
            sampler=gcfg.sampler, compile=gcfg.get("compile", False),
        )  # fmt: skip
    if gcfg.backend == "vllm":
        return VLLMGenerator(
            policy, tokenizer, model_dir, pad_id=pad_id, eos_id=eos_id,
            max_model_len=max_model_len, dtype=dtype, seed=seed,
            gpu_memory_utilization=gcfg.gpu_memory_utilization,
            enforce_eager=gcfg.enforce_eager, chunk_size=gcfg.chunk_size,
            share_weights=share_weights, device=device,
            kv_cache_memory_bytes=gcfg.get("kv_cache_memory_bytes"),
        )  # fmt: skip
    raise ValueError(f"generation.backend={gcfg.backend} is unknown; choose one of {BACKENDS}")


def engine_model_dir(cfg: Any, source: str, policy, tokenizer, save_to) -> str | None:
    """Where an engine-based backend (vllm) loads its architecture from: the policy's own
    source when its config is unchanged, else (random init, untied head) a save of the policy
    into ``save_to``; None for ``hf``, which needs none."""
    if cfg.generation.backend == "hf":
        return None
    untied = cfg.model.pretrained and cfg.model.tie_word_embeddings is False
    if source != "random-init" and not untied:
        return source
    policy.save_pretrained(save_to)
    tokenizer.save_pretrained(save_to)
    return str(save_to)


__all__ = [
    "BACKENDS",
    "Generation",
    "Generator",
    "HFGenerator",
    "engine_model_dir",
    "SamplingParams",
    "completion_mask",
    "make_generator",
]
