"""The exact gradient-noise variance of FIFO replay with uniform sampling, with a correlation
rho(delta) that depends on how far apart two uses of a rollout are; the on-policy baseline as
its special case. Beside the paper's bound (``replay_exp.theory.bound.objective``).

Model (synchronous, long run, the buffer full). Each step pushes R fresh rollouts into a FIFO
of capacity N = x R, then draws B = y R of its rollouts uniformly with replacement and takes the
mean of their gradients, g_t. Rollout i's gradient noise when it is a steps old is e_i(a),
zero-mean, with Var e_i(a) = sigma^2(a) and Corr(e_i(a), e_i(a')) = rho(|a - a'|) (the same
rollout scored by two versions of the policy), independent across rollouts and of the draws.
What an SGD trajectory accumulates is the sum of the g_t, so the variance that matters per step
is the long-run rate V = lim Var(sum_t g_t) / T: reuse across steps enters as covariance
between steps, which a per-step variance would miss.

Exact rate. Rollout i contributes W_i = (1/B) sum_a c_a e_i(a), c_a = how often it is drawn at
age a (Binomial(B, 1/N), independent across steps), and contributions of different rollouts
are uncorrelated (zero-mean noise independent of the counts), so V = R E[Var W_i]. With
E[c_a c_a'] = (B/N)^2 + [a = a'] (B/N)(1 - 1/N):

    R V = E_L[ (1 - 1/N) / (x y) sum_{a<L} sigma^2(a)
               + 1 / x^2 sum_{a, a' < L} rho(|a - a'|) sigma(a) sigma(a') ]      (rho(0) = 1)

where L is the rollout's lifetime in steps: a rollout pushed at position p of R lives
floor(x - 1 + p / R) + 1 steps (x for every rollout when x is whole; otherwise ceil(x) for a
fraction x - floor(x) of them and floor(x) for the rest). With sigma = 1 and a constant rho at
whole x this is

    R V = (1 - 1/N) / y + 1/x + rho (1 - 1/x),

against the paper's 1/y + 1/x + rho: the paper charges the correlation term rho in full even
when x = 1, where a rollout is never reused across steps, and its 1/y + 1/x is the cost of
resampling with replacement. The **on-policy baseline** uses each of its B = R fresh
rollouts exactly once (c_0 = 1, no resampling): R V = sigma^2(0), i.e. 1, where the paper's
J(1, 1) gives 2 + rho.

Per unit of compute (a step costs B + mu R, in units of mu R: 1 + y / mu) the objective is
J = (1 + y / mu) R V, comparable across configurations and with J_on = (1 + 1/mu) sigma^2(0).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np


def lifetimes(x: float, R: int) -> list[tuple[int, float]]:
    """(lifetime in steps, share of rollouts) of a FIFO of capacity x R fed R per step."""
    if x < 1:
        raise ValueError(f"x = N / R must be >= 1 (the buffer holds a step's rollouts), got {x}")
    lives: dict[int, int] = {}
    for p in range(R):
        L = math.floor(x - 1 + p / R + 1e-12) + 1
        lives[L] = lives.get(L, 0) + 1
    return [(L, n / R) for L, n in sorted(lives.items())]


def rho_interpolated(deltas: Sequence[float], rhos: Sequence[float]) -> Callable[[float], float]:
    """rho(delta) through measured points, rho(0) = 1, linear in between, constant after the
    last measured delta (an extrapolation: rho is not measured there)."""
    d = np.concatenate([[0.0], np.asarray(deltas, float)])
    r = np.concatenate([[1.0], np.asarray(rhos, float)])
    if np.any(np.diff(d) <= 0):
        raise ValueError("deltas must be increasing and > 0")

    def rho(delta: float) -> float:
        return float(np.interp(delta, d, r))

    return rho


def _one(v: float) -> float:
    return 1.0


def variance_rate(
    x: float,
    y: float,
    R: int,
    rho: Callable[[float], float],
    sigma2: Callable[[float], float] = _one,
) -> float:
    """R V of FIFO + uniform sampling with replacement (module docstring), in units of
    sigma^2 / R."""
    N = x * R
    out = 0.0
    for L, share in lifetimes(x, R):
        ages = np.arange(L, dtype=float)
        s2 = np.array([sigma2(a) for a in ages])
        s = np.sqrt(s2)
        gaps = np.abs(ages[:, None] - ages[None, :])
        corr = np.vectorize(lambda g: 1.0 if g == 0 else rho(g))(gaps)
        resample = (1 - 1 / N) / (x * y) * s2.sum()
        reuse = (corr * np.outer(s, s)).sum() / x**2
        out += share * (resample + reuse)
    return float(out)


def j_exact(
    x: float,
    y: float,
    R: int,
    mu: float,
    rho: Callable[[float], float],
    sigma2: Callable[[float], float] = _one,
) -> float:
    """Gradient-noise variance per unit of compute of FIFO replay: (1 + y / mu) R V."""
    return (1 + y / mu) * variance_rate(x, y, R, rho, sigma2)


def j_on_policy(mu: float, sigma2_0: float = 1.0) -> float:
    """The on-policy baseline's: every fresh rollout once, R V = sigma^2(0), a step 1 + 1/mu."""
    return (1 + 1 / mu) * sigma2_0


