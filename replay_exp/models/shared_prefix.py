"""Shared-prompt forwards: the G samples of a group share one prompt, so run it once.

GRPO batches hold G rollouts per prompt (the on-policy batch: B/G distinct prompts). Both the
sampler and the trainer's forward run each distinct prompt once, then broadcast its keys and
values (the KV cache) to the rows that share it and continue with the completions only. This
saves (G - 1)/G of the prompt compute, which dominates at LLM scale (prompts of hundreds of
tokens, completions of a few hundred, G = 16). Gradients flow through the broadcast, so the
result equals a full forward over [prompt | completion] up to float rounding (tests check it).

Determinism: the broadcast uses ``index_select``, never advanced indexing (``x[index]``). With
repeated, unsorted indices (a replay batch: its rows of one prompt are scattered) the backward of
``x[index]`` is ``index_put_(accumulate=True)``, which on CPU with several threads adds rows with
atomics in an order that changes from run to run, so two runs of the same seed drifted apart at
the default thread count; the backward of ``index_select`` (``index_add_``) sums in a fixed
order. (transformers' ``cache.batch_select_indices`` indexes the first way.)
"""

from __future__ import annotations

import inspect

import torch
from transformers import PreTrainedModel


def positions(mask_BxT: torch.Tensor) -> torch.Tensor:
    """Position ids that count real tokens only (left padding), as ``generate`` uses them."""
    return (mask_BxT.long().cumsum(dim=1) - 1).clamp(min=0)


def unique_prompts(
    ids_BxP: torch.Tensor, mask_BxP: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(distinct prompt rows [U, P], their masks, row -> distinct-row index [B])."""
    ids_UxP, inverse_B = torch.unique(ids_BxP, dim=0, return_inverse=True)
    mask_UxP = torch.zeros_like(ids_UxP, dtype=torch.bool)
    mask_UxP[inverse_B] = mask_BxP
    return ids_UxP, mask_UxP, inverse_B


def supports_prefix_sharing(model: torch.nn.Module) -> bool:
    """A transformers causal LM (KV cache with ``batch_select_indices``) whose layers will use
    the cache: not one training with gradient checkpointing, where transformers drops
    ``use_cache`` and ``past_key_values`` (the recompute in the backward would write the cache
    twice), so the completion forward would not see the prompt. Such a model takes the full
    [prompt | completion] forward instead; in eval mode checkpointing is off and sharing works.
    """
    if not isinstance(model, PreTrainedModel):
        return False
    return not (model.is_gradient_checkpointing and model.training)


def prefill(model: PreTrainedModel, ids_BxP: torch.Tensor, mask_BxP: torch.Tensor):
    """Run each distinct prompt once. Returns (logits at each row's last prompt position
    [B, V], a KV cache holding B rows, each row's next position id [B])."""
    ids_UxP, mask_UxP, inverse_B = unique_prompts(ids_BxP, mask_BxP)
    pos_UxP = positions(mask_UxP)
    out = model(
        input_ids=ids_UxP, attention_mask=mask_UxP.long(), position_ids=pos_UxP, use_cache=True,
        **last_logits_only(model),
    )  # fmt: skip
    cache = out.past_key_values
    # torch.unique sorts the rows: broadcast back to the batch's order (even with no repeats).
    if not torch.equal(inverse_B, torch.arange(len(inverse_B), device=inverse_B.device)):
        select_cache_rows(cache, inverse_B)
    return out.logits[:, -1].index_select(0, inverse_B), cache, pos_UxP[inverse_B, -1] + 1


def last_logits_only(model: torch.nn.Module) -> dict:
    """``logits_to_keep=1`` where the model takes it: the output head runs on the last prompt
    position only, not on all P (a prefill reads only that one). At a 49k vocabulary that is a
    fifth of a small model's prefill FLOPs and a [U, P, V] float32 tensor (2.5 GB for 256
    prompts of 50 tokens, SmolLM2-135M); the last position's logits are the same values."""
    forward = getattr(model, "forward", None)
    try:
        takes = "logits_to_keep" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        takes = False
    return {"logits_to_keep": 1} if takes else {}


# Per-row tensors of a transformers cache layer (DynamicLayer and its subclasses).
_CACHE_ROW_TENSORS = ("keys", "values", "indexer_keys")


def select_cache_rows(cache, index_B: torch.Tensor) -> None:
    """``cache.batch_select_indices(index_B)`` with ``index_select``: row i of the result is row
    ``index_B[i]``, with a backward that is deterministic on CPU (module docstring)."""
    for layer in cache.layers:
        for name in _CACHE_ROW_TENSORS:
            rows = getattr(layer, name, None)
            if isinstance(rows, torch.Tensor) and rows.numel() > 0:
                setattr(layer, name, rows.index_select(0, index_B))


def completion_logits(
    model: PreTrainedModel,
    prompt_ids_BxP: torch.Tensor,
    prompt_mask_BxP: torch.Tensor,
    completion_ids_BxC: torch.Tensor,
    completion_mask_BxC: torch.Tensor,
) -> torch.Tensor:
    """Logits predicting each completion token [B, C, V] (position P-1 .. P+C-2 of the full
    sequence), computed with the shared-prompt forward."""
    last_BxV, cache, _ = prefill(model, prompt_ids_BxP, prompt_mask_BxP)
    mask = torch.cat([prompt_mask_BxP, completion_mask_BxC], dim=1)
    P = prompt_ids_BxP.shape[1]
    out = model(
        input_ids=completion_ids_BxC,
        attention_mask=mask.long(),
        position_ids=positions(mask)[:, P:],
        past_key_values=cache,
        use_cache=True,
    )
    return torch.cat([last_BxV[:, None], out.logits[:, :-1]], dim=1)
