"""The study budget (replay_exp.analysis.studies.budget) and the stage-1 selection
(replay_exp.analysis.studies.selection) on hand-made run directories whose answers are known."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml

from replay_exp.analysis.studies.budget import budget_table, study_budget
from replay_exp.analysis.studies.selection import best_per_arm, brackets, scores
from replay_exp.eval.estimators import encode_details

J = 300  # held-out problems


def _run(root, name, cfg, solved_at: dict[float, int]):
    """A finished run: at paper units x the first ``solved_at[x]`` problems are solved."""
    d = root / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    with open(d / "metrics.jsonl", "w") as m, open(d / "eval_details.jsonl", "w") as e:
        for step, (x, n) in enumerate(sorted(solved_at.items())):
            c = np.zeros(J, dtype=bool)
            c[:n] = True
            units = {"compute/paper_units": x, "compute/rollouts": 64 * step}
            m.write(json.dumps({"step": step, "eval/pass@1": c.mean(), **units}) + "\n")
            det = {"pass1": c, "n_correct": c.astype(int), "n_samples": 1}
            e.write(json.dumps({"step": step, **units, **encode_details(det)}) + "\n")
    (d / "summary.json").write_text(json.dumps({"status": "finished"}))


def _on_policy(lr, seed):
    return {"seed": seed, "buffer": {"name": "on_policy"}, "algo": {"lr": lr},
            "derived": {"reuse_ratio": 1.0}}  # fmt: skip


@pytest.fixture
def plateau_sweep(tmp_path):
    """Two learning rates x 3 seeds, evaluated every 50 units to 300. lr 1e-4 solves 60, 90,
    120, 150, 180, 180, 180 problems (+ s for seed s at every point): it rises until 200 and is
    flat after; lr 3e-5 solves 20 fewer everywhere (never the best)."""
    root = tmp_path / "budget"
    xs = [0, 50, 100, 150, 200, 250, 300]
    best = [60, 90, 120, 150, 180, 180, 180]
    for lr, minus in ((1e-4, 0), (3e-5, 20)):
        for s in range(3):
            solved = {x: n + s - minus for x, n in zip(xs, best, strict=True)}
            _run(root, f"algo.lr={lr},seed={s}", _on_policy(lr, s), solved)
    return root


def test_the_budget_is_where_the_best_arm_stops_gaining(plateau_sweep):
    """Budgets 150 and 300 (step 150; 2B/3 = 100 and 200). At 150 the best arm gains
    (150 - 120) / 300 = 0.1 on every seed: the same 30 problems newly solved, so the seed
    variance is 0 and the problem bootstrap gives SE sqrt(0.1 * 0.9 / 300) = 0.0173 ->
    better. At 300 it gains exactly 0 on every problem: [0, 0], not separable -> the budget."""
    table = budget_table([plateau_sweep], start=150, step=150, n_boot=2000)
    best = table[table["best"]].set_index("budget")
    assert best["label"].str.contains("1e-04").all()
    assert best.loc[150, "gain"] == pytest.approx(0.1)
    assert best.loc[150, "verdict"] == "better"
    assert best.loc[150, "gain_lo"] == pytest.approx(0.1 - 1.968 * 0.01732, abs=0.004)
    assert best.loc[300, "gain"] == 0 and best.loc[300, "gain_hi"] == 0
    assert best.loc[300, "verdict"] == "not separable"
    # accuracies at B: (180 + mean seed 1) / 300
    assert best.loc[300, "acc_end"] == pytest.approx(181 / 300)
    assert study_budget(table) == (300.0, False)


def test_the_cap_binds_when_the_best_arm_gains_at_every_budget(plateau_sweep):
    table = budget_table([plateau_sweep], start=150, step=150, n_boot=500)
    table = table[table["budget"] == 150]  # only a budget where it still gains
    assert study_budget(table) == (150.0, True)
    # a noisy not-separable between gaining budgets is not the ceiling: only one that lasts
    fake = pd.DataFrame({"budget": [1, 2, 3, 4, 5], "best": True,
                         "verdict": ["better", "not separable", "better", "not separable",
                                     "not separable"]})  # fmt: skip
    assert study_budget(fake) == (4.0, False)
    assert study_budget(fake.iloc[:3]) == (3.0, True)
    with pytest.raises(ValueError, match="before the first budget"):
        budget_table([plateau_sweep], start=450, step=150)


@pytest.fixture
def stage1(tmp_path):
    """Finals (at 100 units) by arm and lr, seeds 0 and 1 (seed 2 scores 0.99 everywhere and
    must be ignored with --seeds 0 1):
    on-policy lr 1e-4 / 2e-4 / 4e-4: 0.60 / 0.70 / 0.65 -> 2e-4, inside its grid;
    FIFO y=2 N=512 lr 1e-5 / 2e-5 / 4e-5: 0.75 / 0.70 / 0.60 -> 1e-5, an edge: widen to 5e-6;
    FIFO y=2 N=2048 lr 1e-5 / 2e-5 / 4e-5: 0.60 / 0.8 / 0.8 -> a tie: the larger lr, 4e-5,
    an edge: widen to 8e-5; the arm FIFO y=2 picks N = 2048 (0.80 > 0.75)."""
    root = tmp_path / "stage1"
    cells = [("on_policy", None, 1.0, [1e-4, 2e-4, 4e-4], [180, 210, 195]),
             ("fifo", 512, 2.0, [1e-5, 2e-5, 4e-5], [225, 210, 180]),
             ("fifo", 2048, 2.0, [1e-5, 2e-5, 4e-5], [180, 240, 240])]  # fmt: skip
    for buf, cap, y, lrs, finals in cells:
        for lr, n in zip(lrs, finals, strict=True):
            for s in range(3):
                cfg = {"seed": s, "buffer": {"name": buf, "capacity": cap},
                       "algo": {"lr": lr}, "derived": {"reuse_ratio": y}}  # fmt: skip
                final = 297 if s == 2 else n + (1 if s else -1)  # seeds 0, 1: n -+ 1
                _run(root, f"b={buf},N={cap},lr={lr},seed={s}", cfg, {0: 60, 100: final})
    return root


def test_selection_picks_each_arms_best_and_flags_unbracketed_lrs(stage1, tmp_path):
    from replay_exp.analysis.loader import load_runs

    runs = load_runs([stage1]).runs
    table = scores(runs, [0, 1], ["buffer.capacity", "algo.lr"])
    assert (table["seeds_done"] == 2).all() and len(table) == 9
    best = best_per_arm(table).set_index("arm")
    assert best.loc["on-policy", "algo.lr"] == 2e-4
    assert best.loc["on-policy", "score"] == pytest.approx(210 / J)
    assert best.loc["fifo y=2", "buffer.capacity"] == 2048
    assert best.loc["fifo y=2", "algo.lr"] == 4e-5  # the tie goes to the larger lr
    br = brackets(table, ["buffer.capacity", "algo.lr"])
    rows = {(r["arm"], r["buffer.capacity"]): r for _, r in br.iterrows()}
    on = [r for k, r in rows.items() if k[0] == "on-policy"][0]
    assert on["bracketed"] and on["widen_to"] == ""
    assert not rows[("fifo y=2", 512)]["bracketed"]
    assert rows[("fifo y=2", 512)]["widen_to"] == "5e-06"
    assert rows[("fifo y=2", 2048)]["best_lr"] == 4e-5  # the tie rule here too: an edge
    assert rows[("fifo y=2", 2048)]["widen_to"] == "8e-05"
    out = tmp_path / "sel"
    proc = subprocess.run(
        [sys.executable, "-m", "replay_exp.analysis.studies.selection", str(stage1),
         "--seeds", "0", "1",
         "--out", str(out)], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "selection.csv").is_file() and (out / "brackets.csv").is_file()
    assert "| fifo y=2 | 2048 | 4e-05 | 0.8 |" in (out / "summary.md").read_text()


def test_pareto_families_over_lr_and_buffer_size(stage1):
    """--envelope-over algo.lr buffer.capacity: one envelope per arm (on-policy; FIFO y = 2
    over N x lr); the default (lr only) keeps N = 512 and N = 2048 apart."""
    from replay_exp.analysis.loader import load_runs
    from replay_exp.analysis.report import families

    runs = load_runs([stage1])
    by_lr, _ = families(runs)
    by_arm, _ = families(runs, ("algo.lr", "buffer.capacity"))
    fifo = [lab for lab in by_arm if "fifo" in lab.lower() or "FIFO" in lab]
    assert len(fifo) == 6 and len({by_arm[lab] for lab in fifo}) == 1
    assert len({by_lr[lab] for lab in fifo}) == 2
    on = [lab for lab in by_arm if lab not in fifo]
    assert len(on) == 3 and len({by_arm[lab] for lab in on}) == 1
    assert by_arm[on[0]] != by_arm[fifo[0]]


@pytest.mark.parametrize("module", ["budget", "selection"])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, module):
    out = tmp_path / "out"
    extra = ["--seeds", "0"] if module == "selection" else []
    proc = subprocess.run(
        [sys.executable, "-m", f"replay_exp.analysis.studies.{module}", str(tmp_path / "nope"),
         *extra, "--out", str(out)], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.startswith(f"{module} error: ")
    assert len(proc.stderr.splitlines()) == 1 and not out.exists()


def test_selection_by_peak_picks_the_lr_whose_curve_peaked_highest(tmp_path):
    """Two lrs of one arm, seeds 0, 1: lr 1e-4 peaks at 250/300 at x = 50 and ends at 150;
    lr 2e-4 reaches 200 and stays. By final: 2e-4 (0.667 > 0.5); by peak: 1e-4 (0.833)."""
    from replay_exp.analysis.loader import load_runs

    root = tmp_path / "peaks"
    for lr, curve in ((1e-4, {0: 60, 50: 250, 100: 150}), (2e-4, {0: 60, 50: 200, 100: 200})):
        for s in range(2):
            cfg = {"seed": s, "buffer": {"name": "fifo", "capacity": 256},
                   "algo": {"lr": lr}, "derived": {"reuse_ratio": 2.0}}  # fmt: skip
            _run(root, f"lr={lr},seed={s}", cfg, curve)
    runs = load_runs([root]).runs
    by_final = best_per_arm(scores(runs, [0, 1], ["algo.lr"]))
    by_peak = best_per_arm(scores(runs, [0, 1], ["algo.lr"], score="peak"))
    assert by_final.iloc[0]["algo.lr"] == 2e-4
    assert by_final.iloc[0]["score"] == pytest.approx(200 / J)
    assert by_peak.iloc[0]["algo.lr"] == 1e-4
    assert by_peak.iloc[0]["score"] == pytest.approx(250 / J)


def test_arm_keys_split_arms_by_correction_and_rank_them(tmp_path):
    """One reuse, three corrections (GRPO plain, GRPO + IcePop mask, CISPO) x lr 1e-5 / 2e-5,
    seeds 0, 1. Final solved of 300: grpo 150 / 180, grpo+icepop 210 / 195, cispo 120 / 240.
    Without --arm-keys the corrections pool into one arm of 6 runs per lr: lr 2e-5 scores
    (180 + 195 + 240) / 900 = 0.683, lr 1e-5 (150 + 210 + 120) / 900 = 0.533. With algo.name
    algo.mask, three arms, ranked cispo 0.8 > grpo+icepop 0.7 > grpo 0.6, each with its own
    lr."""
    from replay_exp.analysis.loader import load_runs

    root = tmp_path / "corr"
    finals = {
        ("grpo", None): (150, 180), ("grpo", "icepop"): (210, 195), ("cispo", None): (120, 240),
    }  # fmt: skip
    for (name, mask), ns in finals.items():
        for lr, n in zip((1e-5, 2e-5), ns, strict=True):
            for s in range(2):
                cfg = {"seed": s, "buffer": {"name": "fifo", "capacity": 512},
                       "algo": {"lr": lr, "name": name, "mask": mask},
                       "derived": {"reuse_ratio": 8.0}}  # fmt: skip
                _run(root, f"{name},{mask},lr={lr},seed={s}", cfg, {0: 60, 100: n})
    runs = load_runs([root]).runs
    one = best_per_arm(scores(runs, [0, 1], ["algo.lr"]))
    assert list(one["arm"]) == ["fifo y=8"] and one.iloc[0]["seeds_done"] == 6
    assert one.iloc[0]["score"] == pytest.approx(615 / 900)
    table = scores(runs, [0, 1], ["algo.lr"], arm_keys=["algo.name", "algo.mask"])
    best = best_per_arm(table).sort_values("score", ascending=False).set_index("arm")
    assert list(best.index) == [
        "fifo y=8, name=cispo", "fifo y=8, name=grpo, mask=icepop", "fifo y=8, name=grpo",
    ]  # fmt: skip
    assert list(best["algo.lr"]) == [2e-5, 1e-5, 2e-5]
    assert list(best["score"]) == pytest.approx([0.8, 0.7, 0.6])


def test_brackets_reports_the_score_of_the_lr_the_tie_rule_picked():
    """lr 1e-5 / 2e-5 / 4e-5 score 0.8004 / 0.8000 / 0.7000: 1e-5 is highest, but 2e-5 is within
    the 0.001 tie and larger, so 2e-5 is picked (inside the grid) and its own score, 0.8000,
    not the maximum 0.8004, is the best_score printed next to it."""
    table = pd.DataFrame({"arm": ["a"] * 3, "algo.lr": [1e-5, 2e-5, 4e-5],
                          "score": [0.8004, 0.8000, 0.7000]})  # fmt: skip
    row = brackets(table, ["algo.lr"]).iloc[0]
    assert row["best_lr"] == 2e-5 and row["bracketed"]
    assert row["best_score"] == pytest.approx(0.8000)
