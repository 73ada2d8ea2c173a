"""``controller.policy=model``: re-run the design model (``replay_exp.theory.design``) on
online estimates at each decision, and jump to its pick.

Inputs:

- **alpha**, estimated online from the window's trained rows. The design model's noise grows
  with a rollout's age a as sigma^2(a) = (1 + a)^(2 alpha). The proxy read here is the
  variance inflation of an importance-weighted mean over the rows of age a, n sum w^2 /
  (sum w)^2 = 1 / ESS fraction (1 for equal weights; rows of age 0 have w = 1 under the hf
  engine). Rows of age >= 1 are binned by floor(log2 a) within each step; a (step, bin) with
  at least two rows gives the point (2 log(1 + mean age), log inflation) and the fit through
  the origin, weighted by rows, is alpha = sum n x y / sum n x^2. Its 95 % interval is the
  percentile bootstrap over the window's steps (``controller.model.bootstrap`` resamples,
  seeded by the run's seed and the step). The proxy cannot be negative (an inflation is >= 1),
  so unlike the offline measurement (``theory.measure``) it never favours ever larger buffers
  by a negative alpha: a stated limit, not a finding.
- **rho(delta)**, the correlation of a rollout's gradient noise between two uses delta steps
  apart: measured once per model and task (``python -m replay_exp.theory.measure``), read from
  ``controller.model.noise``; held at its last value beyond its last gap.
- **mu**: the cost model's (``compute.mu``), the one the ledger charges; **the budget**: the
  run's ``schedule.max_compute``, which bounds the candidates' buffers ("never evict within
  the budget"). Not what is left of it: a search at the remaining budget shrinks that bound
  as the run goes and evicts data the rest of the run could still use (seen in a trial run).

Decision: with fewer than ``min_aged_rows`` rows of age >= 1 in the window (a start with N = R:
every row is fresh) there is nothing to estimate alpha from, so it **probes**: one rung up
the ladder. Otherwise it searches the feasible designs at the budget
(``theory.design.design``, restricted to R >= R_min and N <= N_max) under
``controller.model.model`` (``paper_gap`` by default: on Finding 1's stage 2 it had the sign
and the order right, ``exact`` the order only). Identified (alpha's interval excludes 0): go to
the pick. Not identified: hold if the current design is in the region of designs the model
cannot tell apart, else go to the region's member nearest it (in log R, then log N).
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

import numpy as np

from replay_exp import PROJECT
from replay_exp.theory.design import candidates, design, relative_noise
from replay_exp.theory.exact import rho_interpolated


def _points(lag: np.ndarray, logw: np.ndarray) -> list[tuple[float, float, int]]:
    """(x = 2 log(1 + mean age), y = log inflation, rows) per age bin of one step's rows."""
    out = []
    aged = lag >= 1
    if not aged.any():
        return out
    lag, logw = lag[aged], logw[aged]
    bins = np.floor(np.log2(lag)).astype(int)
    for b in np.unique(bins):
        sel = bins == b
        n = int(sel.sum())
        if n < 2:
            continue
        w = logw[sel] - logw[sel].max()  # exp of this is <= 1: no overflow
        infl = n * np.exp(2 * w).sum() / np.exp(w).sum() ** 2
        out.append((2 * math.log1p(float(lag[sel].mean())), math.log(infl), n))
    return out


def _fit(points: list[tuple[float, float, int]]) -> float:
    x = np.array([p[0] for p in points])
    y = np.array([p[1] for p in points])
    n = np.array([p[2] for p in points], float)
    den = float((n * x * x).sum())
    return float((n * x * y).sum()) / den if den > 0 else math.nan


def estimate_alpha(
    rows: list[tuple[np.ndarray, np.ndarray]], rng: np.random.Generator, n_boot: int
) -> tuple[float, float, float, int]:
    """(alpha, 2.5 %, 97.5 % bootstrap percentiles, aged rows) from one window's per-step
    (lag, log w) arrays (module docstring); NaNs where no (step, bin) has two aged rows.

    Hand-checked: one step whose two rows of age 1 have w = 1 and 3: inflation
    2 (1 + 9) / 16 = 1.25, x = 2 log 2, so alpha = log 1.25 / (2 log 2) = 0.161."""
    per_step = [_points(lag, w) for lag, w in rows]
    aged = int(sum(int((lag >= 1).sum()) for lag, _ in rows))
    pooled = [p for pts in per_step for p in pts]
    if not pooled:
        return math.nan, math.nan, math.nan, aged
    alpha = _fit(pooled)
    boots = []
    for _ in range(n_boot):
        pick = rng.integers(0, len(per_step), len(per_step))
        pts = [p for i in pick for p in per_step[i]]
        if pts:
            boots.append(_fit(pts))
    lo, hi = np.percentile(boots, [2.5, 97.5]) if boots else (alpha, alpha)
    return alpha, float(lo), float(hi), aged


def noise_path(path: str) -> Path:
    """``controller.model.noise`` as a file: as given (from the working directory), else under
    the project's root (where the default, the embedded testbed's measurement, lives)."""
    p = Path(path)
    return p if p.is_absolute() or p.is_file() else PROJECT / p


@cache
def load_rho(path: str):
    """rho(delta) of a ``theory.measure`` output (its pooled estimate), read once."""
    noise = json.loads(noise_path(path).read_text())
    return rho_interpolated(noise["deltas"], noise["pooled"]["rho"])


def pick_design(
    current: tuple[int, int],
    B: int,
    G: int,
    mu: float,
    budget: float,
    rho,
    alpha: float,
    lo: float,
    hi: float,
    model: str,
    R_min: int,
    N_max: int,
    fixed_R: bool = False,
) -> tuple[tuple[int, int], bool, str, float]:
    """((N, R) to use, identified, reason, its predicted gain) at the run's budget (module
    docstring). The gain is 1 - J(pick) / J(current) at the point alpha (J: the model's noise
    per unit of compute; 0 for the current design), what ``controller.model.min_gain`` gates.
    ``fixed_R``: R is not the controller's (``schedule=async``: it emerges from W, T and mu),
    so only the designs at the current R compete (N alone)."""
    designs = [(N, R) for N, R in candidates(B, G, mu, budget) if R_min <= R and N_max >= N]
    if fixed_R:
        designs = [x for x in designs if x[1] == current[1]]  # (N, R)
    if not designs:
        return current, False, "no feasible design within the bounds: hold", 0.0
    res = design(B, G, mu, budget, rho, alpha, lo, hi, model=model, n_alpha=5,
                 designs=designs)  # fmt: skip

    def gain(d: tuple[int, int]) -> float:
        if d == current:
            return 0.0
        j = {x: relative_noise(x[0], x[1], B, mu, rho, alpha, (model,))[model]
             for x in (d, current)}  # fmt: skip
        return 1.0 - j[d] / j[current]

    if res.identified:
        return res.pick, True, f"identified: pick N={res.pick[0]}, R={res.pick[1]}", gain(res.pick)
    if current in res.region:
        return current, False, "not identified; the current design is in the region: hold", 0.0

    def distance(d: tuple[int, int]) -> tuple[float, float]:
        return abs(math.log(d[1] / current[1])), abs(math.log(d[0] / current[0]))

    nearest = min(res.region, key=distance)
    reason = f"not identified; nearest in the region N={nearest[0]}, R={nearest[1]}"
    return nearest, False, reason, gain(nearest)
