"""Synthetic rollouts for tests, benchmarks and notebooks: one factory for ``RolloutBatch``.

- :func:`rollout_batch`: given token ids (and whatever else matters to the caller), the rest
  filled with neutral values: masks all True, log-probs, rewards and advantages 0, policy
  version 0, uids counting from ``uid_start``, each rollout its own group.
- :func:`random_rollouts`: R rollouts of random lengths and ids, seeded, for buffer and
  checkpoint streams.
- :func:`without_wall_clock`: metric rows less the wall-clock measurements, which differ
  between any two runs; everything else is equal for the same config and seed.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from replay_exp.types import RolloutBatch

Values = torch.Tensor | Sequence[float] | float | None
# Metric-name prefixes of wall-clock measurements (differ between any two runs of a config).
WALL_CLOCK_KEYS = (
    "compute/seconds", "compute/measured_mu", "runtime/steps_per_second", "runtime/wait_seconds",
    "runtime/node_seconds", "runtime/node_time", "controller/in/measured_mu",
)  # fmt: skip


def without_wall_clock(rows: Sequence[dict]) -> list[dict]:
    """``rows`` (metrics.jsonl records) without their :data:`WALL_CLOCK_KEYS` entries."""
    return [{k: v for k, v in r.items() if not k.startswith(WALL_CLOCK_KEYS)} for r in rows]


def _column(value: Values, n: int, dtype: torch.dtype, default: float) -> torch.Tensor:
    if value is None:
        value = default
    if isinstance(value, int | float):
        return torch.full((n,), value, dtype=dtype)
    return torch.as_tensor(value, dtype=dtype).clone()


def rollout_batch(
    prompt_ids_BxP: torch.Tensor | Sequence[Sequence[int]],
    completion_ids_BxC: torch.Tensor | Sequence[Sequence[int]],
    *,
    prompt_mask_BxP: torch.Tensor | None = None,
    completion_mask_BxC: torch.Tensor | None = None,
    behaviour_logp_BxC: torch.Tensor | None = None,
    reward: Values = None,
    advantage: Values = None,
    version: Values = None,
    created_step: Values = None,
    group: Values = None,
    uid: Values = None,
    uid_start: int = 0,
    group_reward: Values = None,
    engine_gap_BxC: torch.Tensor | None = None,
) -> RolloutBatch:
    """A batch of the given rows; unspecified fields take neutral values (module docstring).
    ``version`` and ``created_step`` may be one int for every row (``created_step`` defaults
    to ``version``); ``group`` defaults to ``uid``."""
    p_ids = torch.as_tensor(prompt_ids_BxP, dtype=torch.int64)
    c_ids = torch.as_tensor(completion_ids_BxC, dtype=torch.int64)
    n = p_ids.shape[0]
    uid_B = _column(uid, n, torch.int64, 0) if uid is not None else torch.arange(n) + uid_start
    version_B = _column(version, n, torch.int64, 0)
    return RolloutBatch(
        prompt_ids_BxP=p_ids,
        prompt_mask_BxP=(
            torch.ones_like(p_ids, dtype=torch.bool) if prompt_mask_BxP is None
            else torch.as_tensor(prompt_mask_BxP, dtype=torch.bool)
        ),
        completion_ids_BxC=c_ids,
        completion_mask_BxC=(
            torch.ones_like(c_ids, dtype=torch.bool) if completion_mask_BxC is None
            else torch.as_tensor(completion_mask_BxC, dtype=torch.bool)
        ),
        behaviour_logp_BxC=(
            torch.zeros(c_ids.shape) if behaviour_logp_BxC is None
            else torch.as_tensor(behaviour_logp_BxC, dtype=torch.float32)
        ),
        reward_B=_column(reward, n, torch.float32, 0.0),
        advantage_B=_column(advantage, n, torch.float32, 0.0),
        version_B=version_B,
        created_step_B=version_B.clone() if created_step is None
        else _column(created_step, n, torch.int64, 0),
        group_id_B=uid_B.clone() if group is None else _column(group, n, torch.int64, 0),
        uid_B=uid_B,
        group_reward_B=_column(group_reward, n, torch.float32, 0.0),
        engine_gap_BxC=(
            torch.zeros(c_ids.shape) if engine_gap_BxC is None
            else torch.as_tensor(engine_gap_BxC, dtype=torch.float32)
        ),
    )  # fmt: skip


def random_rollouts(
    R: int,
    step: int,
    uid_start: int,
    *,
    p_width: int = 6,
    c_width: int = 5,
    seed: int | None = None,
    version: int | None = None,
    pad_id: int = 0,
    group_size: int = 4,
) -> RolloutBatch:
    """R rollouts generated at ``step`` (policy ``version``, default ``step``) with uids
    ``uid_start .. uid_start + R - 1`` in groups of ``group_size`` consecutive uids.

    Prompts are left-padded, completions right-padded, lengths random in [1, width] with one
    row of full width each (so ``trimmed()`` keeps the batch width); ids random in
    [100, 1000) (``pad_id`` on padding), behaviour log-probs in (-1, 0], rewards 0/1,
    advantages normal. Seeded by ``seed`` (default: from step and uid_start)."""
    g = torch.Generator().manual_seed(seed if seed is not None else 1000 * step + uid_start)
    pl = torch.randint(1, p_width + 1, (R,), generator=g)
    cl = torch.randint(1, c_width + 1, (R,), generator=g)
    if R:
        pl[0], cl[-1] = p_width, c_width
    pmask = torch.arange(p_width) >= (p_width - pl)[:, None]
    cmask = torch.arange(c_width) < cl[:, None]
    pids = torch.randint(100, 1000, (R, p_width), generator=g).masked_fill(~pmask, pad_id)
    cids = torch.randint(100, 1000, (R, c_width), generator=g).masked_fill(~cmask, pad_id)
    logp = (-torch.rand((R, c_width), generator=g)).masked_fill(~cmask, 0.0)
    uid = torch.arange(uid_start, uid_start + R)
    return rollout_batch(
        pids, cids, prompt_mask_BxP=pmask, completion_mask_BxC=cmask, behaviour_logp_BxC=logp,
        reward=(torch.rand(R, generator=g) > 0.5).float(), advantage=torch.randn(R, generator=g),
        version=step if version is None else version, created_step=step,
        group=uid // group_size, uid=uid,
    )  # fmt: skip