def j_paper(x: float, y: float, mu: float, rho: float, sigma_bar2: float = 1.0) -> float:
    """The paper's bound J(x, y) = sigma_bar^2 (1 + y / mu) (1/y + 1/x + rho) at one rho."""
    return sigma_bar2 * (1 + y / mu) * (1 / y + 1 / x + rho)


def mean_reuse_gap(x: float, R: int) -> float:
    """Mean number of steps between two uses of a rollout at two different ages (uniform over
    pairs of distinct ages in its lifetime): (L + 1) / 3 for a lifetime L; 0 if it never lives
    two steps. The gap at which to read rho for the paper's one-rho bound."""
    num = den = 0.0
    for L, share in lifetimes(x, R):
        if L < 2:
            continue
        pairs = L * (L - 1) / 2
        num += share * pairs * (L + 1) / 3
        den += share * pairs
    return num / den if den else 0.0


# The configurations of the Finding 1 studies (B = 64, G = 8): (label, N, R); R = B for on-policy.
STUDY_CONFIGS = (
    ("FIFO N=256, y=2", 256, 32),
    ("FIFO N=512, y=2", 512, 32),
    ("FIFO N=2048, y=2", 2048, 32),
    ("FIFO N=8192, y=2", 8192, 32),
    ("FIFO N=512, y=4", 512, 16),
    ("FIFO N=2048, y=4", 2048, 16),
    ("FIFO N=8192, y=4", 8192, 16),
)


def share_of_pairs_beyond(x: float, R: int, gap: float) -> float:
    """The share of pairs of uses (distinct ages of one rollout) more than ``gap`` steps apart:
    where rho(delta) comes from beyond the last measured delta."""
    far = total = 0.0
    for L, share in lifetimes(x, R):
        d = np.arange(1, L)
        pairs = L - d  # pairs at each gap
        far += share * pairs[d > gap].sum()
        total += share * pairs.sum()
    return float(far / total) if total else 0.0


def compare_models(
    mu: float,
    rho: Callable[[float], float],
    batch: int = 64,
    configs=STUDY_CONFIGS,
    measured_to: float = 16,
) -> list[dict]:
    """Per configuration: J / J_on-policy under the exact rate and under the paper's bound,
    the latter with rho read at delta = 1 and at the configuration's own mean reuse gap
    (sigma flat: the measured alpha is ~0). Below 1: replay predicted better. Also the share
    of a rollout's pairs of uses beyond ``measured_to`` (the last measured delta)."""
    rows = []
    for label, N, R in configs:
        x, y = N / R, batch / R
        rows.append({
            "config": label, "x": x, "y": y, **relative_j(x, y, R, mu, rho),
            "pairs_beyond_measured": share_of_pairs_beyond(x, R, measured_to),
        })  # fmt: skip
    return rows


