"""Synthetic RolloutBatch factory shared by the buffer tests."""

from __future__ import annotations

import pytest
import torch

from replay_exp.types import RolloutBatch

PAD_ID = 7  # a non-zero pad id, so a test can see whether padded columns are preserved


def _rollouts(
    R: int,
    step: int,
    uid_start: int,
    *,
    p_width: int = 6,
    c_width: int = 5,
    seed: int | None = None,
    version: int | None = None,
) -> RolloutBatch:
    """R rollouts generated at ``step`` with uids uid_start..uid_start+R-1.

    Row lengths vary in [1, width]; one row has full width, so ``trimmed()`` keeps the batch
    width only if the width is reached. Ids are random in [100, 1000), PAD_ID on padding.
    """
    g = torch.Generator().manual_seed(seed if seed is not None else 1000 * step + uid_start)
    pl = torch.randint(1, p_width + 1, (R,), generator=g)
    cl = torch.randint(1, c_width + 1, (R,), generator=g)
    if R:
        pl[0], cl[-1] = p_width, c_width
    pmask = torch.arange(p_width) >= (p_width - pl)[:, None]
    cmask = torch.arange(c_width) < cl[:, None]
    pids = torch.randint(100, 1000, (R, p_width), generator=g).masked_fill(~pmask, PAD_ID)
    cids = torch.randint(100, 1000, (R, c_width), generator=g).masked_fill(~cmask, PAD_ID)
    logp = (-torch.rand((R, c_width), generator=g)).masked_fill(~cmask, 0.0)
    uid = torch.arange(uid_start, uid_start + R)
    return RolloutBatch(
        prompt_ids_BxP=pids,
        prompt_mask_BxP=pmask,
        completion_ids_BxC=cids,
        completion_mask_BxC=cmask,
        behaviour_logp_BxC=logp,
        reward_B=(torch.rand(R, generator=g) > 0.5).float(),
        advantage_B=torch.randn(R, generator=g),
        version_B=torch.full((R,), step if version is None else version),
        created_step_B=torch.full((R,), step),
        group_id_B=uid // 4,
        uid_B=uid,
    )


@pytest.fixture
def make_rollouts():
    return _rollouts
