"""Paired bootstrap against the baseline (replay_exp.analysis.stats) on hand-made data whose
answer is known: the point estimates exactly, the intervals against their analytic width, the
verdicts; then the same through ``replay-exp-report`` on hand-made run directories."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml

from replay_exp.analysis.stats import Arm, compare, equivalence, percentile_interval, verdict
from replay_exp.eval.estimators import (
    decode_details,
    encode_details,
    pass_at_k,
    pass_at_k_per_problem,
)

J = 400  # held-out problems
GRID = np.array([0.0, 5.0, 10.0])


def _arm(label, rates, seeds=(0, 1, 2, 3, 4), shift=None):
    """``values[s, k, j]``: problem j solved at grid point k iff j < rates[k] * J (every seed
    the same unless ``shift[s]`` moves seed s's threshold by that many problems)."""
    vals = np.zeros((len(seeds), len(GRID), J))
    for s in range(len(seeds)):
        for k, rate in enumerate(rates):
            vals[s, k, : int(rate * J) + (0 if shift is None else shift[s])] = 1.0
    return Arm(label, list(seeds), vals, per_problem=True)


def test_identical_arms_are_not_separable_with_a_zero_width_interval():
    """Paired on seeds and problems, every replicate's difference is exactly 0."""
    base = _arm("base", [0.2, 0.4, 0.5])
    out = compare(GRID, _arm("same", [0.2, 0.4, 0.5]), base, n_boot=500)
    for name in ("final", "peak"):
        assert out[name] == 0 and out[f"{name}_lo"] == 0 and out[f"{name}_hi"] == 0
        assert out[f"{name}_verdict"] == "not separable"
    assert out["saving"] == 0 and out["paired_seeds"] and out["problems_resampled"]
    assert out["final_per_seed"] == "+0.000 +0.000 +0.000 +0.000 +0.000"


def test_a_clear_gain_is_better_with_the_binomial_width():
    """The arm solves every problem the baseline solves plus 20 % more: the per-problem paired
    difference is 1 on 0.2 J problems, 0 elsewhere, so the difference is 0.2 with standard
    error sqrt(0.2 * 0.8 / J) = 0.02 (seeds are identical): a 95 % interval of about
    0.2 +- 0.039."""
    base = _arm("base", [0.2, 0.4, 0.5])
    out = compare(GRID, _arm("better", [0.3, 0.6, 0.7]), base, n_boot=4000)
    assert out["final"] == pytest.approx(0.2)
    assert out["peak"] == pytest.approx(0.2)
    assert 0.155 < out["final_lo"] < 0.170 and 0.230 < out["final_hi"] < 0.245
    assert out["final_verdict"] == "better" and out["peak_verdict"] == "better"
    # Saving: target 0.98 * 0.5 = 0.49. Baseline: 0.4 at 5, 0.5 at 10 -> 5 + 0.9 * 5 = 9.5.
    # Arm: 0.3 at 0, 0.6 at 5 -> 0.19 / 0.3 * 5 = 3.1667. Saving 1 - 3.1667 / 9.5 = 0.6667.
    assert out["x_to_target"] == pytest.approx(19 / 6)
    assert out["baseline_x_to_target"] == pytest.approx(9.5)
    assert out["saving"] == pytest.approx(1 - (19 / 6) / 9.5)
    assert out["saving_verdict"] == "better"


def test_a_collapse_is_less_stable_and_noise_alone_is_not_separable():
    """The arm climbs to 0.6 and falls back to 0.45 (drawdown 0.15 on every seed); the
    baseline climbs monotonically (drawdown 0): stability = 0 - 0.15."""
    base = _arm("base", [0.2, 0.4, 0.5])
    out = compare(GRID, _arm("collapse", [0.2, 0.6, 0.45]), base, n_boot=2000)
    assert out["stability"] == pytest.approx(-0.15)
    assert out["stability_verdict"] == "worse" and out["stability_hi"] < -0.1
    # one seed of five ends 0.05 below its peak of 0.4 in a copy of the baseline: mean
    # drawdown 0.01, and a seed resample can miss that seed, so the interval reaches 0
    shifted = _arm("dip", [0.2, 0.4, 0.5])
    shifted.values[2, 2, int(0.35 * J) :] = 0.0
    out = compare(GRID, shifted, base, n_boot=2000, method="percentile")
    assert out["stability"] == pytest.approx(-0.01)
    assert out["stability_hi"] == 0 and out["stability_verdict"] == "not separable"
    # t: per-seed stabilities (0, 0, -0.05, 0, 0): mean -0.01, sd sqrt((4 * 0.01^2 + 0.04^2)
    # / 4) = 0.02236, seed SE 0.01; the dip's problems (20 of 400 in seed 2) add a problem
    # SE of sqrt(0.05 * 0.95 / 400) / 5 = 0.0022: SE 0.01024, Welch df 4 * (1.048e-4 /
    # 1e-4)^2 = 4.4, t 2.72 -> -0.01 +- 0.0279 (bootstrap variance estimates: +- ~5 %)
    out = compare(GRID, shifted, base, n_boot=2000)
    assert out["stability_se"] == pytest.approx(0.01024, rel=0.06)
    assert out["stability_df"] == pytest.approx(4.4, rel=0.06)
    assert out["stability_hi"] == pytest.approx(0.0179, abs=0.002)
    assert out["stability_verdict"] == "not separable"


def test_the_bootstrap_drawdown_is_curves_drawdown_along_the_grid():
    """compare() takes each seed's drawdown with replay_exp.analysis.curves.drawdown along the
    grid axis of [S, K, R] curves, then the seed-weighted mean."""
    from replay_exp.analysis.curves import drawdown

    per_seed = np.array([[0.1, 0.5, 0.3, 0.4], [0.2, 0.3, 0.4, 0.1]])[:, :, None]  # [S, K, 1]
    # seed 0: peak 0.5 then 0.3 -> 0.2; seed 1: peak 0.4 then 0.1 -> 0.3
    dd = drawdown(per_seed, axis=1)
    assert dd.shape == (2, 1) and dd[:, 0] == pytest.approx([0.2, 0.3])
    # mean 0.25; seed weights 3 : 1 -> (3 * 0.2 + 0.3) / 4 = 0.225
    w = np.array([[3.0], [1.0]])
    assert ((dd * w).sum(0) / w.sum(0))[0] == pytest.approx(0.225)
    # the same numbers through compare(): arm seeds with those curves, a flat baseline
    vals = np.repeat(per_seed, 1, axis=2)  # [S, K, J = 1]
    arm = Arm("arm", [0, 1], vals, per_problem=False)
    base = Arm("base", [0, 1], np.full_like(vals, 0.1), per_problem=False)
    out = compare(np.arange(4.0), arm, base, n_boot=50)
    assert out["stability"] == pytest.approx(0.0 - 0.25)


def test_unbiased_pass_at_k_by_hand():
    # n = 4 samples, c = 1 correct: pass@1 = 1 / 4; pass@2 = 1 - C(3, 2) / C(4, 2) = 1 - 3 / 6.
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # c = 0 -> 0; n - c < k (4 - 3 < 2) -> 1; per problem: the same, element-wise
    assert pass_at_k_per_problem(4, [0, 1, 3], 2).tolist() == pytest.approx([0.0, 0.5, 1.0])
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_a_clear_loss_is_worse_and_never_reaching_the_target_saves_minus_inf():
    base = _arm("base", [0.2, 0.4, 0.5])
    out = compare(GRID, _arm("worse", [0.1, 0.2, 0.3]), base, n_boot=500)
    assert out["final"] == pytest.approx(-0.2) and out["final_verdict"] == "worse"
    assert out["saving"] == -math.inf and out["saving_hi"] == -math.inf
    assert out["saving_verdict"] == "worse"


def test_saving_to_the_baselines_final_by_hand():
    """The baseline ends at 0.5 at x = 10 (GRID 0, 5, 10). An arm at (0.3, 0.6, 0.7) passes
    0.5 between x = 0 (0.3) and 5 (0.6): at 0 + (0.5 - 0.3) / (0.6 - 0.3) * 5 = 3.333, so it
    saves 1 - 3.333 / 10 = 66.7 % of the baseline's budget. (Its 98 %-of-peak saving asks for
    0.49, which the arm reaches at 0.19 / 0.3 * 5 = 3.167 and the baseline at 5 + 0.09 / 0.1 * 5
    = 9.5: 1 - 3.167 / 9.5 = 66.7 % too, by another route.) An arm at (0.2, 0.4, 0.45) never
    gets there: -inf, "not reached"."""
    base = _arm("base", [0.2, 0.4, 0.5])
    out = compare(GRID, _arm("better", [0.3, 0.6, 0.7]), base, n_boot=500)
    assert out["saving_final"] == pytest.approx(1 - (0.2 / 0.3 * 5) / 10)
    assert out["x_to_baseline_final"] == pytest.approx(0.2 / 0.3 * 5)
    assert out["saving"] == pytest.approx(1 - (0.19 / 0.3 * 5) / 9.5)
    assert out["saving_final_lo"] <= out["saving_final"] <= out["saving_final_hi"]
    out = compare(GRID, _arm("short", [0.2, 0.4, 0.45]), base, n_boot=500)
    assert out["saving_final"] == -math.inf and out["saving_final_hi"] == -math.inf


def test_seed_noise_makes_a_small_gain_not_separable():
    """A +2.5-point gain on average, but seeds scattered by +-40 problems (10 points): with 5
    paired seeds the interval straddles 0."""
    shift = [40, -40, 20, -20, 10]
    base = _arm("base", [0.2, 0.4, 0.5], shift=[0] * 5)
    arm = _arm("noisy", [0.2, 0.4, 0.5], shift=[s + 10 for s in shift])
    out = compare(GRID, arm, base, n_boot=2000)
    assert out["final"] == pytest.approx(np.mean([s + 10 for s in shift]) / J)
    assert out["final_lo"] < 0 < out["final_hi"]
    assert out["final_verdict"] == "not separable"
    assert out["final_per_seed"].split() == [f"{(s + 10) / J:+.3f}" for s in shift]


def test_unpaired_seeds_resample_independently():
    base = _arm("base", [0.2, 0.4, 0.5], seeds=(0, 1, 2, 3, 4))
    arm = _arm("other seeds", [0.2, 0.4, 0.5], seeds=(5, 6, 7, 8, 9))
    out = compare(GRID, arm, base, n_boot=200)
    assert not out["paired_seeds"] and "final_per_seed" not in out


def _seed_means(label, finals, seeds=None):
    """An arm without per-problem data whose seed s has the curve (0.2, 0.4, finals[s])."""
    vals = np.array([[[0.2], [0.4], [f]] for f in finals])
    return Arm(label, list(seeds or range(len(finals))), vals, per_problem=False)


def test_t_interval_of_paired_seed_differences_is_the_textbook_one():
    """Per-seed final differences d = (0.125, -0.075, 0.075, -0.025, 0.05): mean 0.03,
    squared deviations 0.009025 + 0.011025 + 0.002025 + 0.003025 + 0.0004 = 0.0255, s^2 =
    0.006375, SE = sqrt(0.006375 / 5) = 0.035707, t_4 = 2.776445: 0.03 +- 0.099138 =
    [-0.0691, 0.1291]; MDE (2.776445 + 0.940965) * 0.035707 = 0.13274. The percentile
    bootstrap of the same seeds is narrower: its SE is sqrt(4 / 5) of that, its quantile 1.96."""
    d = [0.125, -0.075, 0.075, -0.025, 0.05]
    base = _seed_means("base", [0.5] * 5)
    arm = _seed_means("arm", [0.5 + x for x in d])
    out = compare(GRID, arm, base, n_boot=8000)
    assert out["final"] == pytest.approx(0.03)
    assert out["final_df"] == 4  # one component: the seeds
    assert out["final_se"] == pytest.approx(0.035707, rel=0.03)
    assert out["final_lo"] == pytest.approx(-0.0691, abs=0.004)
    assert out["final_hi"] == pytest.approx(0.1291, abs=0.004)
    assert out["final_mde"] == pytest.approx(0.13274, rel=0.03)
    pct = compare(GRID, arm, base, n_boot=8000, method="percentile")
    assert pct["final_hi"] - pct["final_lo"] < 0.8 * (out["final_hi"] - out["final_lo"])
    with pytest.raises(ValueError, match="method must be one of"):
        compare(GRID, arm, base, method="normal")


def test_t_interval_unpaired_seeds_welch():
    """Arm finals (0.50, 0.52, 0.54) and baseline finals (0.40, 0.44) on other seeds: means
    0.52 and 0.42, s^2 = 0.0004 and 0.0008, variances of the means 0.0004 / 3 = 1.333e-4 and
    0.0008 / 2 = 4e-4: SE = sqrt(5.333e-4) = 0.023094, Welch df = (5.333e-4)^2 / ((1.333e-4)^2
    / 2 + (4e-4)^2 / 1) = 1.680, t_{1.68, 0.975} = 5.19 (scipy; between t_1 = 12.7 and
    t_2 = 4.30): 0.1 +- 0.120."""
    arm = _seed_means("arm", [0.50, 0.52, 0.54], seeds=[0, 1, 2])
    base = _seed_means("base", [0.40, 0.44], seeds=[5, 6])
    out = compare(GRID, arm, base, n_boot=8000)
    assert out["final"] == pytest.approx(0.1)
    assert out["final_se"] == pytest.approx(0.023094, rel=0.03)
    assert out["final_df"] == pytest.approx(1.680, rel=0.06)
    assert out["final_hi"] - out["final"] == pytest.approx(0.120, rel=0.06)
    # one seed per arm: no estimate of the spread, no verdict
    one = compare(GRID, _seed_means("a", [0.9]), _seed_means("b", [0.1]), n_boot=100)
    assert (one["final_lo"], one["final_hi"]) == (-math.inf, math.inf)
    assert one["final_verdict"] == "not separable"


def test_t_interval_components_and_quantiles_by_hand():
    from scipy.stats import t as student_t

    from replay_exp.analysis.stats import t_interval

    def t_quantile(p, df):
        return float(student_t.ppf(p, df))

    # Table values of Student's t (two-sided 95 %, one-sided 80 %), as scipy gives them for
    # the calls stats.py makes (df may be fractional or inf: the normal).
    assert t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-4)
    assert t_quantile(0.975, 4) == pytest.approx(2.7764, abs=1e-4)
    assert t_quantile(0.975, 30) == pytest.approx(2.0423, abs=1e-4)
    assert t_quantile(0.8, 4) == pytest.approx(0.9410, abs=1e-4)
    assert t_quantile(0.975, math.inf) == pytest.approx(1.95996, abs=1e-5)
    assert t_quantile(0.025, 4) == pytest.approx(-2.7764, abs=1e-4)
    # t with 1 df is Cauchy: F(1) = 1/2 + atan(1) / pi = 0.75
    assert student_t.cdf(1.0, 1) == pytest.approx(0.75, abs=1e-12)
    # one component (v = 1e-4, df 4): SE 0.01, +- 0.027764, MDE 3.7174 * 0.01
    one = t_interval(0.0, [(1e-4, 4)])
    assert one["df"] == pytest.approx(4) and one["hi"] == pytest.approx(0.027764, abs=1e-6)
    assert one["mde"] == pytest.approx(0.037174, abs=1e-6)
    # two equal components, df 4 and inf: Welch df = (2e-4)^2 / (1e-8 / 4) = 16
    two = t_interval(0.0, [(1e-4, 4), (1e-4, math.inf)])
    assert two["df"] == pytest.approx(16) and two["se"] == pytest.approx(math.sqrt(2e-4))


