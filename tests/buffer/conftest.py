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


def _stored_uses(buf) -> dict[int, int]:
    """uid -> uses so far of every rollout stored in ``buf`` (a PolicyBuffer or sharded)."""
    parts = getattr(buf, "shards", [buf])
    out: dict[int, int] = {}
    for p in parts:
        uids, uses = p.store.live_values("uid").tolist(), p.store.live_values("uses").tolist()
        out.update(zip(uids, uses, strict=True))
    return out


@pytest.fixture
def stored_uses():
    return _stored_uses


def _tiny(
    uids: list[int],
    step: int,
    *,
    reward: list[float] | None = None,
    advantage: list[float] | None = None,
    version: list[int] | int | None = None,
    group: list[int] | None = None,
) -> RolloutBatch:
    """One-token rollouts with chosen uids and metadata, for hand-computed expectations.
    Defaults: reward 0, advantage 0, version = step, group = uid."""
    n = len(uids)
    ones = torch.ones(n, 1, dtype=torch.bool)
    ver = version if version is not None else step
    return RolloutBatch(
        prompt_ids_BxP=torch.tensor(uids).view(n, 1) + 100,
        prompt_mask_BxP=ones,
        completion_ids_BxC=torch.tensor(uids).view(n, 1) + 200,
        completion_mask_BxC=ones,
        behaviour_logp_BxC=torch.zeros(n, 1),
        reward_B=torch.tensor(reward if reward is not None else [0.0] * n, dtype=torch.float32),
        advantage_B=torch.tensor(
            advantage if advantage is not None else [0.0] * n, dtype=torch.float32
        ),
        version_B=torch.tensor(ver if isinstance(ver, list) else [ver] * n, dtype=torch.int64),
        created_step_B=torch.full((n,), step, dtype=torch.int64),
        group_id_B=torch.tensor(group if group is not None else uids, dtype=torch.int64),
        uid_B=torch.tensor(uids, dtype=torch.int64),
    )


@pytest.fixture
def tiny():
    return _tiny


def _build(capacity: int, **spec):
    """make_buffer with one-token widths; ``spec`` are BufferConfig fields (name required)."""
    from replay_exp.buffer import make_buffer

    seed = spec.pop("seed", 0)
    return make_buffer(
        {"capacity": capacity, **spec}, max_prompt_len=8, max_completion_len=8, seed=seed
    )


@pytest.fixture
def build():
    return _build
