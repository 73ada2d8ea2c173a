"""``replay-exp-report`` on real tiny sweeps: every figure, its CSV and the markdown summary."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from replay_exp.runlog import read_metrics

pytestmark = pytest.mark.slow


def _report(*args):
    return subprocess.run(
        [sys.executable, "-m", "replay_exp.analysis.report", *map(str, args)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def _png(path):
    """A drawn figure: a PNG with more on it than empty axes, which save (as a 256-colour
    palette, analysis.plots.save_png) in ~4 kB with 16 colours; one line on them: ~9 kB, 42."""
    from PIL import Image

    assert path.is_file() and path.stat().st_size > 5_000, path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as im:
        colors = im.getcolors(256)  # None: more than 256
        assert colors is None or len(colors) > 16, path


def test_report_of_a_baseline_vs_replay_sweep(tiny_sweeps, tmp_path):
    out = tmp_path / "report"
    proc = _report(tiny_sweeps["compute"], "--out", out, "--theory", tmp_path / "theory")
    assert proc.returncode == 0, proc.stderr[-3000:]
    labels = {"on-policy", "FIFO, y=2"}

    for axis in ("compute", "steps", "wall"):
        _png(out / f"curves_{axis}.png")
        curves = pd.read_csv(out / f"curves_{axis}.csv")
        assert list(curves.columns) == ["config", "label", "x", "mean", "median", "q25", "q75",
                                        "n_seeds", "n_runs"]  # fmt: skip
        assert set(curves["label"]) == labels and (curves["n_runs"] == 2).all()
        assert (curves["q25"] <= curves["median"]).all() and (
            curves["median"] <= curves["q75"]
        ).all()
    # Compute: every on-policy step costs 1 unit, 4 steps.
    base = pd.read_csv(out / "curves_compute.csv").query("label == 'on-policy'")
    assert base["x"].min() == 0 and base["x"].max() == pytest.approx(4.0)

    pareto = pd.read_csv(out / "pareto_compute.csv")
    assert set(pareto["family"]) == {"on-policy", "replay"}
    assert pareto.groupby("family")["best"].apply(lambda b: b.is_monotonic_increasing).all()

    targets = pd.read_csv(out / "targets.csv")
    assert targets["label"].tolist() == ["on-policy", "FIFO, y=2"]  # baseline first
    assert "saving_vs_baseline" in targets and (targets["seeds"] == 2).all()

    gain = pd.read_csv(out / "passk_gain.csv")
    assert sorted(set(gain["k"])) == [1, 4] and set(gain["label"]) == labels
    assert (gain.query("label == 'on-policy'")["gain"] == 0).all()  # against itself

    tele = pd.read_csv(out / "telemetry.csv")
    assert set(tele["stat"]) == {"off_policiness", "replay_count", "steps_since_last_use"}
    # On-policy: every rollout used once, at off-policiness 0.
    onp = tele.query("label == 'on-policy' and stat == 'off_policiness' and count > 0")
    assert onp["bin"].tolist() == [0]
    # The trainer's data/* keys: on-policy trains exactly what it generates, each rollout once.
    comp = pd.read_csv(out / "composition_final.csv")
    assert set(comp["label"]) == labels and set(comp["stat"]) == {"count", "reward", "length",
                                                                   "pass_rate"}  # fmt: skip
    assert (comp.query("label == 'on-policy'")["diff"] == 0).all()
    assert set(pd.read_csv(out / "composition_compute.csv")["label"]) == labels
    for name in ("pareto_compute", "passk_gain", "telemetry", "composition_compute"):
        _png(out / f"{name}.png")
    # --theory: the theory curves at the sweep's mu go to one place per mu, shared by every
    # report at that mu, and the summary links them there.
    assert not list(out.glob("theory_*"))
    for name in ("theory_xy_vs_mu", "theory_K"):
        _png(tmp_path / "theory" / "mu=6.84" / f"{name}.png")
        link = f"- [{name}.png](../theory/mu=6.84/{name}.png)"
        assert link in (out / "summary.md").read_text()

    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 4 and (runs["status"] == "finished").all()
    assert "run_dir" not in runs and "output_root" not in runs  # no machine paths
    summary = (out / "summary.md").read_text()
    assert summary == proc.stdout.split("wrote ")[0].rstrip("\n") + "\n"
    assert "Baseline: **on-policy**" in summary and "| FIFO, y=2 | 2 |" in summary
    assert "4 runs (4 finished), 2 configurations" in summary


def test_report_equivalence_margin(tiny_sweeps, tmp_path):
    out = tmp_path / "report"
    proc = _report(tiny_sweeps["compute"], "--out", out, "--margin", "0.5", "--n-boot", "200")
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = pd.read_csv(out / "stats.csv")
    above = stats["final_lo"] >= -0.5
    inside = stats["final_hi"] <= 0.5
    expected = np.where(above & inside, "equivalent", np.where(above, "non-inferior", "not shown"))
    assert (stats["final_equivalence"] == expected).all()
    summary = (out / "summary.md").read_text()
    assert "Equivalence margin 0.5" in summary and "final vs margin ±0.5 |" in summary
    # Without --theory: no theory curves, and the summary says how to draw them.
    assert not list(out.glob("theory_*")) and "theory curves for mu = 6.84: not drawn" in summary
    row = next(line for line in summary.splitlines() if line.startswith("| FIFO, y=2 | 2 (yes) "))
    assert row.endswith(f" {stats['final_equivalence'].iloc[0]} |")


def test_slim_report_keeps_its_tables_and_names_the_rest(tiny_sweeps, tmp_path):
    full, lean = tmp_path / "full", tmp_path / "lean"
    assert _report(tiny_sweeps["compute"], "--out", full, "--n-boot", "200").returncode == 0
    proc = _report(tiny_sweeps["compute"], "--out", lean, "--n-boot", "200", "--slim")
    assert proc.returncode == 0, proc.stderr[-3000:]
    kept = {p.name for p in lean.iterdir()}
    # This sweep has a baseline, pass@k and composition, but no heatmap and no controller.
    assert kept == {"summary.md", "runs.csv", "targets.csv", "stats.csv", "passk_stats.csv",
                    "composition_final.csv", "curves_compute.png"}  # fmt: skip
    text = (lean / "summary.md").read_text()
    before, _, files = text.partition("\n## Files\n")
    assert before == (full / "summary.md").read_text().partition("\n## Files\n")[0]
    # Every link left points at a kept file; the last line names every dropped one and the
    # command that redraws them (this one, less --slim).
    for name in re.findall(r"\]\(([^)/]+)\)", files):
        assert name in kept
    last = files.rstrip("\n").splitlines()[-1]
    dropped = sorted({p.name for p in full.iterdir()} - kept)
    assert last.startswith(f"- not kept in the repository: {', '.join(dropped)}; redrawn ")
    assert f"`replay-exp-report {tiny_sweeps['compute']} --out {lean} --n-boot 200`" in last
    assert text == proc.stdout.split("wrote ")[0].rstrip("\n") + "\n"


def test_report_heatmap_over_n_and_the_node_split(tiny_sweeps, tmp_path):
    out = tmp_path / "report"
    proc = _report(tiny_sweeps["heatmap"], "--out", out, "--x", "compute")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _png(out / "heatmap.png")
    heat = pd.read_csv(out / "heatmap.csv")
    assert sorted(zip(heat["buffer.capacity"], heat["(W,T)"], strict=True)) == [
        (32, "(4,4)"), (32, "(6,2)"), (64, "(4,4)"), (64, "(6,2)"),
    ]  # fmt: skip
    assert set(heat["label"]) == {"N=32, (6,2)", "N=32, (4,4)", "N=64, (6,2)", "N=64, (4,4)"}
    assert not (out / "passk_gain.png").exists()  # no baseline in this sweep
    assert "No on-policy baseline" in (out / "summary.md").read_text()
    # A replay configuration named as the baseline keeps its cell.
    out = tmp_path / "report_vs_cell"
    proc = _report(tiny_sweeps["heatmap"], "--out", out, "--x", "compute", "--baseline",
                   "N=32, (6,2)")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    heat = pd.read_csv(out / "heatmap.csv")
    assert len(heat) == 4 and "N=32, (6,2)" in set(heat["label"])


def test_report_survives_damaged_runs_and_writes_into_the_sweep(tiny_sweeps, tmp_path):
    sweep = tmp_path / "compute"
    shutil.copytree(tiny_sweeps["compute"], sweep, ignore=shutil.ignore_patterns("report"))
    a, b = sorted(p for p in sweep.iterdir() if p.is_dir())[:2]
    (a / "summary.json").unlink()
    with open(a / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "eval/pa')  # killed mid-write
    (b / "config.yaml").unlink()
    proc = _report(sweep)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "truncated or corrupt line" in proc.stderr
    assert "missing config.yaml" in proc.stderr
    assert (sweep / "report" / "summary.md").is_file()  # the default place
    assert "1 unfinished" in (sweep / "report" / "summary.md").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["{tmp}/nope"], "no such directory"),
        (["{tmp}", "--frac", "1.5"], "--frac"),
        (["{tmp}", "--margin", "0"], "--margin"),
    ],
)
def test_report_errors_are_one_line(tmp_path, args, message):
    proc = _report(*[a.format(tmp=tmp_path) for a in args])
    assert proc.returncode == 2 and message in proc.stderr
    assert proc.stderr.startswith("report error: ") and len(proc.stderr.splitlines()) == 1
    assert not (tmp_path / "nope").exists() and not (tmp_path / "report").exists()


def test_report_of_a_controlled_sweep_draws_the_knob_paths(fast_session, tmp_path):
    """Two seeds of controller=adaptive (a rung up at every calm decision, every 2 steps, from
    the on-policy start R = N = B = 16): the report draws each knob's path and tables where
    the knobs ended; its eval rows carry the knobs, so an archived copy keeps them too."""
    proc = subprocess.run(
        [sys.executable, "-m", "replay_exp.train", "-m", *fast_session, "sweep_name=ctl",
         f"output_root={tmp_path / 'runs'}", "controller=adaptive", "controller.every=2",
         "controller.guard.patience=1", "buffer.capacity=16", "schedule.max_steps=8",
         "eval.every=4", "save_final_model=false", "seed=0,1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "report"
    proc = _report(tmp_path / "runs" / "ctl", "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for knob in ("reuse_ratio", "horizon"):
        _png(out / f"controller_{knob}_compute.png")
        path = pd.read_csv(out / f"controller_{knob}_compute.csv")
        assert (path["n_runs"] == 2).all()
    final = pd.read_csv(out / "controller_final.csv")
    assert final["seeds"].tolist() == [2]
    # every 2 steps for 8 steps: 4 decisions; it started at y = 1 and climbed (calm on-policy)
    assert final["decisions"].tolist() == [4.0]
    assert final["reuse_ratio"].iloc[0] > 1 and final["moves_up"].iloc[0] >= 1
    assert "## The controller" in (out / "summary.md").read_text()
    for metrics in (tmp_path / "runs" / "ctl").glob("*/metrics.jsonl"):
        evals = [r for r in read_metrics(metrics) if "eval/pass@1" in r]
        assert all("controller/reuse_ratio" in r for r in evals[1:])  # step 0: before any step


def test_the_title_names_run_directories_by_their_sweep(tmp_path):
    """A shell glob over a sweep's runs (``sweep/mu=2,*``) hands the report run directories:
    the title names their sweep and counts them instead of listing every run's name."""
    from replay_exp.analysis.report import sources_title

    for sweep, runs in {"s_onpolicy": ["mu=2,seed=40", "mu=2,seed=41"], "s_ctl": ["r"]}.items():
        for r in runs:
            (tmp_path / sweep / r).mkdir(parents=True)
            (tmp_path / sweep / r / "config.yaml").write_text("seed: 0\n")
    (tmp_path / "whole").mkdir()
    paths = [tmp_path / "whole", *sorted((tmp_path / "s_onpolicy").iterdir()),
             tmp_path / "s_ctl" / "r"]  # fmt: skip
    assert sources_title(paths) == "whole, s_onpolicy (2 runs), s_ctl (1 run)"