def test_the_bootstrap_is_seeded():
    base = _arm("base", [0.2, 0.4, 0.5], shift=[0, 5, -5, 10, -10])
    arm = _arm("arm", [0.25, 0.45, 0.55], shift=[3, -3, 8, 0, -8])
    a, b = compare(GRID, arm, base, seed=1), compare(GRID, arm, base, seed=1)
    assert a == b
    assert compare(GRID, arm, base, seed=2)["final_lo"] != a["final_lo"]


def test_interval_and_verdict_rules():
    v = np.arange(1000, dtype=float)  # order statistics: the 25th and the 975th values
    assert percentile_interval(v) == (25.0, 974.0)
    assert percentile_interval(np.array([-np.inf] * 990 + [1.0] * 10)) == (-np.inf, -np.inf)
    assert percentile_interval(np.array([np.nan] * 5)) == (pytest.approx(np.nan, nan_ok=True),) * 2
    assert verdict(0.01, 0.2) == "better" and verdict(-0.2, -0.01) == "worse"
    assert verdict(-0.01, 0.2) == "not separable" and verdict(0.0, 0.2) == "not separable"


def test_details_round_trip():
    rng = np.random.default_rng(0)
    details = {"pass1": rng.random(37) < 0.5, "n_correct": rng.integers(0, 9, 11), "n_samples": 8}
    row = encode_details(details)
    back = decode_details(row)
    assert row["n_samples"] == 8 and row["n_problems"] == 37
    assert (back["pass1"] == details["pass1"]).all()
    assert (back["n_correct"] == details["n_correct"]).all()
    big = encode_details({"pass1": np.ones(3, bool), "n_correct": np.array([300, 0, 1]),
                          "n_samples": 300})  # fmt: skip
    assert (decode_details(big)["n_correct"] == [300, 0, 1]).all()


