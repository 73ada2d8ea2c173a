"""The policy's forward on a batch of rollouts: log-probs and entropy of the completion tokens.

Used by the trainer (``replay_exp.update``), the evaluation's entropy and the behaviour log-probs
recomputed by the trainer (``replay_exp.rollout.collect``): it lives with the models, below all
three, so that generation never imports the trainer's update.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from replay_exp.algo import token_logprobs
from replay_exp.models.shared_prefix import completion_logits, positions, supports_prefix_sharing
from replay_exp.types import RolloutBatch


def row_chunks(n_rows: int, size: int | None) -> list[slice]:
    """Contiguous slices of at most ``size`` rows covering ``n_rows`` (one slice if None)."""
    if size is None or size >= n_rows:
        return [slice(0, n_rows)]
    if size < 1:
        raise ValueError(f"micro_batch_size must be a positive number of rollouts, got {size}")
    return [slice(i, min(i + size, n_rows)) for i in range(0, n_rows, size)]


def micro_batch(batch: RolloutBatch, rows: slice) -> RolloutBatch:
    """Rows ``rows`` of ``batch``, trimmed of the columns that are padding in all of them (none
    trimmed if no row has a completion token: the forward needs one column)."""
    micro = batch.index(rows)
    return micro.trimmed() if micro.completion_mask_BxC.any() else micro


def policy_logprobs(
    model: torch.nn.Module,
    batch: RolloutBatch,
    temperature: float = 1.0,
    micro_batch_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(completion token) and per-token entropy under ``model``, shapes [B, C].

    The sequence is [left-padded prompt | right-padded completion]; position ids count real
    tokens only, exactly as ``generate`` does with left padding. Rows that share a prompt share
    its forward (``replay_exp.models.shared_prefix``); other modules get one full forward.

    ``micro_batch_size``: run the rows that many at a time (each chunk trimmed of its padding
    columns; prompts are shared within a chunk) and concatenate: the same values on valid
    tokens up to float rounding (padding, meaningless anyway, may read 0), with the memory of
    one chunk. Meant for no-grad uses (evaluation entropy, recomputed behaviour log-probs):
    under autograd every chunk's graph stays alive.
    """
    chunks = row_chunks(len(batch), micro_batch_size)
    if len(chunks) == 1:
        return _logprobs(model, batch, temperature)
    C = batch.completion_ids_BxC.shape[1]
    parts = [_logprobs(model, micro_batch(batch, rows), temperature) for rows in chunks]
    logp_BxC = torch.cat([F.pad(logp, (0, C - logp.shape[1])) for logp, _ in parts])
    entropy_BxC = torch.cat([F.pad(ent, (0, C - ent.shape[1])) for _, ent in parts])
    return logp_BxC, entropy_BxC


def _logprobs(
    model: torch.nn.Module, batch: RolloutBatch, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``policy_logprobs`` of all rows in one forward."""
    device = next(model.parameters()).device
    p_ids, p_mask = batch.prompt_ids_BxP.to(device), batch.prompt_mask_BxP.to(device)
    c_ids, c_mask = batch.completion_ids_BxC.to(device), batch.completion_mask_BxC.to(device)
    if supports_prefix_sharing(model):
        logits_BxCxV = completion_logits(model, p_ids, p_mask, c_ids, c_mask).float()
    else:
        ids, mask = torch.cat([p_ids, c_ids], dim=1), torch.cat([p_mask, c_mask], dim=1)
        logits = model(input_ids=ids, attention_mask=mask.long(), position_ids=positions(mask))
        logits_BxCxV = logits.logits[:, p_ids.shape[1] - 1 : -1].float()
    return token_logprobs(logits_BxCxV, c_ids, temperature)
