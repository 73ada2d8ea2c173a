"""Named cadences for the loop (instead of scattered ``%``), arrival schedules (sync and the
async-cluster emulation) and the weight history behind a weight-sync lag."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from replay_exp.compute import costmodel


@dataclass(frozen=True)
class Every:
    """True on multiples of ``n`` (step 0 included)."""

    n: int

    def __call__(self, step: int) -> bool:
        return step % self.n == 0


@dataclass(frozen=True)
class OnGrid:
    """True when a cumulative quantity crosses a multiple of ``every`` during a step: called
    with its values before and after the step. With the step count as the quantity this is
    ``Every(every)`` at the step's end; with compute (paper units) or generated rollouts, every
    run that uses the same ``every`` is evaluated at the same grid of x values, whatever its
    cost per step (``eval.unit``)."""

    every: float

    def __call__(self, before: float, after: float) -> bool:
        return math.floor(after / self.every + 1e-9) > math.floor(before / self.every + 1e-9)


# ---------------------------------------------------------------------------------------------
# Arrival schedules: how many fresh prompt groups (of G rollouts) are generated at each step.
# Both are stateless functions of the step, so a resumed run needs no schedule state.
# ---------------------------------------------------------------------------------------------


class SyncArrivals:
    """The synchronous loop: exactly R/G prompt groups at every step."""

    def __init__(self, groups_per_step: int):
        self.groups_per_step = groups_per_step

    def groups_at(self, step: int) -> int:
        return self.groups_per_step

    def groups_before(self, step: int) -> int:
        """Groups generated at steps 0..step-1 (so uids and group ids stay unique)."""
        return step * self.groups_per_step


class AsyncArrivals:
    """Emulation of the paper's asynchronous cluster, deterministic.

    A node of W inference workers and T trainers; generating a rollout costs mu times a
    forward-backward on it. Measuring time in forward-backward sample units of one GPU, a
    training step on B samples takes B/T, during which the workers generate
    (W/mu)(B/T) rollouts: ``rate = B W / (mu T G)`` prompt groups per step. Arrivals are whole
    groups; the fractional remainder accumulates: by the end of step t the workers have
    delivered A(t) = max(1, floor((t+1) rate)) groups (at least one, so the first step has
    data). Reuse then emerges: y = B / R = mu T / W to first order, and W/T = mu gives R = B.
    Compute per step is the whole node for B/T: B (1 + W/T) sample units, vs B (1 + mu) for an
    on-policy step, hence gamma = (1 + W/T) / (1 + mu) (the paper's Tables 1 and 3).
    """

    def __init__(self, workers: int, trainers: int, mu: float, batch_size: int, group_size: int):
        self.workers, self.trainers, self.mu = workers, trainers, mu
        rollouts = costmodel.async_rollouts_per_step(batch_size, workers, trainers, mu)
        self.rate = rollouts / group_size

    def _delivered(self, step: int) -> int:
        """A(step): groups delivered by the end of step ``step`` (A(-1) = 0)."""
        if step < 0:
            return 0
        return max(1, math.floor((step + 1) * self.rate + 1e-9))

    def groups_at(self, step: int) -> int:
        return self._delivered(step) - self._delivered(step - 1)

    def groups_before(self, step: int) -> int:
        return self._delivered(step - 1)


def make_arrivals(schedule, derived, mu: float, group_size: int) -> SyncArrivals | AsyncArrivals:
    """The arrival schedule named by ``schedule.name`` (a resolved schedule config node), with
    the sizes ``resolve()`` derived (``derived``: R, and W, T under async)."""
    if schedule.name == "async":
        return AsyncArrivals(derived.workers, derived.trainers, mu, schedule.batch_size, group_size)
    return SyncArrivals(round(derived.prompts_per_step))


class WeightHistory:
    """CPU copies of the last ``lag + 1`` policy versions, so the generator can be synced to the
    weights of version ``t - lag`` (a weight-sync lag, as in an async cluster).

    Memory: lag + 1 copies of the weights; meant for small models or small lags."""

    def __init__(self, lag: int):
        self.lag = lag
        self.versions: dict[int, dict[str, torch.Tensor]] = {}

    def push(self, version: int, policy: torch.nn.Module) -> None:
        """Record the weights of ``version`` (call after each update and at start)."""
        if self.lag == 0:
            return
        self.versions[version] = {
            k: v.detach().cpu().clone() for k, v in policy.state_dict().items()
        }
        for old in [v for v in self.versions if v < version - self.lag]:
            del self.versions[old]

    def weights_for(self, step: int, policy: torch.nn.Module) -> tuple[int, object]:
        """(version, weights) the generator should hold at ``step``: version max(0, step - lag);
        the live module itself when the lag is 0."""
        version = max(0, step - self.lag)
        if self.lag == 0:
            return version, policy
        return version, self.versions[version]

    def state_dict(self) -> dict:
        return {"lag": self.lag, "versions": {str(k): v for k, v in self.versions.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.lag = state["lag"]
        self.versions = {int(k): v for k, v in state["versions"].items()}