# --- Through the CLI: hand-made run directories -------------------------------------------------


def _write_run(root, name, buffer, seed, correct_by_step, units_per_step, lr=None):
    """A finished run directory: config.yaml, metrics.jsonl (eval rows) and
    eval_details.jsonl with the given per-problem correctness at each evaluated step."""
    d = root / name
    d.mkdir(parents=True)
    cfg = {"seed": seed, "buffer": {"name": buffer}, "compute": {"mu": 6.84}}
    if lr is not None:
        cfg["algo"] = {"lr": lr}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    with open(d / "metrics.jsonl", "w") as m, open(d / "eval_details.jsonl", "w") as e:
        for step, correct in correct_by_step.items():
            x = {"compute/paper_units": step * units_per_step, "compute/rollouts": 64 * step}
            wall = {"compute/seconds": 0.1 * step}
            m.write(json.dumps({"step": step, "eval/pass@1": correct.mean(), **x, **wall}) + "\n")
            det = {"pass1": correct, "n_correct": correct.astype(int) * 8, "n_samples": 8}
            e.write(json.dumps({"step": step, **x, **encode_details(det)}) + "\n")
    (d / "summary.json").write_text(json.dumps({"status": "finished"}))


@pytest.fixture
def two_arm_sweep(tmp_path):
    """On-policy vs FIFO, seeds 0-2, 200 problems, evaluated at 0, 10, 20 paper units. The
    baseline solves 30 / 40 / 50 % of the problems (seed s: s more), replay 30 / 55 / 60 %."""
    root = tmp_path / "sweep"
    for seed in range(3):
        for buffer, rates, per_step in (("on_policy", (60, 80, 100), 1.0),
                                        ("fifo", (60, 110, 120), 0.5)):  # fmt: skip
            steps = [0, int(10 / per_step), int(20 / per_step)]
            correct = {}
            for step, n in zip(steps, rates, strict=True):
                c = np.zeros(200, dtype=bool)
                c[: n + seed] = True
                correct[step] = c
            _write_run(root, f"buffer.name={buffer},seed={seed}", buffer, seed, correct, per_step)
    return root


