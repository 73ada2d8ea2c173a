"""Student's t distribution: the CDF and its quantile, for the seed-level intervals of
``replay_exp.analysis.stats`` (no SciPy in the pin set).

The CDF goes through the regularized incomplete beta function,
``F(t; nu) = 1 - I_{nu / (nu + t^2)}(nu / 2, 1 / 2) / 2`` for t >= 0 (symmetric below 0), with
``I_x(a, b)`` from its continued fraction (modified Lentz), which converges fast for
``x < (a + 1) / (a + b + 2)`` and otherwise through ``I_x(a, b) = 1 - I_{1-x}(b, a)``. The
quantile inverts the CDF by bisection (monotone, 200 halvings: exact to float precision).
``nu = inf`` is the standard normal.
"""

from __future__ import annotations

import math
from statistics import NormalDist

_TINY = 1e-300


def _beta_cf(x: float, a: float, b: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz's method)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 500):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + num / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_cf(x, a, b) / a
    return 1.0 - math.exp(log_front) * _beta_cf(1.0 - x, b, a) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (``inf``: the normal)."""
    if math.isinf(df):
        return NormalDist().cdf(t)
    tail = 0.5 * betainc(df / (df + t * t), df / 2.0, 0.5)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` > 0 degrees of freedom."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p must be in (0, 1), got {p}")
    if not df > 0:
        raise ValueError(f"t_quantile: df must be > 0, got {df}")
    if math.isinf(df):
        return NormalDist().inv_cdf(p)
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-14 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)
