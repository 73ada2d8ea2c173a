"""Is a configuration really better than the on-policy baseline? Paired bootstrap intervals.

Every run writes the per-problem results of each evaluation (``eval_details.jsonl``; the same
held-out problems for every run of a task). Against the baseline, at matched x (compute, steps
or rollouts), this module estimates four differences and their 95 % intervals:

- **final**: mean accuracy of the configuration minus the baseline's at the last x both reached;
- **peak**: the peak of the configuration's seed-mean curve minus the baseline's (peaks are
  re-taken in every bootstrap replicate, so the interval includes the selection of the peak);
- **saving**: ``1 - x_config / x_baseline`` where each x is the compute the seed-mean curve needs
  to reach ``frac`` x the baseline's peak (``replay_exp.analysis.curves.compute_to_target``;
  a configuration that never gets there saves ``-inf``);
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
   otherwise. Each statistic is recomputed per replicate; the interval is the 2.5th and 97.5th
   percentile (order statistics, so an infinite saving stays infinite).
4. Verdict: ``better`` if the whole interval is above 0, ``worse`` if below, else ``not
   separable``.

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

from replay_exp.analysis.curves import compute_to_target, drawdown, interpolate, x_column
from replay_exp.estimators import decode_details, pass_at_k_per_problem
from replay_exp.logging import read_metrics

STATS = ("final", "peak", "saving", "stability")
END_TOL = 1e-3  # relative: how far short of a grid point a run's last evaluation may be
VERDICTS = ("better", "worse", "not separable")


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
    metrics.jsonl (``replay_exp.logging.read_metrics``: a truncated line is skipped with a
    warning)."""
    path = Path(run_dir) / "eval_details.jsonl"
    return read_metrics(path) if path.is_file() else []


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
    """final / peak differences, the saving and the stability, for curves [K, R] (R
    replicates) and mean drawdowns [R]."""
    target = frac * m_base.max(axis=0)
    x_arm = np.array([compute_to_target(grid, m_arm[:, r], target[r]) for r in range(len(target))])
    x_base = np.array(
        [compute_to_target(grid, m_base[:, r], target[r]) for r in range(len(target))]
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        saving = np.where(x_base > 0, 1.0 - x_arm / np.where(x_base > 0, x_base, 1), np.nan)
    return {
        "final": m_arm[-1] - m_base[-1],
        "peak": m_arm.max(axis=0) - m_base.max(axis=0),
        "saving": saving,
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


def compare(
    grid: np.ndarray,
    arm: Arm,
    base: Arm,
    frac: float = 0.98,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> dict:
    """Point estimates, bootstrap intervals and verdicts of ``arm`` against ``base`` (module
    docstring). Also the per-seed final differences when the seeds pair up."""
    rng = np.random.default_rng(seed)
    S_a, K, J = arm.values.shape
    S_b = base.values.shape[0]
    paired = sorted(arm.seeds) == sorted(base.seeds)
    if paired:  # align the baseline's seeds with the arm's
        order = [base.seeds.index(s) for s in arm.seeds]
        base_vals = base.values[order]
    else:
        base_vals = base.values

    def curves(
        vals: np.ndarray, seed_w: np.ndarray, prob_w: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Seed-mean curves [K, R] and mean drawdowns [R] for seed weights [S, R] and problem
        weights [J, R]."""
        S = vals.shape[0]
        per_seed = (vals.reshape(S * K, J) @ prob_w).reshape(S, K, -1) / prob_w.sum(0)
        mean = np.einsum("skr,sr->kr", per_seed, seed_w) / seed_w.sum(0)
        # The seed-weighted mean of each seed's drawdown (curves.drawdown along the grid).
        dd = (drawdown(per_seed, axis=1) * seed_w).sum(0) / seed_w.sum(0)
        return mean, dd

    def statistics(seed_a, seed_b, prob_w) -> dict[str, np.ndarray]:
        (m_arm, dd_arm), (m_base, dd_base) = (
            curves(arm.values, seed_a, prob_w),
            curves(base_vals, seed_b, prob_w),
        )
        return _statistics(grid, m_arm, m_base, frac, dd_arm, dd_base)

    point = statistics(np.ones((S_a, 1)), np.ones((S_b, 1)), np.ones((J, 1)))
    prob_w = (
        rng.multinomial(J, np.full(J, 1 / J), size=n_boot).T.astype(float)
        if arm.per_problem
        else np.ones((J, n_boot))
    )
    seed_a = rng.multinomial(S_a, np.full(S_a, 1 / S_a), size=n_boot).T.astype(float)
    seed_b = (
        seed_a
        if paired
        else rng.multinomial(S_b, np.full(S_b, 1 / S_b), size=n_boot).T.astype(float)
    )
    boot = statistics(seed_a, seed_b, prob_w)
    out = {
        "label": arm.label,
        "baseline": base.label,
        "seeds": S_a,
        "baseline_seeds": S_b,
        "paired_seeds": paired,
        "problems": J if arm.per_problem else 0,
        "problems_resampled": arm.per_problem,
        "x_matched": float(grid[-1]),
        "x_to_target": float(point["x_arm"][0]),
        "baseline_x_to_target": float(point["x_base"][0]),
    }
    for name in STATS:
        lo, hi = percentile_interval(boot[name], level)
        out[name] = float(point[name][0])
        out[f"{name}_lo"], out[f"{name}_hi"] = lo, hi
        out[f"{name}_verdict"] = verdict(lo, hi)
    if paired:
        diffs = arm.values[:, -1].mean(axis=1) - base_vals[:, -1].mean(axis=1)
        out["final_per_seed"] = " ".join(f"{d:+.3f}" for d in diffs)
    return out


def compare_to_baseline(
    runs, baseline: str, x: str = "compute", metric: str = "eval/pass@1", frac: float = 0.98,
    n_boot: int = 2000, seed: int = 0,
) -> pd.DataFrame:  # fmt: skip
    """One row per configuration (the baseline excluded): :func:`compare` against
    ``baseline``."""
    labels = list(dict.fromkeys(runs.runs["label"]))
    grid, arms = build_arms(runs, labels, baseline, metric, x)
    rows = [
        compare(grid, arms[label], arms[baseline], frac, n_boot, seed)
        for label in labels
        if label != baseline and len(arms[label].seeds)
    ]
    return pd.DataFrame(rows)