def test_report_prints_intervals_and_verdicts(two_arm_sweep, tmp_path):
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "replay_exp.analysis.report", str(two_arm_sweep), "--out", str(out),
         "--n-boot", "1000"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    assert "**Warning: fewer than 4 seeds per configuration**" in text.split("## Best")[0]
    assert "## Against the baseline (on-policy): 95 % intervals" in text
    assert "Interval: seed-level t (Welch df)" in text
    stats = pd.read_csv(out / "stats.csv")
    assert len(stats) == 1
    r = stats.iloc[0]
    # Final (x = 20): 0.60 vs 0.50 on 200 problems, identical seeds: +0.100, paired problems,
    # SE sqrt(0.1 * 0.9 / 200) = 0.021.
    assert r["final"] == pytest.approx(0.1) and r["final_verdict"] == "better"
    assert 0.05 < r["final_lo"] < 0.07 and 0.13 < r["final_hi"] < 0.15
    assert r["peak"] == pytest.approx(0.1) and r["problems"] == 200 and r["paired_seeds"]
    # Saving: target 0.98 * 0.505 (the seed-mean peak) = 0.4949. Baseline: from 0.405 at 10 to
    # 0.505 at 20 -> 10 + 10 * 0.0899 / 0.1 = 18.99. FIFO: from 0.305 at 0 to 0.555 at 10 ->
    # 10 * 0.1899 / 0.25 = 7.596. Saving 1 - 7.596 / 18.99 = 0.60.
    assert r["saving"] == pytest.approx(1 - 7.596 / 18.99, abs=1e-3)
    assert r["saving_verdict"] == "better"
    line = [ln for ln in text.splitlines() if ln.startswith("| FIFO")][-1]  # the stats table
    assert "| +0.100 [" in line and "| better |" in line
    assert "+0.100 +0.100 +0.100" in line  # per-seed final differences
    # One number per statistic: the per-configuration table (targets.csv) holds the same
    # seed-mean statistics the bootstrap is centred on, and the saving is printed once.
    t = pd.read_csv(out / "targets.csv").set_index("label")
    assert t.loc["FIFO", "x_to_target"] == pytest.approx(r["x_to_target"], rel=1e-12)
    assert t.loc["on-policy", "x_to_target"] == pytest.approx(r["baseline_x_to_target"], rel=1e-12)
    assert t.loc["FIFO", "saving_vs_baseline"] == pytest.approx(r["saving"], rel=1e-12)
    # peaks: FIFO 0.60 + s / 200 over seeds 0-2 -> 0.605; baseline 0.505: the peak difference
    assert t.loc["FIFO", "peak"] - t.loc["on-policy", "peak"] == pytest.approx(r["peak"])
    assert t.loc["FIFO", "final"] == pytest.approx(0.605) and t.loc["FIFO", "drawdown"] == 0
    # To the baseline's final (0.505 at 20): FIFO passes it at 10 * (0.505 - 0.305) / 0.25 = 8,
    # 1 - 8 / 20 = 0.60, the same rounded percentage by coincidence: each printed once.
    assert r["saving_final"] == pytest.approx(1 - 8 / 20, abs=1e-3)
    assert text.count("+60%") == 2 and "saving vs baseline" not in text
    assert "Point estimates: mean over seeds" in text and "B = 1000" in text


