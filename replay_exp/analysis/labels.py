"""Name a configuration by its meaning ("FIFO N=256, y=4", "N=768, (6,2)", "on-policy,
lr=1e-04") from the config keys that vary in a study, instead of by its override string."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from replay_exp.compute.costmodel import workers_of

BUFFER_NAMES = {
    "fifo": "FIFO",
    "on_policy": "on-policy",
    "positive_bias": "positive-bias",
    "max_age": "max-age",
    "priority": "priority",
}
ALGO_NAMES = {"grpo": "GRPO", "asymre": "AsymRE"}


def _num(v: Any) -> str:
    if isinstance(v, float) and (abs(v) < 1e-2 or abs(v) >= 1e5) and v != 0:
        mantissa, exponent = f"{v:.3e}".split("e")  # 1.2e-04, 6e-05: no digit is dropped
        return f"{mantissa.rstrip('0').rstrip('.')}e{exponent}"
    return f"{v:g}" if isinstance(v, int | float) else str(v)


def split_label(cfg: dict[str, Any]) -> str:
    """(W,T) of an async run: the split resolve() derived (``derived.workers``), else from the
    schedule keys (a config.yaml written before the split was recorded)."""
    trainers = cfg.get("schedule.trainers")
    workers = cfg.get("derived.workers")
    if workers is None or (isinstance(workers, float) and math.isnan(workers)):
        workers = cfg.get("schedule.workers")
    if workers is None and trainers is not None:
        workers = workers_of(cfg.get("schedule.gpus", 8), trainers)
    return f"({_num(workers)},{_num(trainers)})"


def _reuse(cfg: dict[str, Any]) -> str:
    y = cfg.get("derived.reuse_ratio")
    if y is None or (isinstance(y, float) and math.isnan(y)):
        y = cfg.get("schedule.reuse_ratio")
    return f"y={_num(round(y, 2)) if isinstance(y, float) else _num(y)}"


# (keys that trigger the part, how to write it), in the order the parts appear in a label.
_PARTS: list[tuple[tuple[str, ...], Callable[[dict[str, Any]], str]]] = [
    (("buffer.name",), lambda c: BUFFER_NAMES.get(c.get("buffer.name"), str(c.get("buffer.name")))),
    (("buffer.capacity",), lambda c: f"N={_num(c.get('buffer.capacity'))}"),
    (("schedule.reuse_ratio", "schedule.rollouts_per_step"), _reuse),
    (("schedule.workers", "schedule.trainers", "schedule.gpus"), split_label),
    (("buffer.delta",), lambda c: f"δ={_num(c.get('buffer.delta'))}"),
    (("buffer.sampling",), lambda c: str(c.get("buffer.sampling")).replace("_", "-")),
    (("buffer.max_reuse",), lambda c: f"max reuse {_num(c.get('buffer.max_reuse'))}"),
    (("buffer.max_age",), lambda c: f"max age {_num(c.get('buffer.max_age'))}"),
    (("algo.name",), lambda c: ALGO_NAMES.get(c.get("algo.name"), str(c.get("algo.name")))),
    (("algo.lr",), lambda c: f"lr={_num(c.get('algo.lr'))}"),
    (("schedule.sync_every",), lambda c: f"sync every {_num(c.get('schedule.sync_every'))}"),
    (("schedule.sync_lag",), lambda c: f"sync lag {_num(c.get('schedule.sync_lag'))}"),
]


def config_label(cfg: dict[str, Any], keys: Sequence[str]) -> str:
    """A short human name for ``cfg`` built from the varying ``keys``. The on-policy baseline
    is "on-policy" (its buffer and reuse keys do not apply); unknown keys appear as
    ``leaf=value``."""
    on_policy = cfg.get("buffer.name") == "on_policy"
    parts, used = [], set()
    for triggers, fmt in _PARTS:
        present = [k for k in triggers if k in keys]
        used.update(present)
        if not present:
            continue
        if on_policy and triggers[0].startswith(("buffer.", "schedule.r")):
            continue
        parts.append(fmt(cfg))
    for k in keys:
        if k not in used and not (on_policy and k.startswith("buffer.")):
            parts.append(f"{k.rsplit('.', 1)[-1]}={_num(cfg.get(k))}")
    if on_policy and "on-policy" not in parts:
        parts.insert(0, "on-policy")
    return ", ".join(parts) or "all runs"
