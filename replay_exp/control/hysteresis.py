"""Hysteresis for the model policy (``controller.model.min_gain`` / ``persist``): a move to the
design the policy names only when it is predicted to be better by a stated margin and has
been named for ``persist`` decisions in a row; otherwise the controller holds.

Why: at mu = 2 the model policy switched between (R 24, N 65536) and (R 16, N 16384) 12-39 times
a run as its online alpha crossed the boundary between the two picks (docs/findings.md, item
11), and each switch to the smaller buffer evicted three quarters of it. A design that is best
by a hair, or only in one window's noise, is not worth a switch.

The gate, at each decision with a target T different from the current design C (a probe, made
with too few aged rows to estimate anything, is not gated):

1. ``min_gain`` (null: no margin): the predicted relative gain 1 - J(T) / J(C) at the point
   alpha (J: the design model's noise per unit of compute, lower is better) must exceed it;
   else hold and forget any pending target;
2. ``persist`` (1: at once): T must be the target of ``persist`` consecutive decisions; a
   decision naming C, or another design, restarts the count.

Hand-made sequence (C = A; targets A, B, A, B, B, each move predicted 5 % better):
min_gain null, persist 1 moves at the 2nd decision (to B), the 3rd (back to A) and the 4th (to
B): 3 moves; persist 2 moves once, at the 5th (B named twice in a row); min_gain 0.1 never
moves (tests/control/test_hysteresis.py).
The decisions held back are counted (``controller/held``).
"""

from __future__ import annotations

from dataclasses import dataclass

Design = tuple[int, int]  # (N, R)


@dataclass
class HysteresisState:
    """What the gate remembers across decisions (in the snapshot)."""

    pending: Design | None = None  # the target named in the last decisions ...
    count: int = 0  # ... for this many in a row
    held: int = 0  # decisions whose move the gate held back

    def state_dict(self) -> dict:
        return {"pending": None if self.pending is None else list(self.pending),
                "count": self.count, "held": self.held}  # fmt: skip

    @classmethod
    def from_state(cls, state: dict | None) -> HysteresisState:
        if state is None:  # a snapshot from before the gate existed
            return cls()
        p = state["pending"]
        return cls(None if p is None else (int(p[0]), int(p[1])), int(state["count"]),
                   int(state["held"]))  # fmt: skip


def gate(
    current: Design,
    target: Design,
    gain: float,
    state: HysteresisState,
    min_gain: float | None,
    persist: int,
) -> tuple[Design, str]:
    """(the design to use, why the gate held: "" when it did not) for one decision (module
    docstring), updating ``state``."""
    if target == current:
        state.pending, state.count = None, 0
        return current, ""
    if min_gain is not None and not gain > min_gain:
        state.pending, state.count = None, 0
        state.held += 1
        return current, f"held: predicted gain {gain:.3g} <= min_gain {min_gain:g}"
    if target == state.pending:
        state.count += 1
    else:
        state.pending, state.count = target, 1
    if state.count < persist:
        state.held += 1
        return current, f"held: N={target[0]}, R={target[1]} named {state.count} of {persist}"
    state.pending, state.count = None, 0
    return target, ""
