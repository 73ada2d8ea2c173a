"""Is a configuration really better than the on-policy baseline? Paired intervals over seeds and
problems.

Every run writes the per-problem results of each evaluation (``eval_details.jsonl``; the same
held-out problems for every run of a task). Against the baseline, at matched x (compute, steps
or rollouts), this module estimates four differences and their 95 % intervals:

- **final**: mean accuracy of the configuration minus the baseline's at the last x both reached;
- **peak**: the peak of the configuration's seed-mean curve minus the baseline's (peaks are
  re-taken in every bootstrap replicate, so the interval includes the selection of the peak);
- **saving**: ``1 - x_config / x_baseline`` where each x is the compute the seed-mean curve needs
  to reach ``frac`` x the baseline's peak (``replay_exp.analysis.curves.compute_to_target``;
  a configuration that never gets there saves ``-inf``);
- **saving_final**: the user's number, ``1 - x_config / x_matched`` where ``x_config`` is the
  compute the configuration's seed-mean curve needs to reach the baseline's seed-mean
  **final** accuracy and ``x_matched`` the compute the baseline spent to get it (the last
  matched x): how much of the baseline's budget reaching its final accuracy saves. ``-inf``
  (the report: "not reached") when the curve never gets there. It differs from ``saving``,
  which asks for ``frac`` of the baseline's peak and divides by the baseline's own x to reach
  it;
- **stability**: the baseline's mean drawdown minus the configuration's, where a run's drawdown
  is the largest drop of its curve below its own running peak
  (``replay_exp.analysis.curves.drawdown``), averaged over seeds: positive = the configuration
  loses less of what it gained ("slow but stable"). Evaluation noise alone gives a flat curve
  a drawdown of a few SE, on both arms alike.

How (``compare``):

1. Each run's per-problem correctness ``P[k, j]`` (eval k, problem j; pass@1: the greedy sample
   correct; ``pass@k_sampled``: the unbiased per-problem estimate; ``sample_reward``: c / n) is
   interpolated linearly in x (``replay_exp.analysis.curves.interpolate``) onto the baseline's
   evaluation points from the first to the last x every run reached (on a shared compute
   grid, ``eval.unit=compute``, the points coincide and nothing is interpolated in effect). A
   run that stopped within 0.1 % short of a point (a compute budget ends on a whole step) has
   its last evaluation stand for that point.
2. Seed-mean curves ``m[k] = mean_s mean_j P_s[k, j]``. The **point estimate** of every
   statistic is the statistic of these curves (all weights 1): the centre of the bootstrap
   below, and the same statistic of the same seed-mean curve that
   ``replay_exp.analysis.curves.target_table`` gives per configuration (on a shared evaluation
   grid the two agree; tests/analysis/test_report.py checks it).
3. Bootstrap (``n_boot`` replicates, seeded): problems are resampled with replacement, the same
   draw for both arms (paired on the same eval problems); seeds are resampled with replacement,
   the same draw for both arms when they ran the same seeds (paired per seed), independently
   otherwise. Each statistic is recomputed per replicate.
4. The interval (``method``):

   - ``t`` (the default): ``point +- t_{df} * SE``. SE^2 sums one variance per source, each
     from its own bootstrap with the other sources held fixed: the seeds (paired: one
     component; unpaired: one per arm), scaled by S / (S - 1) because a bootstrap over S units
     has (S - 1) / S of the unbiased variance (for a mean, exactly s^2 / S), and the problems.
     df by Welch-Satterthwaite, so with 5 seeds t is near t_4 = 2.776 when seeds dominate, as
     they do here. It is the per-seed t-interval for a mean, with the problem bootstrap inside;
     for peak, saving and stability it is the same rule on the bootstrap's SE. A side on which
     more than 2.5 % of the joint replicates never reach the target is a saving of ``-inf``.
     An arm with one seed gets (-inf, inf): its spread cannot be estimated.
   - ``percentile``: the 2.5th and 97.5th percentiles of the joint replicates (order
     statistics). It under-covers with few seeds: on synthetic curves with our seed spread,
     ``replay_exp.analysis.studies.coverage`` measures both (docs/analysis.md).

   Under ``t`` each statistic also gets its **minimal detectable effect**, the true difference
   a two-sided test at 5 % would detect with 80 % power at these seeds:
   (t_{df, 0.975} + t_{df, 0.8}) * SE (3.72 SE at df = 4).
5. Verdict: ``better`` if the whole interval is above 0, ``worse`` if below, else ``not
   separable``. A "not separable" with an MDE of 3 points says "no effect larger than about 3
   points", not "no effect".
6. Equivalence (``equivalence``, with a margin m stated before the data, e.g. the report's
   ``--margin 0.02``): ``equivalent`` when the whole interval lies inside [-m, m];
   ``non-inferior`` when it lies above -m but reaches past +m (no worse than the baseline by
   more than m, possibly better by more); else ``not shown``. A "not separable" verdict alone
   is not equivalence.

Runs without ``eval_details.jsonl`` (older runs, W&B) fall back to their logged metric: seeds
are resampled, problems cannot be (``problems_resampled`` = False), so intervals are narrower
than they should be; the report says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from replay_exp.analysis.curves import (
    compute_to_target_columns,
    drawdown,
    interpolate,
    x_column,
)
from replay_exp.eval.estimators import decode_details, pass_at_k_per_problem
from replay_exp.runlog import jsonl_file, read_metrics

STATS = ("final", "peak", "saving", "saving_final", "stability")
END_TOL = 1e-3  # relative: how far short of a grid point a run's last evaluation may be
VERDICTS = ("better", "worse", "not separable")
# Interval methods of compare(): "t" (the default, chosen by
# replay_exp.analysis.studies.coverage) and
# the percentile bootstrap it replaced (kept to re-read old reports).
INTERVALS = ("t", "percentile")


@dataclass
class Arm:
    """One configuration's runs on a common x grid: ``values[s, k, j]`` = seed s, grid point k,
    problem j (j has length 1 without per-problem data)."""

    label: str
    seeds: list
    values: np.ndarray  # [S, K, J]
    per_problem: bool


def per_problem_values(row: dict, metric: str) -> np.ndarray | None:
    """Per-problem values of ``metric`` from one ``eval_details.jsonl`` row (None: the metric
    has no per-problem form)."""
    name = metric.removeprefix("eval/")
    details = decode_details(row)
    if name == "pass@1":
        return details["pass1"].astype(float)
    counts, n = details["n_correct"], int(row.get("n_samples", 0))
    if name == "sample_reward" and n:
        return counts / n
    if name.startswith("pass@") and name.endswith("_sampled") and n:
        k = int(name[len("pass@") : -len("_sampled")])
        return pass_at_k_per_problem(n, counts, k)
    return None


def read_details(run_dir: str | Path) -> list[dict]:
    """The rows of a run's ``eval_details.jsonl`` ([] if it has none), read like
    metrics.jsonl (``replay_exp.runlog.read_metrics``: a truncated line is skipped with a
    warning)."""
    path = Path(run_dir) / "eval_details.jsonl"  # or its .gz copy: an archived run
    return read_metrics(path) if jsonl_file(path) is not None else []


def run_matrix(
    steps: pd.DataFrame, run_dir: str | Path | None, metric: str, x: str
) -> tuple[np.ndarray, np.ndarray, bool]:
    """(x of each evaluation [K], values [K, J], per-problem?) of one run: its
    ``eval_details.jsonl`` joined to its metrics rows by step (for the x column), else the
    logged ``metric`` as a single column."""
    col = x_column(x)
    evals = steps.dropna(subset=[metric]).drop_duplicates("step", keep="last")
    x_of_step = dict(zip(evals["step"], evals[col], strict=True))
    rows = read_details(run_dir) if run_dir is not None else []
    per_step = {}
    for r in rows:
        v = per_problem_values(r, metric)
        if v is None or r["step"] not in x_of_step:
            per_step = {}
            break
        per_step[r["step"]] = v
    if per_step and len({len(v) for v in per_step.values()}) == 1:
        order = sorted(per_step, key=lambda s: x_of_step[s])
        xs = np.array([x_of_step[s] for s in order], dtype=float)
        return xs, np.stack([per_step[s] for s in order]), True
    return evals[col].to_numpy(float), evals[metric].to_numpy(float)[:, None], False


def build_arms(
    runs, labels: list[str], baseline: str, metric: str, x: str
) -> tuple[np.ndarray, dict[str, Arm]]:
    """The common grid (the baseline's evaluation x up to the last x every run reached) and
    each label's :class:`Arm` on it."""
    raw: dict[str, list] = {}
    for label in [baseline, *[lab for lab in labels if lab != baseline]]:
        table = runs.runs[runs.runs["label"] == label]
        raw[label] = []
        for _, r in table.iterrows():
            steps = runs.steps[runs.steps["run"] == r["run"]]
            xs, vals, pp = run_matrix(steps, r.get("run_dir"), metric, x)
            if len(xs):
                raw[label].append((r["seed"], xs, vals, pp))
    ends = [xs[-1] for parts in raw.values() for _, xs, _, _ in parts]
    if not ends or not raw[baseline]:
        raise ValueError(f"no evaluations of {metric} to compare")
    starts = [xs[0] for parts in raw.values() for _, xs, _, _ in parts]
    base_x = raw[baseline][0][1]
    # A run under a compute budget ends on a whole step, up to one step short of the budget
    # (999.5 of 1000 units at y = 4): within END_TOL it counts as there, its last evaluation
    # standing for the budget (never further: no extrapolation beyond that sliver). Nor
    # before a run's first evaluation: the grid starts where every run has one.
    grid = base_x[(base_x <= min(ends) + END_TOL * max(ends) + 1e-9) & (base_x >= max(starts))]
    if len(grid) == 0:
        raise ValueError(f"no {x} of the baseline's evaluations lies in every run's range")
    widths = {vals.shape[1] for parts in raw.values() for _, _, vals, _ in parts}
    per_problem = all(pp for parts in raw.values() for *_, pp in parts) and len(widths) == 1
    arms = {}
    for label, parts in raw.items():
        mats = []
        for _, xs, vals, _ in parts:
            if not per_problem:  # one column: the run's mean
                vals = vals.mean(axis=1, keepdims=True)
            # Clipped to the run's last x: only the END_TOL sliver is beyond it.
            mats.append(interpolate(xs, vals, np.minimum(grid, xs[-1])))
        arms[label] = Arm(label, [p[0] for p in parts], np.stack(mats), per_problem)
    return grid, arms


def _statistics(
    grid: np.ndarray,
    m_arm: np.ndarray,
    m_base: np.ndarray,
    frac: float,
    dd_arm: np.ndarray,
    dd_base: np.ndarray,
) -> dict[str, np.ndarray]:
    """final / peak differences, the two savings and the stability, for curves [K, R] (R
    replicates) and mean drawdowns [R]."""
    target = frac * m_base.max(axis=0)
    x_arm = compute_to_target_columns(grid, m_arm, target)
    x_base = compute_to_target_columns(grid, m_base, target)
    with np.errstate(divide="ignore", invalid="ignore"):
        saving = np.where(x_base > 0, 1.0 - x_arm / np.where(x_base > 0, x_base, 1), np.nan)
    # Reaching the baseline's final accuracy, against the budget the baseline spent on it.
    x_final = compute_to_target_columns(grid, m_arm, m_base[-1])
    return {
        "final": m_arm[-1] - m_base[-1],
        "peak": m_arm.max(axis=0) - m_base.max(axis=0),
        "saving": saving,
        "saving_final": 1.0 - x_final / grid[-1] if grid[-1] > 0 else np.full_like(x_final, np.nan),
        "stability": dd_base - dd_arm,
        "x_arm": x_arm,
        "x_base": x_base,
    }


def percentile_interval(values: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile interval by order statistics (NaN replicates dropped; inf kept)."""
    v = np.sort(values[~np.isnan(values)])
    if len(v) == 0:
        return math.nan, math.nan
    lo = v[int(math.floor((1 - level) / 2 * len(v)))]
    hi = v[int(math.ceil((1 + level) / 2 * len(v))) - 1]
    return float(lo), float(hi)


def verdict(lo: float, hi: float) -> str:
    """``better`` if the interval is above 0, ``worse`` if below, else ``not separable``."""
    if math.isnan(lo) or math.isnan(hi):
        return "not separable"
    return "better" if lo > 0 else "worse" if hi < 0 else "not separable"


def equivalence(lo: float, hi: float, margin: float) -> str:
    """``equivalent`` if the whole interval lies inside [-margin, margin]; ``non-inferior`` if
    it lies above -margin but reaches past +margin (at least as good within the margin, maybe
    better beyond it); else ``not shown``. Interval inclusion: with the 95 % interval it is
    stricter than the two-one-sided-tests rule (a 90 % interval), so it errs toward "not
    shown"."""
    if math.isnan(lo) or math.isnan(hi) or lo < -margin:
        return "not shown"
    return "equivalent" if hi <= margin else "non-inferior"


def _per_seed(vals: np.ndarray, prob_w: np.ndarray) -> np.ndarray:
    """Each seed's problem-weighted mean curve [S, K, R or 1] of ``vals`` [S, K, J] for
    problem weights [J, R or 1]."""
    S, K, J = vals.shape
    if prob_w.shape[1] == 1:  # all problems once: a plain mean
        return vals.mean(axis=2, keepdims=True)
    return (vals.reshape(S * K, J) @ prob_w).reshape(S, K, -1) / prob_w.sum(0)


def _curves(per_seed: np.ndarray, seed_w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Seed-mean curves [K, R] and mean drawdowns [R] of per-seed curves [S, K, R or 1] for
    seed weights [S, R or 1] (a single column broadcasts)."""
    mean = (per_seed * seed_w[:, None, :]).sum(0) / seed_w.sum(0)
    # The seed-weighted mean of each seed's drawdown (curves.drawdown along the grid).
    dd = (drawdown(per_seed, axis=1) * seed_w).sum(0) / seed_w.sum(0)
    return mean, dd


def _resample(rng: np.random.Generator, n: int, n_boot: int) -> np.ndarray:
    """Bootstrap weights [n, n_boot]: how often each of n units is drawn, with replacement
    (n draws per replicate; the counts of a multinomial(n, 1/n))."""
    draws = rng.integers(0, n, size=(n_boot, n)) + n * np.arange(n_boot)[:, None]
    return np.bincount(draws.ravel(), minlength=n * n_boot).reshape(n_boot, n).T.astype(float)


def _finite_var(v: np.ndarray) -> float:
    """Variance (ddof 0) of the finite replicates; 0 when fewer than two are finite."""
    f = v[np.isfinite(v)]
    return float(f.var()) if len(f) > 1 else 0.0


def t_interval(
    point: float, components: list[tuple[float, float]], level: float = 0.95,
    power: float = 0.8,
) -> dict[str, float]:  # fmt: skip
    """``point +- t_{df, (1 + level) / 2} * SE`` from independent variance components
    ``(v, df)``: SE^2 = sum of v, df by Welch-Satterthwaite, (sum v)^2 / sum(v^2 / df), so a
    component with few units (seeds) dominates the degrees of freedom when it dominates the
    variance. Also the minimal detectable effect of a two-sided test at 1 - level with this
    ``power``: (t_{df, (1 + level) / 2} + t_{df, power}) * SE. With one component of
    df = 4 (5 seeds): t = 2.776, and the MDE is (2.776 + 0.941) SE = 3.72 SE. A component
    with df < 1 (an arm with one seed) makes the interval (-inf, inf): seed-to-seed spread,
    the largest source of variance here, cannot be estimated from one seed."""
    if any(d < 1 for _, d in components):  # one seed: its variance is not estimable
        return {"se": math.nan, "df": 0.0, "lo": -math.inf, "hi": math.inf, "mde": math.inf}
    var = sum(v for v, _ in components)
    se = math.sqrt(var)
    if var <= 0:
        return {"se": 0.0, "df": math.inf, "lo": point, "hi": point, "mde": 0.0}
    denom = sum(v * v / d for v, d in components if v > 0)
    df = var * var / denom if denom > 0 else math.inf
    t = float(student_t.ppf((1 + level) / 2, df))
    return {
        "se": se, "df": df, "lo": point - t * se, "hi": point + t * se,
        "mde": (t + float(student_t.ppf(power, df))) * se,
    }  # fmt: skip


def compare(
    grid: np.ndarray,
    arm: Arm,
    base: Arm,
    frac: float = 0.98,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    method: str = "t",
) -> dict:
    """Point estimates, intervals, minimal detectable effects and verdicts of ``arm`` against
    ``base`` (module docstring; ``method`` = ``t`` or ``percentile``). Also the per-seed final
    differences when the seeds pair up."""
    if method not in INTERVALS:
        raise ValueError(f"compare: method must be one of {INTERVALS}, got {method!r}")
    rng = np.random.default_rng(seed)
    S_a, K, J = arm.values.shape
    S_b = base.values.shape[0]
    paired = sorted(arm.seeds) == sorted(base.seeds)
    if paired:  # align the baseline's seeds with the arm's
        order = [base.seeds.index(s) for s in arm.seeds]
        base_vals = base.values[order]
    else:
        base_vals = base.values

    per_seed: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # by id of the problem weights

    def statistics(seed_a, seed_b, prob_w) -> dict[str, np.ndarray]:
        if id(prob_w) not in per_seed:  # the matrix products once per problem draw
            per_seed[id(prob_w)] = (_per_seed(arm.values, prob_w), _per_seed(base_vals, prob_w))
        pa, pb = per_seed[id(prob_w)]
        (m_arm, dd_arm), (m_base, dd_base) = _curves(pa, seed_a), _curves(pb, seed_b)
        # One arm's weights may be a single column (held fixed): broadcast to the replicates.
        R = max(m_arm.shape[1], m_base.shape[1])
        m_arm, m_base = (np.broadcast_to(m, (K, R)) for m in (m_arm, m_base))
        dd_arm, dd_base = (np.broadcast_to(d, (R,)) for d in (dd_arm, dd_base))
        return _statistics(grid, m_arm, m_base, frac, dd_arm, dd_base)

    ones_a, ones_b, ones_p = np.ones((S_a, 1)), np.ones((S_b, 1)), np.ones((J, 1))
    point = statistics(ones_a, ones_b, ones_p)
    prob_w = _resample(rng, J, n_boot) if arm.per_problem else ones_p
    seed_a = _resample(rng, S_a, n_boot)
    seed_b = seed_a if paired else _resample(rng, S_b, n_boot)
    out = {
        "label": arm.label,
        "baseline": base.label,
        "seeds": S_a,
        "baseline_seeds": S_b,
        "paired_seeds": paired,
        "problems": J if arm.per_problem else 0,
        "problems_resampled": arm.per_problem,
        "interval": method,
        "x_matched": float(grid[-1]),
        "x_to_target": float(point["x_arm"][0]),
        "x_to_baseline_final": float((1 - point["saving_final"][0]) * grid[-1]),
        "baseline_x_to_target": float(point["x_base"][0]),
    }
    # Joint replicates (seeds and problems at once): the percentile interval, and under t the
    # share of infinite savings (an arm that never reaches the target in a replicate).
    joint = statistics(seed_a, seed_b, prob_w)
    if method == "t":
        # Each source of variance on its own: seeds (paired: both arms' seeds drawn together;
        # unpaired: each arm's seeds alone), then problems. A bootstrap over n units has
        # variance (n - 1) / n of the unbiased one, so the seed components are scaled by
        # n / (n - 1) (for a mean this is exactly s^2 / n); the problem component's df is J - 1.
        if paired:
            parts = [(statistics(seed_a, seed_a, ones_p), S_a)]
        else:
            parts = [
                (statistics(seed_a, ones_b, ones_p), S_a),
                (statistics(ones_a, seed_b, ones_p), S_b),
            ]
        by_problem = statistics(ones_a, ones_b, prob_w) if arm.per_problem else None
    tail = (1 - level) / 2
    for name in STATS:
        est = float(point[name][0])
        out[name] = est
        if method == "percentile":
            lo, hi = percentile_interval(joint[name], level)
            out[f"{name}_lo"], out[f"{name}_hi"] = lo, hi
            out[f"{name}_verdict"] = verdict(lo, hi)
            continue
        comps = [(_finite_var(b[name]) * n / max(n - 1, 1), n - 1) for b, n in parts]
        if by_problem is not None:
            comps.append((_finite_var(by_problem[name]), J - 1))
        t = t_interval(est, comps, level) if math.isfinite(est) else None
        lo, hi = (t["lo"], t["hi"]) if t else percentile_interval(joint[name], level)
        if t and np.mean(np.isneginf(joint[name])) > tail:  # "never" is inside the interval
            lo = -math.inf
        out[f"{name}_lo"], out[f"{name}_hi"] = lo, hi
        out[f"{name}_se"] = t["se"] if t else math.nan
        out[f"{name}_df"] = t["df"] if t else math.nan
        out[f"{name}_mde"] = t["mde"] if t else math.nan
        out[f"{name}_verdict"] = verdict(lo, hi)
    if paired:
        diffs = arm.values[:, -1].mean(axis=1) - base_vals[:, -1].mean(axis=1)
        out["final_per_seed"] = " ".join(f"{d:+.3f}" for d in diffs)
    return out


def compare_to_baseline(
    runs, baseline: str, x: str = "compute", metric: str = "eval/pass@1", frac: float = 0.98,
    n_boot: int = 2000, seed: int = 0, method: str = "t",
) -> pd.DataFrame:  # fmt: skip
    """One row per configuration (the baseline excluded): :func:`compare` against
    ``baseline``."""
    labels = list(dict.fromkeys(runs.runs["label"]))
    grid, arms = build_arms(runs, labels, baseline, metric, x)
    rows = [
        compare(grid, arms[label], arms[baseline], frac, n_boot, seed, method=method)
        for label in labels
        if label != baseline and len(arms[label].seeds)
    ]
    return pd.DataFrame(rows)