def test_best_over_keeps_each_arms_best_learning_rate(tmp_path):
    """Two arms x two learning rates: on-policy is best at lr 1e-4, FIFO at 3e-5; the report
    keeps those two and compares them."""
    from replay_exp.analysis.loader import load_runs
    from replay_exp.analysis.report import best_over, make_report

    root = tmp_path / "sweep"
    peaks = {("on_policy", 3e-5): 70, ("on_policy", 1e-4): 90, ("fifo", 3e-5): 120,
             ("fifo", 1e-4): 100}  # fmt: skip
    for (buffer, lr), top in peaks.items():
        for seed in range(2):
            correct = {}
            for step, n in zip((0, 10, 20), (60, (60 + top) // 2, top), strict=True):
                c = np.zeros(200, dtype=bool)
                c[:n] = True
                correct[step] = c
            _write_run(root, f"buffer.name={buffer},algo.lr={lr},seed={seed}", buffer, seed,
                       correct, 1.0, lr=lr)  # fmt: skip
    runs = best_over(load_runs([root]), "algo.lr", "eval/pass@1", "compute")
    kept = runs.runs.drop_duplicates("label")[["buffer.name", "algo.lr"]]
    assert sorted(map(tuple, kept.to_numpy().tolist())) == [("fifo", 3e-5), ("on_policy", 1e-4)]
    assert set(runs.steps["label"]) == set(runs.runs["label"])
    out = tmp_path / "report"
    make_report([root], out=out, n_boot=200, best_over_key="algo.lr")
    stats = pd.read_csv(out / "stats.csv")
    assert len(stats) == 1 and stats.iloc[0]["final"] == pytest.approx(0.15)
    with pytest.raises(ValueError, match="--best-over schedule.trainers"):
        best_over(load_runs([root]), "schedule.trainers", "eval/pass@1", "compute")


def test_report_passk_gain_with_intervals(tmp_path):
    """Equal pass@1 (0.125), but replay spreads its successes over twice the problems:
    baseline 2/8 correct on half the problems, replay 1/8 on all. pass@8: 0.5 vs 1.0, so the
    gain grows from 0 at k = 1 to +0.5 at k = 8."""
    from replay_exp.analysis.report import make_report

    root = tmp_path / "sweep"
    J = 200
    for buffer, solved, c in (("on_policy", 100, 2), ("fifo", 200, 1)):
        n_correct = np.zeros(J, dtype=int)
        n_correct[:solved] = c
        for seed in range(4):
            d = root / f"buffer.name={buffer},seed={seed}"
            d.mkdir(parents=True)
            cfg = {"seed": seed, "buffer": {"name": buffer}, "compute": {"mu": 6.84}}
            (d / "config.yaml").write_text(yaml.safe_dump(cfg))
            with open(d / "metrics.jsonl", "w") as m, open(d / "eval_details.jsonl", "w") as e:
                for step in (0, 10):
                    x = {"compute/paper_units": float(step), "compute/seconds": 0.1 * step}
                    pk = {f"eval/pass@{k}_sampled": float(np.mean([pass_at_k(8, int(n), k)
                          for n in n_correct])) for k in (1, 8)}  # fmt: skip
                    m.write(json.dumps({"step": step, "eval/pass@1": 0.5, **pk, **x}) + "\n")
                    det = {"pass1": np.arange(J) < 100, "n_correct": n_correct, "n_samples": 8}
                    e.write(json.dumps({"step": step, **x, **encode_details(det)}) + "\n")
            (d / "summary.json").write_text(json.dumps({"status": "finished"}))
    out = tmp_path / "report"
    summary, _ = make_report([root], out=out, n_boot=300)
    passk = pd.read_csv(out / "passk_stats.csv").set_index("k")
    assert passk.loc[1, "final"] == pytest.approx(0.0, abs=1e-12)
    assert passk.loc[1, "final_verdict"] == "not separable"
    assert passk.loc[8, "final"] == pytest.approx(0.5)
    assert passk.loc[8, "final_verdict"] == "better" and passk.loc[8, "final_lo"] > 0.4
    assert "## pass@k gain over the baseline: 95 % bootstrap intervals" in summary.read_text()


def test_report_against_another_reference(two_arm_sweep, tmp_path):
    """--baseline picks any configuration as the reference: on-policy vs FIFO is then -0.1."""
    from replay_exp.analysis.report import ReportError, make_report

    out = tmp_path / "report"
    make_report([two_arm_sweep], out=out, n_boot=200, reference="FIFO")
    stats = pd.read_csv(out / "stats.csv")
    assert stats["label"].tolist() == ["on-policy"] and stats["baseline"].tolist() == ["FIFO"]
    assert stats.iloc[0]["final"] == pytest.approx(-0.1)
    with pytest.raises(ReportError, match="matches 0 configurations; the labels: "):
        make_report([two_arm_sweep], out=tmp_path / "r2", reference="priority")
    # the same through the command line
    from replay_exp.analysis.report import main

    main([str(two_arm_sweep), "--baseline", "FIFO", "--out", str(tmp_path / "cli"),
          "--n-boot", "200"])  # fmt: skip
    assert pd.read_csv(tmp_path / "cli" / "stats.csv")["baseline"].tolist() == ["FIFO"]


@pytest.mark.parametrize(("per_step", "matched"), [(0.49975, 20.0), (0.475, 10.0)])
def test_a_run_a_sliver_short_of_the_budget_counts_as_there(tmp_path, per_step, matched):
    """Replay's last evaluation at 19.99 of 20 units (a whole number of steps) stands for 20;
    at 19 (5 % short) the comparison stops at the previous point, 10."""
    from replay_exp.analysis.loader import load_runs
    from replay_exp.analysis.stats import compare_to_baseline

    root = tmp_path / "sweep"
    for seed in range(2):
        for buffer, rates, ups in (("on_policy", (60, 80, 100), 1.0),
                                   ("fifo", (60, 110, 120), per_step)):  # fmt: skip
            correct = {}
            for step, n in zip((0, 20, 40) if ups < 1 else (0, 10, 20), rates, strict=True):
                c = np.zeros(200, dtype=bool)
                c[:n] = True
                correct[step] = c
            _write_run(root, f"buffer.name={buffer},seed={seed}", buffer, seed, correct, ups)
    stats = compare_to_baseline(load_runs([root]), "on-policy", n_boot=100)
    assert stats.iloc[0]["x_matched"] == matched
    # at 10: replay interpolated between 0.55 (x = 9.5) and 0.60 (x = 19), baseline 0.40
    expected = 0.1 if matched == 20 else 0.55 + 0.05 * 0.5 / 9.5 - 0.40
    assert stats.iloc[0]["final"] == pytest.approx(expected)


def test_summary_states_the_sweeps_wall_clock(two_arm_sweep, tmp_path):
    """First config.yaml written at t = 1000 s, last summary.json at t = 1120 s: 2.0 min."""
    import os

    from replay_exp.analysis.report import make_report

    for i, d in enumerate(sorted(p for p in two_arm_sweep.iterdir() if p.is_dir())):
        os.utime(d / "config.yaml", (1000 + i, 1000 + i))
        os.utime(d / "summary.json", (1100 + 4 * i, 1100 + 4 * i))
    summary, _ = make_report([two_arm_sweep], out=tmp_path / "r", n_boot=100)
    assert "Wall-clock of these runs, first start to last finish: 2.0 min" in summary.read_text()


def test_equivalence_needs_the_whole_interval_inside_the_margin():
    # Margin 0.02: [-0.015, +0.019] lies inside; [-0.006, +0.023] (not separable from 0, its
    # upper end past +0.02) and [+0.004, +0.021] (better) lie above -0.02 but reach past +0.02:
    # non-inferior, not equivalent; [-0.023, +0.006] reaches below -0.02: not shown; the edges
    # count as inside; NaN shows nothing.
    assert equivalence(-0.015, 0.019, 0.02) == "equivalent"
    assert equivalence(-0.006, 0.023, 0.02) == "non-inferior"
    assert equivalence(0.004, 0.021, 0.02) == "non-inferior"
    assert equivalence(-0.023, 0.006, 0.02) == "not shown"
    assert equivalence(-0.021, 0.025, 0.02) == "not shown"
    assert equivalence(-0.02, 0.02, 0.02) == "equivalent"
    assert equivalence(0.001, 0.004, 0.02) == "equivalent"  # better, and within the margin too
    assert equivalence(math.nan, 0.01, 0.02) == "not shown"
    # Through compare(): the textbook paired interval [-0.0691, +0.1291] above is equivalent
    # within 0.13, non-inferior within 0.1 (-0.0691 > -0.1 but +0.1291 > 0.1), and shows
    # nothing within 0.06 (-0.0691 < -0.06).
    d = [0.125, -0.075, 0.075, -0.025, 0.05]
    out = compare(GRID, _seed_means("arm", [0.5 + x for x in d]), _seed_means("b", [0.5] * 5),
                  n_boot=8000)  # fmt: skip
    assert equivalence(out["final_lo"], out["final_hi"], 0.13) == "equivalent"
    assert equivalence(out["final_lo"], out["final_hi"], 0.1) == "non-inferior"
    assert equivalence(out["final_lo"], out["final_hi"], 0.06) == "not shown"
