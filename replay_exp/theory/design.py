"""The design model: which FIFO replay design (N, R) a run should use, predicted before the runs,
as a search over the feasible designs under the compute model (issue 44, part 2).

The paper's ``recommend()`` (``replay_exp.theory.bound``, kept as the ``paper`` reference) takes
the closed-form optimum of its bound with rho fixed at its value for a gap of one step, and its
horizon x* is set entirely by alpha. Measured on this testbed, rho falls with the gap (0.99 at
one step, 0.28 at 256: ``analysis/results/theory_vs_experiment/rho_long/``) and alpha's interval
contains 0 ([-0.087, 0.120]: x* anywhere from 2.2 to infinity). This module instead:

1. **Enumerates the feasible designs** of a synchronous run with batch B and group size G:
   fresh rollouts per step R in {G, 2G, ..., B} (whole groups; y = B / R) and capacity
   N in {B, 4B, 16B, ...} up to "never evict within the budget" (N = every rollout the budget
   generates at that R, which is also added). The budget is in the paper's units: a step costs
   (B + mu R) / (B (1 + mu)) of them.
2. **Scores each design by its gradient-noise variance per unit of compute, relative to
   on-policy**, under two models, with the variance of a rollout's gradient noise growing with
   its age a as sigma^2(a) = (1 + a)^(2 alpha) and rho read at each pair of uses' own gap:
   - ``exact``: the exact long-run variance of the batch mean of FIFO + uniform sampling
     (``replay_exp.theory.exact``): (1 + y / mu) R V over the on-policy (1 + 1 / mu), with the
     reuse term summed over the whole distribution of gaps between a rollout's uses (here by an
     autocorrelation of sigma over the lifetime, so a lifetime of 10^5 steps costs
     milliseconds);
   - ``paper_gap``: the paper's bound J = sigma_bar^2(x) (1 + y / mu) (1 / y + 1 / x + rho)
     with rho read at the design's mean reuse gap, over its own J(1, 1) at rho(1).
   Below 1: replay predicted to have less noise per unit of compute than on-policy.
3. **Searches the async split** (``--gpus``): a node of W + T GPUs generates R = B W / (mu T)
   per trainer step at the synchronous design's compute (:class:`AsyncSplit`), so each split is
   scored as the synchronous design at R rounded to whole groups, with N searched as above.
4. **Propagates alpha's uncertainty**: every design is scored at each alpha of a grid over
   alpha's interval; the pick is the best design at the point estimate, and the **region** is
   every design that is best for some alpha in the interval. When the interval contains 0 the
   horizon is not identified (a negative alpha favours ever larger buffers, a positive one a
   finite horizon): ``identified`` is False and the region is what the model cannot tell
   apart, not a point.

rho beyond its last measured gap is held at its last value (``exact.rho_interpolated``): for
the largest buffers most pairs of uses lie there, which the table reports
(``share_beyond``). The primary model is ``exact`` (the issue's ask: rho at the gap
distribution, the exact variance of the batch mean); ``paper_gap`` is reported beside it. On
Finding 1's stage 2 the exact model had the sign against on-policy wrong and the order within
replay right; the paper's bound at the gap had both right (docs/findings.md, item 4): this
module predicts, part 3 of issue 44 scores it.

    python -m replay_exp.theory.design [--noise NOISE.json] [--mu 6.84] [--alpha 0.032
        --alpha-lo -0.087 --alpha-hi 0.120] [--batch 64 --group 8 --budget 3000]
        [--configs N:R ...] [--gpus 8]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.signal import fftconvolve

from replay_exp.theory.bound import objective
from replay_exp.theory.exact import (
    lifetimes,
    mean_reuse_gap,
    rho_interpolated,
    share_of_pairs_beyond,
)

MODELS = ("exact", "paper_gap")


def units_per_step(B: int, R: int, mu: float) -> float:
    """Paper units of one synchronous step: (B + mu R) / (B (1 + mu)); on-policy (R = B): 1."""
    return (B + mu * R) / (B * (1 + mu))


def budget_rollouts(B: int, R: int, mu: float, budget: float) -> int:
    """Fresh rollouts a budget of ``budget`` paper units generates at R per step."""
    return int(math.floor(budget / units_per_step(B, R, mu) + 1e-9)) * R


def exact_rate(x: float, y: float, R: int, rho: Callable[[float], float], alpha: float) -> float:
    """R V of FIFO + uniform sampling with replacement (``exact.variance_rate``) with
    sigma^2(a) = (1 + a)^(2 alpha), computed from the autocorrelation of sigma over a rollout's
    lifetime: sum_{a, a'} rho(|a - a'|) s(a) s(a') = acf(0) + 2 sum_{d >= 1} rho(d) acf(d)."""
    N = x * R
    out = 0.0
    for L, share in lifetimes(x, R):
        s = (1.0 + np.arange(L, dtype=float)) ** alpha  # sigma(a)
        acf = fftconvolve(s, s[::-1])[L - 1 :] if L > 1 else s * s  # acf[d], d = 0..L-1
        rho_d = np.array([1.0] + [rho(d) for d in range(1, L)]) if L < 512 else _rho_vec(rho, L)
        weights = np.where(np.arange(L) == 0, 1.0, 2.0)
        resample = (1 - 1 / N) / (x * y) * float((s * s).sum())
        out += share * (resample + float((weights * rho_d * acf).sum()) / x**2)
    return out


def _rho_vec(rho: Callable[[float], float], L: int) -> np.ndarray:
    """rho(d) for d = 0..L-1, from the function's values at 1..L-1 (rho(0) = 1)."""
    return np.concatenate([[1.0], np.fromiter((rho(d) for d in range(1, L)), float, L - 1)])


def relative_noise(
    N: int,
    R: int,
    B: int,
    mu: float,
    rho: Callable[[float], float],
    alpha: float,
    models: Sequence[str] = MODELS,
) -> dict[str, float]:
    """The ``models``' J / J_on-policy (both by default) for FIFO capacity N fed R per step,
    batch B (module docstring); a model left out is NaN (``exact`` is the slow one). N = R = B
    is the on-policy baseline itself (each rollout used once, no resampling): 1 under both."""
    x, y = N / R, B / R
    if N == R == B:
        return {"exact": 1.0, "paper_gap": 1.0, "mean_gap": 0.0, "rho_gap": 1.0}
    gap = mean_reuse_gap(x, R)
    exact = math.nan
    if "exact" in models:
        exact = (1 + y / mu) * exact_rate(x, y, R, rho, alpha) / (1 + 1 / mu)
    paper = objective(x, y, mu, rho(gap), alpha=alpha) / objective(1, 1, mu, rho(1), alpha=alpha)
    return {"exact": float(exact), "paper_gap": float(paper), "mean_gap": gap, "rho_gap": rho(gap)}


def candidates(B: int, G: int, mu: float, budget: float, factor: int = 4) -> list[tuple[int, int]]:
    """Feasible (N, R): R in {G, ..., B} whole groups; N = B factor^k below the budget's
    rollouts at that R, and that total itself ("never evict within the budget")."""
    out = []
    for R in range(G, B + 1, G):
        total = budget_rollouts(B, R, mu, budget)
        N = B
        while total > N:
            out.append((N, R))
            N *= factor
        out.append((max(total, B), R))
    return out


@dataclass(frozen=True)
class AsyncSplit:
    """One split of an asynchronous node of W + T GPUs (``schedule=async``): R = B W / (mu T)
    fresh rollouts per trainer step on average (y = mu T / W), each step costing gamma = (1 +
    W/T) / (1 + mu) paper units, which is the synchronous (B + mu R) / (B (1 + mu)) at that R:
    the same compute as a synchronous design. Its noise is scored as the synchronous design at
    ``R_groups``, R rounded to whole groups of G (the emulation delivers whole groups and
    carries the fraction over); a split bringing less than one group a step (R < G) has no
    synchronous counterpart and is not scored (``R_groups`` None)."""

    workers: int
    trainers: int
    R: float
    R_groups: int | None


def async_splits(B: int, G: int, mu: float, gpus: int) -> list[AsyncSplit]:
    """The node's splits W = 1 .. gpus - 1 that generate at most a batch per step (R <= B: the
    split with W / T = mu generates exactly B, on-policy's rate; more workers only idle)."""
    out = []
    for W in range(1, gpus):
        T = gpus - W
        R = B * W / (mu * T)
        if R <= B + 1e-9:
            groups = int(min(B, G * round(R / G))) if R >= G else None
            out.append(AsyncSplit(W, T, R, groups))
    return out


def async_designs(
    B: int, G: int, mu: float, budget: float, gpus: int, factor: int = 4
) -> list[tuple[AsyncSplit, int, int]]:
    """(split, N, R_groups) for every split (:func:`async_splits`) and every N of
    :func:`candidates` at its R_groups (two splits may round to one R: both are listed)."""
    return [
        (split, N, R)
        for split in async_splits(B, G, mu, gpus)
        for N, R in candidates(B, G, mu, budget, factor)
        if split.R_groups == R
    ]


@dataclass
class DesignResult:
    """The search's answer under ``model``: the pick at the point alpha, whether the horizon is
    identified (alpha's interval excludes 0), the region of designs best for some alpha in the
    interval, and every candidate's relative noise at each alpha of the grid."""

    model: str
    alpha: float
    alpha_interval: tuple[float, float]
    pick: tuple[int, int]
    identified: bool
    region: list[tuple[int, int]]
    alphas: list[float]
    table: dict[tuple[int, int], list[float]] = field(repr=False)

    def describe(self, B: int) -> str:
        lo, hi = self.alpha_interval
        (N, R) = self.pick
        region = ", ".join(f"(N={n}, y={B / r:g})" for n, r in self.region)
        note = "" if self.identified else " (alpha's interval contains 0: not identified)"
        return (f"{self.model}: pick N = {N}, R = {R} (y = {B / R:g}) at alpha {self.alpha:g}; "
                f"best for some alpha in [{lo:g}, {hi:g}]{note}: {region}")  # fmt: skip


def design(
    B: int,
    G: int,
    mu: float,
    budget: float,
    rho: Callable[[float], float],
    alpha: float,
    alpha_lo: float,
    alpha_hi: float,
    model: str = "exact",
    n_alpha: int = 9,
    designs: Sequence[tuple[int, int]] | None = None,
) -> DesignResult:
    """Search ``designs`` (default :func:`candidates`) for the least noise per unit of compute
    under ``model``, at alpha and across alpha's interval (module docstring)."""
    if model not in MODELS:
        raise ValueError(f"model={model!r}: choose one of {MODELS}")
    if not alpha_lo <= alpha <= alpha_hi:
        raise ValueError(f"alpha {alpha} is not inside its interval [{alpha_lo}, {alpha_hi}]")
    designs = list(designs or candidates(B, G, mu, budget))
    alphas = sorted({alpha, *np.linspace(alpha_lo, alpha_hi, n_alpha).tolist()})
    table = {
        d: [relative_noise(d[0], d[1], B, mu, rho, a, (model,))[model] for a in alphas]
        for d in designs
    }
    best_at = [min(designs, key=lambda d, i=i: table[d][i]) for i in range(len(alphas))]
    pick = best_at[alphas.index(alpha)]
    region = sorted(set(best_at), key=lambda d: (d[1], d[0]))
    return DesignResult(
        model=model, alpha=alpha, alpha_interval=(alpha_lo, alpha_hi), pick=pick,
        identified=not (alpha_lo <= 0 <= alpha_hi), region=region, alphas=alphas, table=table,
    )  # fmt: skip


def ranking(
    configs: Sequence[tuple[str, int, int]], B: int, mu: float, rho, alpha: float, model: str
) -> list[tuple[str, float]]:
    """``configs`` (label, N, R) from least to most predicted noise per unit of compute (the
    predicted order of final accuracy, best first), with each one's J / J_on-policy."""
    scored = [(label, relative_noise(N, R, B, mu, rho, alpha)[model]) for label, N, R in configs]
    return sorted(scored, key=lambda t: t[1])


def print_async(B, G, mu, budget, gpus, rho, alpha, lo, hi) -> None:
    """The async node's splits: each one's best N and J / J_on-policy under both models at the
    point alpha, then each model's pick and region over every split's designs."""
    rows = async_designs(B, G, mu, budget, gpus)
    print(f"\nasync node of {gpus} GPUs (W + T), scored at R rounded to whole groups of {G}:")
    print("| W | T | R = B W / (mu T) | y | scored R | best N (exact) | exact | best N "
          "(paper_gap) | paper_gap |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for split in async_splits(B, G, mu, gpus):
        if split.R_groups is None:
            print(f"| {split.workers} | {split.trainers} | {split.R:.3g} | {B / split.R:.3g} | "
                  "< G: not scored | | | | |")  # fmt: skip
            continue
        best = {}
        for m in MODELS:
            best[m] = min((relative_noise(N, R, B, mu, rho, alpha, (m,))[m], N)
                          for sp, N, R in rows if sp == split)  # fmt: skip
        print(f"| {split.workers} | {split.trainers} | {split.R:.3g} | {B / split.R:.3g} | "
              f"{split.R_groups} | {best['exact'][1]} | {best['exact'][0]:.3f} | "
              f"{best['paper_gap'][1]} | {best['paper_gap'][0]:.3f} |")  # fmt: skip
    designs = sorted({(N, R) for _, N, R in rows})

    def workers(d: tuple[int, int]) -> str:
        return "/".join(str(sp.workers) for sp, N, R in rows if d == (N, R))

    for m in MODELS:
        res = design(B, G, mu, budget, rho, alpha, lo, hi, model=m, designs=designs)
        region = ", ".join(f"(W={workers(d)}, N={d[0]})" for d in res.region)
        note = "" if res.identified else " (not identified)"
        print(f"{m}: pick W = {workers(res.pick)}, N = {res.pick[0]}; region {region}{note}")


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json
    from pathlib import Path

    p = argparse.ArgumentParser(prog="python -m replay_exp.theory.design", description=__doc__)
    p.add_argument("--noise", type=Path,
                   default=Path("analysis/results/theory_vs_experiment/rho_long/noise.json"),
                   help="a theory.measure output: rho(delta) from its pooled estimate")  # fmt: skip
    p.add_argument("--mu", type=float, default=6.84)
    p.add_argument("--alpha", type=float, default=0.032, help="theory_check.md's estimate")
    p.add_argument("--alpha-lo", type=float, default=-0.087)
    p.add_argument("--alpha-hi", type=float, default=0.120)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--budget", type=float, default=3000.0, help="paper units")
    p.add_argument("--configs", nargs="*", default=[], metavar="N:R",
                   help="also rank these designs (N:R; R = batch: on-policy)")  # fmt: skip
    p.add_argument("--gpus", type=int, default=None,
                   help="also search the splits W + T of an async node of this size")  # fmt: skip
    args = p.parse_args(argv)
    noise = json.loads(args.noise.read_text())
    rho = rho_interpolated(noise["deltas"], noise["pooled"]["rho"])
    last = noise["deltas"][-1]
    B, mu = args.batch, args.mu
    print(f"mu {mu}, B {B}, G {args.group}, budget {args.budget:g} units; alpha {args.alpha} "
          f"[{args.alpha_lo}, {args.alpha_hi}]; rho at {noise['deltas']}: "
          f"{[round(r, 3) for r in noise['pooled']['rho']]} (held beyond {last})")  # fmt: skip
    for model in MODELS:
        res = design(B, args.group, mu, args.budget, rho, args.alpha, args.alpha_lo,
                     args.alpha_hi, model=model)  # fmt: skip
        print(res.describe(B))
    if args.gpus:
        print_async(B, args.group, mu, args.budget, args.gpus, rho, args.alpha, args.alpha_lo,
                    args.alpha_hi)  # fmt: skip
    configs = []
    for c in args.configs:
        N, R = (int(v) for v in c.split(":"))
        configs.append((f"N={N}, y={B / R:g}" if R < B else "on-policy", N, R))
    if configs:
        print("\n| design | x | mean gap | pairs beyond " + str(last) + " | exact | rank | "
              "paper_gap | rank |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|")
        ranks = {m: [lab for lab, _ in ranking(configs, B, mu, rho, args.alpha, m)] for m in MODELS}
        for label, N, R in configs:
            r = relative_noise(N, R, B, mu, rho, args.alpha)
            print(f"| {label} | {N / R:g} | {r['mean_gap']:.1f} | "
                  f"{share_of_pairs_beyond(N / R, R, last):.2f} | {r['exact']:.3f} | "
                  f"{ranks['exact'].index(label) + 1} | {r['paper_gap']:.3f} | "
                  f"{ranks['paper_gap'].index(label) + 1} |")  # fmt: skip


if __name__ == "__main__":
    main()
