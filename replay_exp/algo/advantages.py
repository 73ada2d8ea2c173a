"""Group-relative advantages (GRPO): each rollout is scored against its prompt's siblings."""

from __future__ import annotations

import torch
from torch import Tensor


def group_advantages(
    reward_B: Tensor, group_size: int, normalize_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """Group-normalised advantage of every rollout, shape (B,), float32.

    Rewards arrive as contiguous groups: rows ``0..G-1`` are the G samples of prompt 0, rows
    ``G..2G-1`` those of prompt 1, and so on (G = ``group_size``). Within each group::

        A_i = (r_i - mean_g) / (std_g + eps)     if normalize_std  (std_g: population, ddof=0)
        A_i =  r_i - mean_g                      otherwise         (Dr.GRPO-style)

    A group whose rewards are all equal carries no learning signal and gets advantage exactly 0
    (not a rounding residue of ``r - mean``).

    Advantages are computed ONCE, at generation time, from the rewards of the group as it was
    sampled, and then frozen: they are stored with the rollout (``RolloutBatch.advantage_B``) and
    never recomputed when the rollout is replayed from the buffer, even though the current policy
    would now score the prompt differently and the group may be split across training batches.
    """
    if reward_B.dim() != 1:
        raise ValueError(f"reward_B must be 1-D (B,), got shape {tuple(reward_B.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    B = reward_B.shape[0]
    if B % group_size != 0:
        raise ValueError(
            f"number of rewards B={B} is not a multiple of group_size G={group_size}; "
            "rewards must arrive as complete contiguous groups of G samples per prompt"
        )
    # float64 for the group statistics; the result is stored as float32.
    r_NxG = reward_B.detach().to(torch.float64).view(B // group_size, group_size)
    adv_NxG = r_NxG - r_NxG.mean(dim=1, keepdim=True)
    if normalize_std:
        std_Nx1 = r_NxG.std(dim=1, correction=0, keepdim=True)
        adv_NxG = adv_NxG / (std_Nx1 + eps)
    all_equal_Nx1 = (r_NxG == r_NxG[:, :1]).all(dim=1, keepdim=True)
    adv_NxG = torch.where(all_equal_Nx1, torch.zeros_like(adv_NxG), adv_NxG)
    return adv_NxG.reshape(B).to(torch.float32)
