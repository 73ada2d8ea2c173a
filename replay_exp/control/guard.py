"""``controller.policy=guard``: move along the ladder by staleness guards, in the spirit of DGG
(stop reusing when the gradient norm surges, arXiv 2605.19425) and VCPO (scale the learning
rate by the effective sample size, arXiv 2602.17616).

At each decision the window's means (``control.signals``) are checked against four limits
(``controller.guard``):

    kl <= kl_max,  clip_frac <= clip_max,  ess >= ess_min,  surge <= surge_max

where ``surge`` is the window's mean gradient norm over the mean of the earlier windows' (1 in
the first window). A signal that is NaN (a loss without a clip, no earlier window) is not
checked.

- **Breach** (any limit crossed): one rung down (fresher data, smaller buffer); the calm
  streak restarts.
- **Calm** (every signal inside ``calm`` of its limit: kl <= calm kl_max, clip_frac <= calm
  clip_max, ess >= 1 - calm (1 - ess_min), surge <= 1 + calm (surge_max - 1)): the streak
  grows; at ``patience`` calm windows in a row, one rung up (more reuse, larger buffer) and
  the streak restarts.
- Otherwise hold (the streak restarts).

The ``lr`` knob (either policy) is ``replay_exp.control.lr``'s.

Worked example (the defaults: kl_max 0.05, clip_max 0.2, ess_min 0.5, surge_max 3, calm 0.5,
patience 2), started on-policy: every window has kl = clip = 0, ess = 1, surge = 1: calm, so
the rungs go 0, 0, 1, 1, 2, ... (one rung every second window) until a window breaches, e.g.
kl = 0.06 > 0.05: one rung down.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class GuardState:
    """The guard's memory across decisions (in the snapshot)."""

    streak: int = 0  # calm windows in a row
    grad_sum: float = 0.0  # sum of the earlier windows' mean gradient norms ...
    grad_windows: int = 0  # ... and their count


def surge(grad_norm: float, state: GuardState) -> float:
    """The window's mean gradient norm over the earlier windows' mean (NaN: none yet or no
    norm). Hand-checked: earlier windows 2.0 and 4.0, this one 9.0: 9 / 3 = 3."""
    if state.grad_windows == 0 or not math.isfinite(grad_norm):
        return math.nan
    return grad_norm / (state.grad_sum / state.grad_windows)


def checks(summary: dict[str, float], surge_value: float, g) -> dict[str, tuple[bool, bool]]:
    """Per signal, (breached, calm) under the guard config ``g``; a NaN signal is (False,
    True): not checked."""
    limits = {
        "kl": (summary["kl"], lambda v: v > g.kl_max, lambda v: v <= g.calm * g.kl_max),
        "clip_frac": (
            summary["clip_frac"],
            lambda v: v > g.clip_max,
            lambda v: v <= g.calm * g.clip_max,
        ),  # fmt: skip
        "ess": (
            summary["ess"],
            lambda v: v < g.ess_min,
            lambda v: v >= 1 - g.calm * (1 - g.ess_min),
        ),  # fmt: skip
        "surge": (
            surge_value,
            lambda v: v > g.surge_max,
            lambda v: v <= 1 + g.calm * (g.surge_max - 1),
        ),  # fmt: skip
    }
    out = {}
    for name, (v, breached, calm) in limits.items():
        out[name] = (False, True) if not math.isfinite(v) else (bool(breached(v)), bool(calm(v)))
    return out


def decide(summary: dict[str, float], state: GuardState, g) -> tuple[int, str, dict[str, float]]:
    """(rung move: -1, 0 or +1; the reason; the inputs as ``controller/*`` values) of one
    decision, updating ``state``. ``g``: the ``controller.guard`` node."""
    s = surge(summary["grad_norm"], state)
    result = checks(summary, s, g)
    if math.isfinite(summary["grad_norm"]):
        state.grad_sum += summary["grad_norm"]
        state.grad_windows += 1
    inputs = {"in/grad_surge": s, **{f"breach/{k}": float(b) for k, (b, _) in result.items()}}
    breached = [k for k, (b, _) in result.items() if b]
    if breached:
        state.streak = 0
        return -1, "breach: " + ", ".join(breached), inputs
    if all(calm for _, calm in result.values()):
        state.streak += 1
        if state.streak >= g.patience:
            state.streak = 0
            return +1, f"calm for {g.patience} windows", inputs
        return 0, f"calm ({state.streak} of {g.patience})", inputs
    state.streak = 0
    return 0, "inside the limits, not calm", inputs