def relative_j(x: float, y: float, R: int, mu: float, rho: Callable[[float], float]) -> dict:
    """One FIFO configuration's J / J_on-policy: ``exact`` (:func:`j_exact` over
    :func:`j_on_policy`) and the paper's bound over its own J(1, 1) at rho(1), with rho read
    at delta = 1 (``paper_rho1``) and at the configuration's :func:`mean_reuse_gap`
    (``paper_rho_gap``); also that gap and rho there."""
    gap = mean_reuse_gap(x, R)
    paper_on = j_paper(1, 1, mu, rho(1))
    return {
        "mean_gap": gap,
        "rho_at_gap": rho(gap),
        "exact": j_exact(x, y, R, mu, rho) / j_on_policy(mu),
        "paper_rho1": j_paper(x, y, mu, rho(1)) / paper_on,
        "paper_rho_gap": j_paper(x, y, mu, rho(gap)) / paper_on,
    }


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json
    from pathlib import Path

    p = argparse.ArgumentParser(prog="python -m replay_exp.theory.exact", description=__doc__)
    p.add_argument("--mu", type=float, default=6.84)
    p.add_argument(
        "--noise",
        type=Path,
        default=Path("analysis/results/theory_vs_experiment/noise.json"),
        help="a measure_noise output: rho(delta) from its pooled estimate",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write compare.csv and compare.png (the two models side by side) here",
    )
    args = p.parse_args(argv)
    noise = json.loads(args.noise.read_text())
    rho = rho_interpolated(noise["deltas"], noise["pooled"]["rho"])
    print(f"mu = {args.mu}; rho(delta) at {noise['deltas']}: "
          f"{[round(r, 3) for r in noise['pooled']['rho']]} (constant beyond)")  # fmt: skip
    print("J / J_on-policy (below 1: replay predicted better); paper: its own on-policy J(1, 1)")
    last = noise["deltas"][-1]
    print(f"{'config':<18} {'x':>6} {'y':>3} {'gap':>6} {'rho':>5} {'>' + str(last):>5} "
          f"{'exact':>7} {'paper rho(1)':>12} {'paper rho(gap)':>14}")  # fmt: skip
    for r in compare_models(args.mu, rho, measured_to=last):
        print(f"{r['config']:<18} {r['x']:>6.0f} {r['y']:>3.0f} {r['mean_gap']:>6.1f} "
              f"{r['rho_at_gap']:>5.3f} {r['pairs_beyond_measured']:>5.2f} {r['exact']:>7.3f} "
              f"{r['paper_rho1']:>12.3f} {r['paper_rho_gap']:>14.3f}")  # fmt: skip
    print(f"'>{last}': share of a rollout's pairs of uses more than {last} steps apart, where "
          "rho is the extrapolation (constant at its last measured value)")  # fmt: skip
    if args.out is not None:
        plot_comparison(compare_models(args.mu, rho, measured_to=last), args.out, args.mu)


def plot_comparison(rows: list[dict], out, mu: float) -> None:
    """compare.csv and compare.png: J / J_on-policy per configuration under the exact rate
    and under the paper's bound (rho at delta = 1 and at the mean reuse gap), 1 = on-policy."""
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame(rows)
    table.to_csv(out / "compare.csv", index=False)
    fig, ax = plt.subplots(figsize=(9.5, 3.8))
    pos = np.arange(len(table))
    for k, (col, name, marker) in enumerate((
        ("exact", "exact rate, measured rho(delta)", "o"),
        ("paper_rho1", "paper's bound, rho(1)", "s"),
        ("paper_rho_gap", "paper's bound, rho(mean gap)", "^"),
    )):  # fmt: skip
        ax.scatter(pos + (k - 1) * 0.15, table[col], marker=marker, label=name, zorder=3)
    ax.axhline(1.0, color="k", lw=0.8, ls="--", label="on-policy baseline")
    ax.set_xticks(pos, table["config"], rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("J / J_on-policy (below 1: replay predicted better)")
    ax.set_title(f"Gradient noise per unit of compute, mu = {mu:g}", fontsize=10)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "compare.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
