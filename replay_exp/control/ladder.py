"""The knobs a replay controller sets, and the ladder of designs it moves along.

A design is (R, N): fresh rollouts per step (the reuse ratio is y = B / R) and the FIFO's
capacity (the staleness horizon is x = N / R); the learning-rate scale is a third knob. The
ladder is built around the run's own starting design (R0, N0), the one its config gives: rung
l has

    R_l = G round(R0 / (G g_r^l)), clamped to [R_min, B]   (l up: less fresh data, more reuse)
    N_l = round(N0 g_n^l),         clamped to [max(B, R_l), N_max]

with g_r = ``controller.reuse_growth`` and g_n = ``controller.capacity_growth``; a knob the
controller does not own stays at its start. Rungs that repeat (a clamp binds on both knobs)
end the ladder, so every rung differs from its neighbours. Example, the embedded default
started on-policy (B = R0 = N0 = 64, G = 8, g_r = 2, g_n = 4, R_min = 8, N_max large): rung 0
(64, 64), 1 (32, 256), 2 (16, 1024), 3 (8, 4096): y = 1, 2, 4, 8 and x = 1, 8, 64, 512.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class Knobs:
    """What the controller sets: R, N and the learning-rate scale (of ``algo.lr``)."""

    rollouts_per_step: int
    capacity: int
    lr_scale: float = 1.0

    def state_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict) -> Knobs:
        return cls(int(state["rollouts_per_step"]), int(state["capacity"]),
                   float(state["lr_scale"]))  # fmt: skip


class Ladder:
    """The distinct rungs (R, N) around the start (module docstring); ``start`` is rung 0's
    index in ``rungs`` (lowest rung first: the most fresh data)."""

    def __init__(
        self,
        R0: int,
        N0: int,
        B: int,
        G: int,
        R_min: int,
        N_max: int,
        reuse_growth: float,
        capacity_growth: float,
        owns_reuse: bool = True,
        owns_capacity: bool = True,
    ):

        def rung(level: int) -> tuple[int, int]:
            R = R0
            if owns_reuse:
                R = min(B, max(R_min, G * round(R0 / (G * reuse_growth**level))))
            N = N0
            if owns_capacity:
                N = min(N_max, max(B, R, round(N0 * capacity_growth**level)))
            return R, max(N, R)

        down, level = [], 0
        while rung(level - 1) != rung(level) and len(down) < 64:
            level -= 1
            down.append(rung(level))
        up, level = [], 0
        while rung(level + 1) != rung(level) and len(up) < 64:
            level += 1
            up.append(rung(level))
        self.rungs: list[tuple[int, int]] = [*reversed(down), rung(0), *up]
        self.start = len(down)

    def knobs(self, index: int) -> Knobs:
        R, N = self.rungs[index]
        return Knobs(R, N)

    def clamp(self, index: int) -> int:
        return min(len(self.rungs) - 1, max(0, index))

    def above(self, knobs: Knobs) -> int | None:
        """The lowest rung with no more fresh data and no smaller buffer than ``knobs`` and
        differing from it: the next design up from anywhere (None at the top)."""
        for i, (R, N) in enumerate(self.rungs):
            if (
                knobs.rollouts_per_step >= R
                and knobs.capacity <= N
                and (knobs.rollouts_per_step, knobs.capacity) != (R, N)
            ):
                return i
        return None
