"""A GPU node's generation timing on a machine whose generation costs something else
(``runtime.generation_cost=modelled``): a simulation of *when* batches arrive, not of what they
hold (the rollouts are the real ones, generated as fast as this machine can).

Why: on a CPU a rollout costs 0.3-0.5 of a trained sample, on the paper's GPUs mu = 5.28-6.84
of one, and which side waits for which (the reuse that emerges, the stalls a buffer absorbs)
follows from that ratio. Under ``modelled`` a generator rank makes each of its batches last

    seconds(batch of n) = n * mu * t * max_i L_i / E[max of n L]

where t is the trainers' seconds per trained sample (one trainer rank's, measured as the run
goes: trainer rank 0 publishes its running mean in the rendezvous store after every step;
``runtime.cost_model.reference_s_per_sample`` fixes it instead), mu is ``compute.mu``, and the
L_i are the rollouts' relative response lengths, drawn log-normal with mean 1 and log-sd
``runtime.cost_model.length_sigma`` (the tail). A batch lasts as long as its longest sequence,
as in batched decoding; dividing by E[max of n L] (computed once, by simulation) keeps the
mean cost of a rollout at exactly mu t, so mu is the ratio realised on average and the spread
of the max is what makes stalls. Padding waste and any other GPU inefficiency are in mu, as
they are in the paper's measured mu.

The generator sleeps the difference between that and the real generation time; if the real
generation took longer (mu too small for this machine), nothing is slept and the batch costs
what it took: the realised ratio (``compute/measured_mu``: charged generation seconds per
rollout over training seconds per sample) is then above mu. Lengths are drawn from
``derive_seed(seed, "gencost", w, j)``, so a relaunch redraws the same ones.

A weight load (``runtime.cost_model.load_cost`` = c > 0) pauses the generator for c t seconds
in all (the real load included): a GPU node's broadcast and engine reload, the same whatever
the split, where a generation call of B / T rollouts gets shorter as T grows. Before the first
publication of t a load costs only its real time.

Before the trainers' first step there is no measured t: the generator times one forward and
backward of its first batch on its own copy of the policy (:func:`time_training`) and uses
that for the batches it sends before the first publication.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from replay_exp.models.forward import policy_logprobs
from replay_exp.types import RolloutBatch

# Key under which trainer rank 0 publishes its seconds per trained sample (a float as text).
STORE_KEY = "cost/train_seconds_per_sample"


def lengths(rng: np.random.Generator, n: int, sigma: float) -> np.ndarray:
    """n relative response lengths, log-normal with mean 1 and log-sd ``sigma``."""
    return rng.lognormal(-0.5 * sigma * sigma, sigma, n) if sigma > 0 else np.ones(n)


def expected_max(n: int, sigma: float, draws: int = 20000, seed: int = 0) -> float:
    """E[max of n relative lengths] by simulation (1 when sigma = 0)."""
    if sigma == 0:
        return 1.0
    rng = np.random.default_rng(seed)
    return float(lengths(rng, draws * n, sigma).reshape(draws, n).max(axis=1).mean())


class ModelledCost:
    """Seconds a GPU node would spend on a batch: module docstring."""

    def __init__(self, mu: float, sigma: float):
        self.mu, self.sigma = mu, sigma
        self._norm: dict[int, float] = {}

    def batch_seconds(self, n: int, per_sample: float, rng: np.random.Generator) -> float:
        if n not in self._norm:
            self._norm[n] = expected_max(n, self.sigma)
        longest = float(lengths(rng, n, self.sigma).max())
        return n * self.mu * per_sample * longest / self._norm[n]


def time_training(policy: torch.nn.Module, batch: RolloutBatch, temperature: float,
                  micro_batch_size: int | None) -> float:  # fmt: skip
    """Seconds per sample of one forward and backward over ``batch`` (micro-batches of
    ``micro_batch_size`` rows), on ``policy``; its gradients are dropped afterwards."""
    rows = len(batch)
    step = micro_batch_size or rows
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