def test_the_redrawn_by_command_gives_sibling_runs_back_as_their_glob(tmp_path, monkeypatch):
    """A slim report's "redrawn by" command: run directories a shell glob handed over become the
    glob again when it matches exactly them (cut at a ``,`` or ``=`` where that still does);
    anything else stays listed, quoted."""
    from replay_exp.analysis.report import sources_args

    monkeypatch.chdir(tmp_path)
    for r in ["mu=2,seed=40", "mu=2,seed=41", "mu=17.6,seed=40", "mu=17.6,seed=41"]:
        (tmp_path / "s" / r).mkdir(parents=True)
        (tmp_path / "s" / r / "config.yaml").write_text("seed: 0\n")
    (tmp_path / "whole").mkdir()
    mu2 = ["s/mu=2,seed=40", "s/mu=2,seed=41"]
    # common prefix "mu=2,seed=4", cut after its last "," -> "mu=2,": exactly these two
    assert sources_args(["whole", *mu2]) == ["whole", "s/mu=2,*"]
    # the same where mu=2's are the only runs so far: "t/mu=*" would match them too, but not
    # once other mu are added beside them
    shutil.copytree(tmp_path / "s", tmp_path / "t", ignore=shutil.ignore_patterns("mu=17.6*"))
    assert sources_args([m.replace("s/", "t/") for m in mu2]) == ["t/mu=2,*"]
    # all four: common prefix "mu=" (no ","), which matches exactly the four
    assert sources_args(
        sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "s").iterdir())
    ) == ["s/mu=*"]
    # one of mu=17.6's two: no prefix matches only it and a mu=2 run -> listed, quoted
    odd = ["s/mu=17.6,seed=41", "s/mu=2,seed=40"]
    assert sources_args(odd) == odd
    # not in a shell's (sorted) order: a glob would reorder them -> listed
    assert sources_args(mu2[::-1]) == mu2[::-1]
    # a name with a space keeps its quotes; "x y/" and a single run: listed as given
    (tmp_path / "x y" / "r").mkdir(parents=True)
    (tmp_path / "x y" / "r" / "config.yaml").write_text("seed: 0\n")
    assert sources_args(["x y/r"]) == ["'x y/r'"]
