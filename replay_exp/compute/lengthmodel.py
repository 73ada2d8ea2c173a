"""The response lengths of the modelled GPU timing (``runtime.generation_cost=modelled``,
replay_exp/compute/gencost.py, and the analysis's node clock,
replay_exp/analysis/studies/node_time.py):
pure numbers, no torch, so that the analysis can use them.

Relative response lengths are log-normal with mean 1 and log-sd sigma; a batch of n lasts as
long as its longest, M, whose distribution is P[M <= m] = F(m)^n (F the log-normal's CDF). M is
drawn by its quantile at a level u, and the levels of a stream's calls are stratified in blocks
of ``BLOCK``: call k of a block takes the slice ``perm[k]`` of (0, 1) of a seeded permutation,
uniformly inside it, so every M has exactly its distribution while a block's mean is close to
E[M] (gencost.py's docstring has the numbers).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from replay_exp.config.seeding import derive_seed

_NORMAL = NormalDist()
# Calls per stratified block of quantile levels.
BLOCK = 8


def longest(u: float, n: int, sigma: float) -> float:
    """The quantile at ``u`` of the longest of n relative lengths: P[M <= m] = F(m)^n, so
    m = F^-1(u^(1/n)) = exp(-sigma^2 / 2 + sigma Phi^-1(u^(1/n)))."""
    if sigma == 0:
        return 1.0
    return math.exp(-0.5 * sigma * sigma + sigma * _NORMAL.inv_cdf(u ** (1.0 / n)))


def expected_max(n: int, sigma: float, points: int = 20000) -> float:
    """E[longest of n relative lengths] = the integral of :func:`longest` over u in (0, 1),
    by the midpoint rule (1 when sigma = 0)."""
    if sigma == 0:
        return 1.0
    return math.fsum(longest((k + 0.5) / points, n, sigma) for k in range(points)) / points


def quantile_levels(seed: int, w: int | str, block: int) -> np.ndarray:
    """The BLOCK levels u of stream ``w``'s calls ``block * BLOCK ..``: call k of the block
    takes the slice ``perm[k]`` of a seeded permutation, uniform inside it (module
    docstring)."""
    rng = np.random.default_rng(derive_seed(seed, "gencost", w, block))
    perm, offsets = rng.permutation(BLOCK), rng.random(BLOCK)
    return (perm + offsets) / BLOCK


def quantile_level(seed: int, w: int | str, j: int) -> float:
    """u_j of stream ``w``'s call ``j`` (generator ``w``'s; the analysis's node clock uses
    ``w = "node"``)."""
    block, k = divmod(j, BLOCK)
    return float(quantile_levels(seed, w, block)[k])
