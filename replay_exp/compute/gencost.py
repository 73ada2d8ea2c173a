"""A GPU node's generation timing on a machine whose generation costs something else
(``runtime.generation_cost=modelled``): a simulation of *when* batches arrive, not of what they
hold (the rollouts are the real ones, generated as fast as this machine can).

Why: on a CPU a rollout costs 0.3-0.5 of a trained sample, on the paper's GPUs mu = 5.28-6.84
of one, and which side waits for which (the reuse that emerges, the stalls a buffer absorbs)
follows from that ratio. Under ``modelled`` a generator rank makes its call ``j`` of n rollouts
last

    seconds(call j) = n * mu * t * M_j / E[M]

where t is the trainers' seconds per trained sample (one trainer rank's, measured as the run
goes: trainer rank 0 publishes its running mean in the rendezvous store after every step;
``runtime.cost_model.reference_s_per_sample`` fixes it instead), mu is ``compute.mu``, and M_j
is the longest of the call's n relative response lengths, which are log-normal with mean 1 and
log-sd ``runtime.cost_model.length_sigma`` (the tail). A batch lasts as long as its longest
sequence, as in batched decoding; dividing by E[M] keeps the mean cost of a rollout at
exactly mu t, so mu is the ratio realised on average and the spread of M is what makes
stalls. Padding waste and any other GPU inefficiency are in mu, as they are in the paper's
measured mu.

M_j is drawn from its own distribution (P[M <= m] = F(m)^n, F the log-normal's CDF) by its
quantile at u_j (replay_exp/compute/lengthmodel.py), and the u_j are stratified in blocks of 8
calls:
each call of a block takes a different one of the 8 equal slices of (0, 1) (a seeded
permutation), uniformly inside it. Every M_j has exactly the distribution above, and a
block's mean M / E[M] has a third of the spread of 8 independent draws (n = 64, sigma = 0.5,
400 seeds: sd 0.031, 5-95 % 0.97-1.06, against 0.088 and 0.87-1.15; seed 0 of the 30-step
bench drew 0.933 independent), so a short run realises mu rather than mu times its draws'
luck. The u_j come from ``derive_seed(seed, "gencost", w, block)``, so a relaunch redraws the
same ones.

The trainers' t changes as the run goes (the first update is the slowest, and before their
first step there is none: the generator then times one forward and backward of its first
batch on its own copy of the policy, :func:`time_training`). Each call is therefore timed so
that the generator's calls so far have lasted, in all, their modelled units at the *latest* t:
a call lasts its own n mu M_j / E[M] t plus the revaluation of the earlier calls at the new t,
less what they lasted beyond their targets (positive or negative; a call is never shorter than
its real generation, and what it cannot give back the next calls do). Over a run the
generator's total then tracks the model at the trainers' final t, not at a mix of their early
estimates.

The generator sleeps the difference between that and the real generation time; if the real
generation took longer (mu too small for this machine), nothing is slept and the batch costs
what it took (an ``overrun``): the realised ratio (``compute/measured_mu``: charged
generation seconds per rollout over training seconds per sample) is then above mu.

A weight load (``runtime.cost_model.load_cost`` = c > 0) pauses the generator for c t seconds
in all (the real load included): a GPU node's broadcast and engine reload, the same whatever
the split, where a generation call of B / T rollouts gets shorter as T grows. Before the first
publication of t a load costs only its real time.
"""

from __future__ import annotations

import math
import time

import torch

from replay_exp.compute.lengthmodel import expected_max, longest
from replay_exp.models.forward import policy_logprobs
from replay_exp.types import RolloutBatch

# Key under which trainer rank 0 publishes its seconds per trained sample (a float as text).
STORE_KEY = "cost/train_seconds_per_sample"


class ModelledCost:
    """What a GPU node would spend on a generator's calls (module docstring), with the
    revaluation of its earlier calls at the newest t."""

    def __init__(self, mu: float, sigma: float):
        self.mu, self.sigma = mu, sigma
        self._norm: dict[int, float] = {}
        self.units = 0.0  # the calls so far, in trained samples' time: sum of n mu M_j / E[M]
        self.spent = 0.0  # the seconds they lasted (their real time where it was longer)

    def call_units(self, n: int, u: float) -> float:
        """A call of n rollouts with quantile level u, in trained samples' time."""
        if n not in self._norm:
            self._norm[n] = expected_max(n, self.sigma)
        return n * self.mu * longest(u, n, self.sigma) / self._norm[n]

    def next_call(self, n: int, u: float, per_sample: float, elapsed: float) -> tuple[float, float]:
        """(seconds this call lasts in all, its own share n mu M / E[M] t) at t =
        ``per_sample``, for a call whose real generation took ``elapsed``: the calls so far,
        this one included, at the newest t, less what the earlier ones lasted, and never less
        than ``elapsed`` (what a call cannot give back, the next ones do)."""
        own = self.call_units(n, u)
        self.units += own
        seconds = max(self.units * per_sample - self.spent, elapsed)
        self.spent += seconds
        return seconds, own * per_sample


def time_training(policy: torch.nn.Module, batch: RolloutBatch, temperature: float,
                  micro_batch_size: int | None) -> float:  # fmt: skip
    """Seconds per sample of one forward and backward over ``batch`` (micro-batches of
    ``micro_batch_size`` rows), on ``policy``, timed after one untimed pass; its gradients are
    dropped afterwards."""
    rows = len(batch)
    step = micro_batch_size or rows
    for _ in range(2):  # the first pass warms up (allocations): the second is timed
        t0 = time.perf_counter()
        with torch.enable_grad():
            for start in range(0, rows, step):
                part = batch.index(torch.arange(start, min(rows, start + step)))
                logp, _ = policy_logprobs(policy, part, temperature)
                (logp * part.completion_mask_BxC.to(logp.device)).sum().backward()
        seconds = time.perf_counter() - t0
        policy.zero_grad(set_to_none=True)
    return seconds / rows


def published_seconds(store) -> float | None:
    """Trainer rank 0's latest seconds per trained sample, if it has published one."""
    try:
        if not store.check([STORE_KEY]):
            return None
        value = float(store.get(STORE_KEY).decode())
    except (RuntimeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None
