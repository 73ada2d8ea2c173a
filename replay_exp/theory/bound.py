"""The replay trade-off of Arnal et al. (2026), "Efficient RL Training for LLMs with Experience
Replay": optimal staleness horizon and reuse ratio, and what to run to get them.

Model (synchronous). Each step generates R fresh rollouts, pushes them into a FIFO buffer of
capacity N and trains on a batch of B sampled uniformly from it. Measuring compute in
forward-backward sample units, a step costs ``c = B + mu R``, where ``mu`` is the cost of
generating one rollout divided by the cost of one forward-backward on it. Only two ratios
matter (absolute sizes are not identified by the theory):

* ``x = N / R``, the staleness horizon (steps a rollout stays in the buffer);
* ``y = B / R``, the replay ratio (how many times a rollout is trained on, on average).

The quantity to minimise (gradient noise per unit of compute) is

    J(x, y) = sigma_bar^2(x) (1 + y / mu) (1 / y + 1 / x + rho),

where ``sigma^2(tau)`` bounds the gradient-noise variance of a rollout ``tau`` steps old,
``sigma_bar^2(x)`` is its mean over the buffer (:func:`sigma_bar2_from_profile`), and
``rho`` in [0, 1] is the correlation between the gradients of reused samples. At fixed ``x``
the optimum is ``y*(x) = sqrt(mu / (rho + 1/x))`` and
``J*(x) = sigma_bar^2(x) (1/sqrt(mu) + sqrt(rho + 1/x))^2``. With the power law
``sigma(tau) = (tau / tau_0)^alpha`` one minimises ``K(x) = x^alpha (1/sqrt(mu) +
sqrt(rho + 1/x))`` (``sqrt(J*)`` up to a constant), which has a closed form
(:func:`closed_form_optimum`). Worked examples of the paper: ``alpha=0.1, rho=0.1, mu=5.28``
gives ``x* = 14.3, y* = 5.6`` (replay); ``alpha=0.3, rho=1, mu=1`` gives ``x* = 0.19,
y* = 0.4`` (stay on-policy).

Asynchronous cluster. A node of ``gpus`` GPUs is split into W inference workers and T trainers
(W + T = gpus). To first order the reuse ratio is ``mu T / W`` and one training step costs
``gamma = (1 + W/T) / (1 + mu)`` on-policy steps (:func:`async_gamma`). The paper
estimates ``mu`` from a finished run as ``(K_train / T) / (K_inf / W)``, with K_train the
samples trained on (repeats included) and K_inf the unique rollouts generated
(:func:`estimate_mu`, :func:`estimate_mu_from_run`).

Conventions:

* ``x``, ``y``, ``mu`` are ratios; the power law is taken with ``tau_0 = 1`` and
  ``sigma_bar^2(x) = x^(2 alpha)`` (the FIFO mean of ``tau^(2 alpha)`` is
  ``x^(2 alpha) / (2 alpha + 1)``, a constant factor that moves no argmin).
* ``alpha`` must be > 0, ``mu`` > 0 and ``rho`` in [0, 1]; violations raise ValueError.
* ``alpha >= 1/2`` has no interior optimum: ``K`` increases in ``x``, so the infimum is the
  boundary ``x* -> 0``, ``y* -> 0``; :func:`closed_form_optimum` returns ``(0.0, 0.0)`` and the
  regime counts as on-policy.
* "On-policy" means the optimum asks for no reuse: ``y* <= 1`` (:func:`on_policy_regime`).
* Functions named in the formulas (:func:`objective`, :func:`K`) are vectorised over numpy
  arrays; the optimisers return Python floats.

The figures (:func:`replay_exp.theory.cli.plot_theory`) and the command line
(``replay-exp-theory --mu 6.84 --alpha 0.1 --rho 0.1 --batch-size 64``, which prints the
recommended buffer and schedule) live in :mod:`replay_exp.theory.cli`; this module is the math.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from replay_exp.compute.costmodel import (
    async_gamma,
    async_rollouts_per_step,
    first_order_reuse,
    workers_of,
)

ArrayLike = Any  # float or numpy array

# Bounds (in y) of the inner numeric minimisation; y* <= sqrt(mu x) <= 1e8 for any sane input.
_Y_BOUNDS = (1e-8, 1e8)
# Points per decade of the dense outer grid in x of :func:`numeric_optimum`.
_GRID_PER_DECADE = 20
# Zoom search: points per refinement and stopping width (in log space).
_ZOOM_POINTS = 33
_ZOOM_TOL = 1e-9


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def _check_mu_rho(mu: float, rho: float) -> None:
    if not (isinstance(mu, numbers.Real) and math.isfinite(mu) and mu > 0):
        raise ValueError(f"mu={mu} must be a finite number > 0 (generation / training cost)")
    if not (isinstance(rho, numbers.Real) and 0 <= rho <= 1):
        raise ValueError(f"rho={rho} must be in [0, 1] (correlation of reused samples)")


def _check_params(mu: float, alpha: float, rho: float) -> None:
    _check_mu_rho(mu, rho)
    if not (isinstance(alpha, numbers.Real) and math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha={alpha} must be a finite number > 0 (staleness exponent)")


def _sigma_bar2_callable(
    sigma: Callable | None, sigma_bar2: Callable | None, alpha: float | None
) -> Callable[[np.ndarray], np.ndarray]:
    """The one variance profile given, as x -> sigma_bar^2(x)."""
    named = (("sigma", sigma), ("sigma_bar2", sigma_bar2), ("alpha", alpha))
    given = [name for name, v in named if v is not None]
    if len(given) != 1:
        raise ValueError(
            f"give exactly one of sigma, sigma_bar2 or alpha (given: {', '.join(given) or 'none'})"
        )
    if alpha is not None:
        if not math.isfinite(alpha):
            raise ValueError(f"alpha={alpha} must be finite")
        return lambda x: np.asarray(x, dtype=float) ** (2 * alpha)
    if sigma_bar2 is not None:
        return lambda x: np.asarray(sigma_bar2(x), dtype=float)
    return lambda x: sigma_bar2_from_profile(sigma, x)


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------


def _j(x: ArrayLike, y: ArrayLike, mu: float, rho: float, s2: ArrayLike) -> np.ndarray:
    return s2 * (1 + y / mu) * (1 / y + 1 / x + rho)


def objective(
    x: ArrayLike,
    y: ArrayLike,
    mu: float,
    rho: float,
    sigma_bar2: Callable | None = None,
    alpha: float | None = None,
) -> np.ndarray:
    """``J(x, y) = sigma_bar^2(x) (1 + y/mu) (1/y + 1/x + rho)``, vectorised over x and y.

    Give exactly one of ``sigma_bar2`` (a callable x -> sigma_bar^2(x), accepting arrays) or
    ``alpha`` (the power law ``sigma_bar^2(x) = x^(2 alpha)``, tau_0 = 1).
    """
    _check_mu_rho(mu, rho)
    s2 = _sigma_bar2_callable(None, sigma_bar2, alpha)
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    return _j(x, y, mu, rho, s2(x))


def optimal_reuse(x: ArrayLike, mu: float, rho: float) -> np.ndarray:
    """The best reuse ratio at a fixed horizon: ``y*(x) = sqrt(mu / (rho + 1/x))``.

    From ``dJ/dy = 0``: ``(1 + y/mu)(1/y + c)`` with ``c = rho + 1/x`` equals
    ``1/y + c + 1/mu + c y / mu``, minimal at ``y^2 = mu / c``. It does not depend on
    ``sigma_bar^2``.
    """
    _check_mu_rho(mu, rho)
    return np.sqrt(mu / (rho + 1 / np.asarray(x, dtype=float)))


def j_star(
    x: ArrayLike,
    mu: float,
    rho: float,
    sigma_bar2: Callable | None = None,
    alpha: float | None = None,
) -> np.ndarray:
    """``J*(x) = min_y J(x, y) = sigma_bar^2(x) (1/sqrt(mu) + sqrt(rho + 1/x))^2``."""
    _check_mu_rho(mu, rho)
    s2 = _sigma_bar2_callable(None, sigma_bar2, alpha)
    x = np.asarray(x, dtype=float)
    return s2(x) * (1 / math.sqrt(mu) + np.sqrt(rho + 1 / x)) ** 2


def K(x: ArrayLike, mu: float, alpha: float, rho: float) -> np.ndarray:
    """``K(x) = x^alpha (1/sqrt(mu) + sqrt(rho + 1/x))``: ``sqrt(J*(x))`` under the power law
    ``sigma_bar^2(x) = x^(2 alpha)``; vectorised over x."""
    _check_mu_rho(mu, rho)
    x = np.asarray(x, dtype=float)
    return x**alpha * (1 / math.sqrt(mu) + np.sqrt(rho + 1 / x))


@lru_cache(maxsize=1)
def _fifo_nodes() -> tuple[np.ndarray, np.ndarray]:
    """Composite Gauss-Legendre rule on [0, 1]: 12 nodes on each of the geometrically graded
    pieces [4^-(k+1), 4^-k], k = 0..23, and on [0, 4^-24]. The grading resolves the endpoint
    singularity of ``tau^(2 alpha)`` at 0 (plain Gauss-Legendre converges only algebraically
    there); for a power law the rule is exact to ~1e-14."""
    t, w = np.polynomial.legendre.leggauss(12)
    breaks = 0.25 ** np.arange(25)
    hi, lo = breaks, np.append(breaks[1:], 0.0)
    u = lo[:, None] + (hi - lo)[:, None] * (t + 1) / 2
    wu = (hi - lo)[:, None] * w / 2
    return u.ravel(), wu.ravel()


def sigma_bar2_from_profile(sigma: Callable, x: ArrayLike) -> np.ndarray:
    """``sigma_bar^2(x) = (1/x) int_0^x sigma(tau)^2 dtau``.

    Interpretation: a FIFO of horizon x holds rollouts of every staleness in [0, x] in equal
    proportion, so a uniformly sampled batch sees the mean variance over that range. For the
    power law ``sigma(tau) = tau^alpha`` this is ``x^(2 alpha) / (2 alpha + 1)``, proportional
    to ``x^(2 alpha)``, so the optimum of :func:`objective` under the power law is unchanged.

    Computed by Gauss-Legendre quadrature (``numpy.polynomial.legendre.leggauss``) on [0, x],
    composite on geometrically graded pieces towards 0 (see ``_fifo_nodes``). ``sigma`` must
    accept numpy arrays of staleness; ``x`` may be an array (> 0).
    """
    x = np.asarray(x, dtype=float)
    if np.any(~(x > 0)):
        raise ValueError("sigma_bar2_from_profile needs x > 0")
    u, w = _fifo_nodes()
    tau = x[..., None] * u
    return np.sum(w * np.asarray(sigma(tau), dtype=float) ** 2, axis=-1)


# ---------------------------------------------------------------------------------------------
# Optimisation
# ---------------------------------------------------------------------------------------------


def _zoom_argmin(
    f: Callable[[np.ndarray], np.ndarray],
    lo: np.ndarray,
    hi: np.ndarray,
    n_first: int,
    n: int = _ZOOM_POINTS,
    tol: float = _ZOOM_TOL,
) -> np.ndarray:
    """Vectorised k-section search (the many-point generalisation of golden section).

    ``f`` maps an (m, k) array of abscissae to values; ``lo``, ``hi`` are (m,) brackets.
    Evaluates ``n_first`` evenly spaced points, keeps the two intervals around the smallest
    value, then repeats with ``n`` points until the bracket is narrower than ``tol``; each
    round shrinks it by (n - 1) / 2. Finds the global minimum of the first grid's basin; exact
    for unimodal functions up to the flatness of f near its minimum.
    """
    lo, hi = np.array(lo, dtype=float), np.array(hi, dtype=float)
    rows = np.arange(lo.size)
    k = n_first
    while True:
        t = lo[:, None] + (hi - lo)[:, None] * _unit_grid(k)
        values = f(t)
        i = np.argmin(np.where(np.isnan(values), np.inf, values), axis=1)
        if (hi - lo).max() <= tol:
            return t[rows, i]
        lo, hi = t[rows, np.maximum(i - 1, 0)], t[rows, np.minimum(i + 1, k - 1)]
        k = n


@lru_cache(maxsize=8)
def _unit_grid(k: int) -> np.ndarray:
    return np.linspace(0.0, 1.0, k)


def _inner_min_y(x: np.ndarray, mu: float, rho: float, s2: np.ndarray) -> np.ndarray:
    """argmin_y J(x, y) for each x (numerically, over log y in ``_Y_BOUNDS``)."""
    xx, ss = x[:, None], s2[:, None]
    lo = np.full(x.size, math.log(_Y_BOUNDS[0]))
    hi = np.full(x.size, math.log(_Y_BOUNDS[1]))
    log_y = _zoom_argmin(lambda t: _j(xx, np.exp(t), mu, rho, ss), lo, hi, n_first=65)
    return np.exp(log_y)


def numeric_optimum(
    mu: float,
    rho: float,
    sigma: Callable | None = None,
    sigma_bar2: Callable | None = None,
    alpha: float | None = None,
    x_bounds: tuple[float, float] = (1e-3, 1e6),
) -> tuple[float, float]:
    """``(x*, y*) = argmin J(x, y)`` by a purely numeric 2-D minimisation (no closed form).

    Give exactly one variance profile: ``sigma`` (tau -> sigma(tau), averaged over the FIFO
    by :func:`sigma_bar2_from_profile`), ``sigma_bar2`` (x -> sigma_bar^2(x)) or ``alpha``
    (power law ``x^(2 alpha)``). Callables must accept numpy arrays.

    Nested search in log space: the outer minimises ``x -> min_y J(x, y)`` over a dense grid
    of log x in ``x_bounds`` (20 points per decade) refined by k-section; the inner minimises
    ``J(x, .)`` over log y in [1e-8, 1e8] the same way (``J`` is convex in log y). Relative
    accuracy about 1e-7 on smooth problems. A result at a bound of ``x_bounds`` means no
    interior optimum there (e.g. ``alpha >= 1/2`` drives x* to the lower bound).
    """
    _check_mu_rho(mu, rho)
    s2 = _sigma_bar2_callable(sigma, sigma_bar2, alpha)
    x_lo, x_hi = x_bounds
    if not 0 < x_lo < x_hi:
        raise ValueError(f"x_bounds={x_bounds} must satisfy 0 < low < high")

    def j_min(log_x: np.ndarray) -> np.ndarray:
        x = np.exp(log_x).ravel()
        s = s2(x)
        return _j(x, _inner_min_y(x, mu, rho, s), mu, rho, s).reshape(log_x.shape)

    decades = math.log10(x_hi / x_lo)
    n_grid = max(int(math.ceil(decades * _GRID_PER_DECADE)) + 1, _ZOOM_POINTS)
    log_x = _zoom_argmin(j_min, [math.log(x_lo)], [math.log(x_hi)], n_first=n_grid)
    x_star = float(np.exp(log_x[0]))
    x_arr = np.array([x_star])
    y_star = float(_inner_min_y(x_arr, mu, rho, s2(x_arr))[0])
    return x_star, y_star


def closed_form_optimum(mu: float, alpha: float, rho: float) -> tuple[float, float]:
    """The power-law optimum ``(x*, y*)`` in closed form.

    ``d log K / dx = 0`` reads ``2 a x s (1/sqrt(mu) + s) = 1`` with ``s = sqrt(rho + 1/x)``
    and ``a = alpha``, i.e. ``2 a x s / sqrt(mu) = 1 - 2a - 2 a rho x`` (so the root must have
    ``1 - 2a - 2 a rho x >= 0``). Squaring gives

        4 a^2 rho (1/mu - rho) x^2 + 4 a (a/mu + rho (1 - 2a)) x - (1 - 2a)^2 = 0,

    whose admissible root is the paper's

        x* = (-(a/mu + rho (1-2a)) + sqrt(a^2/mu^2 + rho (1-2a)/mu)) / (2 a rho (1/mu - rho)).

    That expression is 0/0 at ``rho = 1/mu`` (the quadratic term vanishes) and at ``rho = 0``.
    Multiplying numerator and denominator by ``b + sqrt(D)`` (``b = a/mu + rho (1-2a)``,
    ``D = a^2/mu^2 + rho (1-2a)/mu``, and ``D - b^2 = rho (1-2a)^2 (1/mu - rho)``) gives the
    identical but everywhere-regular form used here:

        x* = (1 - 2a)^2 / (2a (b + sqrt(D))).

    Its special cases, both continuous limits of the general formula:

    * ``rho = 1/mu`` (singular case): ``sqrt(D) = b = (1-a)/mu``, so ``x*`` is the root of the
      linear equation, ``x* = (1-2a)^2 / (4a (a/mu + rho (1-2a))) = mu (1-2a)^2 / (4a(1-a))``;
      the paper's ``alpha=0.3, rho=1, mu=1`` example is this case (x* = 0.16/0.84 = 0.19).
    * ``rho = 0``: ``K = x^a (1/sqrt(mu) + x^(-1/2))``, whose derivative vanishes at
      ``sqrt(x) = sqrt(mu) (1/2 - a) / a``: ``x* = mu (1-2a)^2 / (4 a^2)`` and
      ``y* = sqrt(mu x*) = mu (1-2a) / (2a)``.

    The reuse ratio is ``y* = sqrt(mu / (rho + 1/x*))``, which for ``a < 1/2`` equals the
    paper's ``y* = (-a + sqrt(a^2 + mu rho (1-2a))) / rho``, computed here in the regular form
    ``y* = mu (1-2a) / (a + sqrt(a^2 + mu rho (1-2a)))`` (limit ``mu (1-2a)/(2a)`` at rho=0).

    ``alpha >= 1/2``: ``x^a sqrt(rho + 1/x) = sqrt(rho x^(2a) + x^(2a-1))`` increases with x,
    so K has no interior minimum; its infimum is the boundary ``x -> 0`` (hence ``y -> 0``):
    returns ``(0.0, 0.0)``, which :func:`on_policy_regime` reads as on-policy.

    Raises ValueError for ``alpha <= 0``, ``mu <= 0`` or ``rho`` outside [0, 1].
    """
    _check_params(mu, alpha, rho)
    a = alpha
    if a >= 0.5:
        return 0.0, 0.0
    b = a / mu + rho * (1 - 2 * a)
    sqrt_d = math.sqrt(a * a / (mu * mu) + rho * (1 - 2 * a) / mu)
    x_star = (1 - 2 * a) ** 2 / (2 * a * (b + sqrt_d))
    y_star = mu * (1 - 2 * a) / (a + math.sqrt(a * a + mu * rho * (1 - 2 * a)))
    return x_star, y_star


def on_policy_regime(mu: float, alpha: float, rho: float) -> bool:
    """True when the optimum asks for no reuse: ``y* <= 1`` (each rollout trained on at most
    once on average; the best practical choice is then the on-policy baseline, R = N = B).
    Includes ``alpha >= 1/2`` (y* -> 0). E.g. ``alpha=0.3, rho=1, mu=1`` (y* = 0.4) is
    on-policy; ``alpha=0.1, rho=0.1, mu=5.28`` (y* = 5.6) is not."""
    return closed_form_optimum(mu, alpha, rho)[1] <= 1


# ---------------------------------------------------------------------------------------------
# Recommendation
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recommendation:
    """What to run for given ``(mu, alpha, rho)`` and batch size (see :func:`recommend`)."""

    mu: float
    alpha: float
    rho: float
    batch_size: int  # B
    group_size: int  # G
    gpus: int
    x: float  # continuous optimum x* = N / R
    y: float  # continuous optimum y* = B / R
    on_policy: bool  # y* <= 1: no reuse
    interior: bool  # False when alpha >= 1/2 (no interior optimum, x*, y* -> 0)
    rollouts_per_step: int  # R
    capacity: int  # N
    reuse: float  # B / R after rounding
    horizon: float  # N / R after rounding
    j_rel: float  # J(horizon, reuse) / J(1, 1) under the power law
    workers: int  # W of the async split
    trainers: int  # T of the async split
    async_reuse: float  # mu T / W
    gamma: float  # (1 + W/T) / (1 + mu)
    async_rollouts_per_step: float  # B W / (mu T), mean arrivals per async step
    async_capacity: int  # N for the async run

    def sync_overrides(self) -> str:
        """Hydra overrides of the synchronous run."""
        common = (
            f"schedule.batch_size={self.batch_size} algo.group_size={self.group_size} "
            f"compute.mu={self.mu:g}"
        )
        if self.on_policy:
            return f"experiment=on_policy {common}"
        return (
            f"buffer=fifo buffer.capacity={self.capacity} "
            f"schedule.rollouts_per_step={self.rollouts_per_step} {common}"
        )

    def async_overrides(self) -> str:
        """Hydra overrides of the async-cluster run."""
        return (
            f"schedule=async schedule.gpus={self.gpus} schedule.workers={self.workers} "
            f"schedule.trainers={self.trainers} buffer=fifo buffer.capacity={self.async_capacity} "
            f"schedule.batch_size={self.batch_size} algo.group_size={self.group_size} "
            f"compute.mu={self.mu:g}"
        )

    def describe(self) -> str:
        """A few readable lines, with the Hydra overrides to use."""
        if not self.interior:
            regime = "on-policy (alpha >= 1/2: no interior optimum, x*, y* -> 0)"
        elif self.on_policy:
            regime = "on-policy (y* <= 1: no reuse)"
        else:
            regime = "replay (y* > 1)"
        groups = self.rollouts_per_step // self.group_size
        lines = [
            f"theory (mu={self.mu:g}, alpha={self.alpha:g}, rho={self.rho:g}): "
            f"x* = N/R = {self.x:.4g}, y* = B/R = {self.y:.4g} -> {regime}",
            f"sync: B = {self.batch_size}, R = {self.rollouts_per_step} "
            f"({groups} group{'s' if groups != 1 else ''} of {self.group_size}), "
            f"N = {self.capacity}: reuse y = {self.reuse:.4g}, horizon x = {self.horizon:.4g}, "
            f"J / J_on-policy = {self.j_rel:.4g}",
            f"  python -m replay_exp.train {self.sync_overrides()}",
            f"async ({self.gpus} GPUs): W = {self.workers} workers, T = {self.trainers} "
            f"trainers: reuse mu T/W = {self.async_reuse:.4g}, "
            f"gamma = (1 + W/T)/(1 + mu) = {self.gamma:.4g}, N = {self.async_capacity}",
            f"  python -m replay_exp.train {self.async_overrides()}",
        ]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


def _nearest_log(candidates: Sequence[float], target: float) -> int:
    """Index of the candidate closest to ``target`` in log space (first one on a tie)."""
    d = [abs(math.log(c / target)) for c in candidates]
    return min(range(len(d)), key=d.__getitem__)


def recommend(
    mu: float,
    alpha: float,
    rho: float,
    batch_size: int,
    group_size: int = 16,
    gpus: int = 8,
) -> Recommendation:
    """Turn the continuous optimum into runnable sizes.

    Rounding rules (B = batch_size, G = group_size; B must be a multiple of G, as the
    on-policy baseline R = B must be whole groups):

    * On-policy (``y* <= 1``): R = N = B, i.e. ``experiment=on_policy`` (reuse 1, horizon 1).
    * Otherwise R is the multiple of G in [G, B] closest to ``B / y*`` in log space (first, i.e.
      smaller R, on an exact tie). At fixed x, J is symmetric in log y around log y*
      (``(1 + y/mu)(1/y + c) = 1/mu + c + 2 sqrt(c/mu) cosh(log y - log y*)``), so this is the
      feasible R with the lowest J. Then ``N = max(B, round(x* R))``: the horizon x* in steps
      of R, but at least one batch so a batch never holds duplicates.
    * ``j_rel = J(N/R, B/R) / J(1, 1)`` under the power law (1 = the on-policy baseline).
    * Async split: W + T = gpus with 1 <= T <= gpus - 1, choosing the T whose first-order reuse
      ``mu T / W`` is closest in log space to y* (to 1 when on-policy: no reuse). Its mean
      arrivals per step are ``R_a = B W / (mu T)``; its capacity is
      ``max(B, G ceil(R_a / G), round(x* R_a))`` (just ``max(B, G ceil(R_a / G))`` when
      on-policy), enough for a batch and for the most rollouts one step can bring.
    """
    _check_params(mu, alpha, rho)
    B, G = batch_size, group_size
    if not (isinstance(G, int) and G >= 1):
        raise ValueError(f"group_size={G} must be a positive integer")
    if not (isinstance(B, int) and B >= G and B % G == 0):
        raise ValueError(f"batch_size={B} must be a positive multiple of group_size={G}")
    if not (isinstance(gpus, int) and gpus >= 2):
        raise ValueError(f"gpus={gpus} must be an integer >= 2 (at least one worker, one trainer)")
    x_star, y_star = closed_form_optimum(mu, alpha, rho)
    on_policy = y_star <= 1
    if on_policy:
        R, N = B, B
    else:
        choices = list(range(G, B + 1, G))
        R = choices[_nearest_log(choices, B / y_star)]
        N = max(B, round(x_star * R))
    reuse, horizon = B / R, N / R
    j_rel = float(
        objective(horizon, reuse, mu, rho, alpha=alpha) / objective(1, 1, mu, rho, alpha=alpha)
    )

    splits = [(workers_of(gpus, t), t) for t in range(1, gpus)]
    target = 1.0 if on_policy else y_star
    W, T = splits[_nearest_log([first_order_reuse(w, t, mu) for w, t in splits], target)]
    r_async = async_rollouts_per_step(B, W, T, mu)
    n_async = max(B, G * math.ceil(r_async / G - 1e-9))
    if not on_policy:
        n_async = max(n_async, round(x_star * r_async))
    return Recommendation(
        mu=float(mu),
        alpha=float(alpha),
        rho=float(rho),
        batch_size=B,
        group_size=G,
        gpus=gpus,
        x=x_star,
        y=y_star,
        on_policy=on_policy,
        interior=alpha < 0.5,
        rollouts_per_step=R,
        capacity=N,
        reuse=reuse,
        horizon=horizon,
        j_rel=j_rel,
        workers=W,
        trainers=T,
        async_reuse=first_order_reuse(W, T, mu),
        gamma=async_gamma(W, T, mu),
        async_rollouts_per_step=r_async,
        async_capacity=n_async,
    )


# ---------------------------------------------------------------------------------------------
# Estimating mu
# ---------------------------------------------------------------------------------------------


def estimate_mu(samples_trained: float, rollouts: float, workers: int, trainers: int) -> float:
    """The paper's estimate from a finished async run: ``mu = (K_train / T) / (K_inf / W)``.

    ``K_train`` = samples trained on (repeats included), ``K_inf`` = unique rollouts generated.
    Each trainer consumes ``K_train / T`` while each worker produces ``K_inf / W`` in the same
    wall time, so their ratio is the relative cost of generating a rollout.
    """
    for name, v in (
        ("samples_trained", samples_trained),
        ("rollouts", rollouts),
        ("workers", workers),
        ("trainers", trainers),
    ):
        if not (isinstance(v, numbers.Real) and v > 0):
            raise ValueError(f"{name}={v} must be > 0")
    return (samples_trained / trainers) / (rollouts / workers)


def estimate_mu_from_run(run_dir: str | Path) -> dict[str, Any]:
    """Estimate mu from a run directory's ``config.yaml`` and ``metrics.jsonl``.

    Reads the schedule (``schedule.name``, ``workers``, ``trainers``, ``gpus``; ``workers:
    null`` means ``gpus - trainers``) and the last metrics row carrying
    ``compute/samples_trained`` and ``compute/rollouts`` (a truncated last line is skipped).
    Returns ``{"mu_paper", "mu_timed", "mu_config", "samples_trained", "rollouts", "workers",
    "trainers"}``: ``mu_paper`` is :func:`estimate_mu` (None under ``schedule.name: sync``,
    which has no W/T; workers and trainers are then None too), ``mu_timed`` the run's
    timing-based ``compute/measured_mu`` (None if absent), ``mu_config`` its ``compute.mu``.
    """
    import yaml

    from replay_exp.runlog import jsonl_file, read_metrics

    run_dir = Path(run_dir)
    config_path, metrics_path = run_dir / "config.yaml", run_dir / "metrics.jsonl"
    if not config_path.is_file():
        raise ValueError(f"{config_path} not found: not a finished run directory")
    if jsonl_file(metrics_path) is None:  # an archived run's metrics.jsonl.xz stands for it
        raise ValueError(f"{metrics_path} not found: not a finished run directory")
    cfg = yaml.safe_load(config_path.read_text()) or {}
    sched = cfg.get("schedule") or {}
    rows = [
        r
        for r in read_metrics(metrics_path)
        if r.get("compute/samples_trained") is not None and r.get("compute/rollouts") is not None
    ]
    if not rows:
        raise ValueError(f"{metrics_path} has no row with compute/samples_trained and rollouts")
    last = rows[-1]
    trained, rollouts = last["compute/samples_trained"], last["compute/rollouts"]
    workers = trainers = mu_paper = None
    if sched.get("name", "sync") != "sync":
        trainers = sched.get("trainers")
        workers = sched.get("workers")
        if workers is None:
            if sched.get("gpus") is None or trainers is None:
                raise ValueError(f"{config_path}: schedule.workers and schedule.gpus are both null")
            workers = workers_of(sched["gpus"], trainers)
        mu_paper = estimate_mu(trained, rollouts, workers, trainers)
    mu_timed = last.get("compute/measured_mu")
    return {
        "mu_paper": mu_paper,
        "mu_timed": float(mu_timed) if mu_timed is not None else None,
        "mu_config": (cfg.get("compute") or {}).get("mu"),
        "samples_trained": trained,
        "rollouts": rollouts,
        "workers": workers,
        "trainers": trainers,
    }
