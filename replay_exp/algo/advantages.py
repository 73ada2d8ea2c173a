"""Group-relative advantages (GRPO): each rollout is scored against its prompt's siblings."""

from __future__ import annotations

import torch
from torch import Tensor

STD_MODES = ("population", "sample")


def group_advantages(
    reward_B: Tensor,
    group_size: int,
    normalize_std: bool = True,
    eps: float = 1e-6,
    std: str = "population",
) -> Tensor:
    """Group-normalised advantage of every rollout, shape (B,), float32.

    Rewards arrive as contiguous groups: rows ``0..G-1`` are the G samples of prompt 0, rows
    ``G..2G-1`` those of prompt 1, and so on (G = ``group_size``). Within each group::

        A_i = (r_i - mean_g) / (std_g + eps)     if normalize_std
        A_i =  r_i - mean_g                      otherwise         (Dr.GRPO-style)

    ``std_g`` is the population std (``std="population"``, ddof 0, the default) or the sample
    std (``"sample"``, ddof 1: verl's ``torch.std`` in ``compute_grpo_outcome_advantage`` with
    its eps 1e-6, TRL's ``nanstd`` with eps 1e-4). For binary rewards with k of G correct the
    population std is sqrt(p (1 - p)), p = k / G, and the sample std is sqrt(G / (G - 1)) times
    it: G = 8, k = 2 gives A = (1 - 0.25) / 0.4330 = 1.732 against 0.75 / 0.4629 = 1.620.

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
    if std not in STD_MODES:
        raise ValueError(f"unknown std {std!r}; valid modes are {STD_MODES}")
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
        ddof = 1 if std == "sample" and group_size > 1 else 0  # a group of one: all equal, A = 0
        std_Nx1 = r_NxG.std(dim=1, correction=ddof, keepdim=True)
        adv_NxG = adv_NxG / (std_Nx1 + eps)
    all_equal_Nx1 = (r_NxG == r_NxG[:, :1]).all(dim=1, keepdim=True)
    adv_NxG = torch.where(all_equal_Nx1, torch.zeros_like(adv_NxG), adv_NxG)
    return adv_NxG.reshape(B).to(torch.float32)
