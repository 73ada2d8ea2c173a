"""The trained-vs-generated composition of ``replay-exp-report`` (``composition_<x>.png/csv``,
``composition_final.csv`` and its summary table) on hand-made run directories whose ``data/*``
keys are planted with a known answer; runs without the keys (older sweeps) are left out of it
only."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from replay_exp.analysis.report import main, make_report

STATS = ("reward", "length", "pass_rate")
EVERY, EVAL_EVERY, LAST = 5, 10, 25  # log every 5 steps, evaluate at 0, 10, 20 (and not 25)
PER_STEP = 64  # rollouts generated per step


def _planted(buffer: str, seed: int, step: int) -> dict[str, tuple[float, dict[str, float]]]:
    """Step ``step``'s data (1-based): kind -> (count, {stat: mean}). Generated: reward
    0.3 + 0.2 s, length 100 + 20 s, pass rate 0.4 + 0.2 s on seed s. On-policy trains exactly
    what it generates; FIFO trains every rollout twice, with reward +0.05, length -10 and pass
    rate +0.1 over steps 1-10, +0.2 from step 11 on (hard problems starved, more so later)."""
    gen = {"reward": 0.3 + 0.2 * seed, "length": 100.0 + 20 * seed, "pass_rate": 0.4 + 0.2 * seed}
    if buffer == "on_policy":
        return {"generated": (PER_STEP, gen), "trained": (PER_STEP, dict(gen))}
    extra = 0.1 if step <= 10 else 0.2
    trained = {"reward": gen["reward"] + 0.05, "length": gen["length"] - 10,
               "pass_rate": gen["pass_rate"] + extra}  # fmt: skip
    return {"generated": (PER_STEP, gen), "trained": (2 * PER_STEP, trained)}


def _write_run(root, buffer, seed, with_data=True):
    """A finished run: rows every 5 steps up to 25, evaluations at 0, 10, 20 with the interval
    means since the previous evaluation; cumulative ``data/*`` on every row, accumulated as the
    trainer's ledger does (sums over samples / count; NaN, written null, before the first)."""
    d = root / f"buffer.name={buffer},seed={seed}"
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "buffer": {"name": buffer}}))
    units = 1.0 if buffer == "on_policy" else 0.5  # paper units per step
    sums = {k: {"count": 0.0, **dict.fromkeys(STATS, 0.0)} for k in ("generated", "trained")}
    at_eval = {k: dict(v) for k, v in sums.items()}
    rows = []
    for step in range(LAST + 1):
        if step:
            for kind, (n, means) in _planted(buffer, seed, step).items():
                sums[kind]["count"] += n
                for s in STATS:
                    sums[kind][s] += n * means[s]
        if step % EVERY:
            continue
        row = {"step": step, "compute/paper_units": units * step, "compute/seconds": 0.1 * step,
               "train/reward": 0.5}  # fmt: skip
        if with_data:
            for kind, t in sums.items():
                row[f"data/{kind}_count"] = t["count"]
                for s in STATS:
                    row[f"data/{kind}_{s}"] = t[s] / t["count"] if t["count"] else None
        if step % EVAL_EVERY == 0 and step < LAST:
            row["eval/pass@1"] = 0.2 + 0.01 * step + (0.05 if buffer == "fifo" else 0.0)
            if with_data:
                for kind, t in sums.items():
                    n = t["count"] - at_eval[kind]["count"]
                    row[f"data/interval/{kind}_count"] = n
                    for s in STATS:
                        row[f"data/interval/{kind}_{s}"] = (
                            (t[s] - at_eval[kind][s]) / n if n else None
                        )
                at_eval = {k: dict(v) for k, v in sums.items()}
        rows.append(row)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "summary.json").write_text(json.dumps({"status": "finished"}))


def _sweep(root, with_data=True):
    """On-policy and FIFO, seeds 0 and 1 with the keys, and a third on-policy seed from before
    them (no ``data/*``)."""
    for buffer in ("on_policy", "fifo"):
        for seed in (0, 1):
            _write_run(root, buffer, seed, with_data)
    _write_run(root, "on_policy", 2, with_data=False)
    return root


def test_report_draws_trained_minus_generated_and_tabulates_the_planted_values(tmp_path, capsys):
    sweep = _sweep(tmp_path / "sweep")
    out = tmp_path / "report"
    main([str(sweep), "--baseline", "on-policy", "--out", str(out), "--n-boot", "100"])
    png = out / "composition_compute.png"
    assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Per interval (the figure's data), at the evaluations that close one, x = compute:
    # on-policy at 10 and 20 units, FIFO (0.5 unit per step) at 5 and 10. The first
    # evaluation (step 0) closes no interval. FIFO's pass-rate difference: +0.1 over steps
    # 1-10, +0.2 over 11-20, on both seeds; length -10, reward +0.05; on-policy 0.
    curves = pd.read_csv(out / "composition_compute.csv")
    fifo = curves[curves["label"] == "FIFO"]
    onp = curves[curves["label"] == "on-policy"]
    p = fifo[fifo["stat"] == "pass_rate"]
    assert p["x"].tolist() == [5.0, 10.0] and p["mean"].tolist() == pytest.approx([0.1, 0.2])
    assert p["q75"].tolist() == pytest.approx(p["q25"].tolist()) and (p["n_runs"] == 2).all()
    assert fifo[fifo["stat"] == "length"]["mean"].tolist() == pytest.approx([-10, -10])
    assert fifo[fifo["stat"] == "reward"]["mean"].tolist() == pytest.approx([0.05, 0.05])
    assert onp["x"].tolist() == [10.0, 20.0] * 3
    assert onp["mean"].tolist() == pytest.approx([0.0] * 6, abs=1e-12)
    assert (onp["n_runs"] == 2).all()  # the seed without the keys is left out

    # Final cumulative values (step 25, the last row, not an evaluation), mean over seeds 0-1.
    # Generated, both arms: 64 x 25 = 1600 rollouts; reward (0.3 + 0.5) / 2 = 0.4, length
    # (100 + 120) / 2 = 110, pass rate (0.4 + 0.6) / 2 = 0.5. On-policy trains the same:
    # differences 0. FIFO trains 2 x 1600 = 3200 samples; reward 0.45, length 100; pass rate:
    # steps 1-10 at +0.1 and 11-25 at +0.2, equal counts per step, so
    # 0.5 + (10 x 0.1 + 15 x 0.2) / 25 = 0.5 + 0.16 = 0.66: +0.16.
    final = pd.read_csv(out / "composition_final.csv").set_index(["label", "stat"])
    expected = {
        ("on-policy", "count"): (1600, 1600, 0),
        ("on-policy", "reward"): (0.4, 0.4, 0),
        ("on-policy", "length"): (110, 110, 0),
        ("on-policy", "pass_rate"): (0.5, 0.5, 0),
        ("FIFO", "count"): (1600, 3200, 1600),
        ("FIFO", "reward"): (0.4, 0.45, 0.05),
        ("FIFO", "length"): (110, 100, -10),
        ("FIFO", "pass_rate"): (0.5, 0.66, 0.16),
    }
    assert sorted(final.index) == sorted(expected)
    for key, (gen, trained, diff) in expected.items():
        r = final.loc[key]
        assert r["generated"] == pytest.approx(gen) and r["trained"] == pytest.approx(trained)
        assert r["diff"] == pytest.approx(diff, abs=1e-12) and r["seeds"] == 2

    summary = (out / "summary.md").read_text()
    assert summary == capsys.readouterr().out.split("wrote ")[0].rstrip("\n") + "\n"
    section = summary.split("## Trained vs generated data")[1].split("## Files")[0]
    assert "| FIFO | 2 | pass_rate | 0.500 | 0.660 | +0.160 |" in section
    assert "| FIFO | 2 | length | 110.0 | 100.0 | -10.0 |" in section
    assert "| on-policy | 2 | pass_rate | 0.500 | 0.500 | +0.000 |" in section
    assert "1 of 5 runs left out of this section (no `data/*` composition keys" in section
    assert "on-policy (1)." in section
    assert "- [composition_compute.png](composition_compute.png)" in summary
    assert "- [composition_final.csv](composition_final.csv)" in summary


def test_sweeps_without_the_keys_get_the_rest_of_the_report_unchanged(tmp_path):
    """The same sweep logged before the ``data/*`` keys: no composition files, a one-line
    note, and every other table as with the keys."""
    new = make_report([_sweep(tmp_path / "new" / "sweep")], out=tmp_path / "r_new",
                      n_boot=100)[0]  # fmt: skip
    old = make_report([_sweep(tmp_path / "old" / "sweep", with_data=False)],
                      out=tmp_path / "r_old", n_boot=100)[0]  # fmt: skip
    assert not list(old.parent.glob("composition*"))
    for name in ("runs.csv", "targets.csv", "stats.csv", "curves_compute.csv"):
        pd.testing.assert_frame_equal(
            pd.read_csv(old.parent / name),
            pd.read_csv(new.parent / name),
        )
    text = old.read_text()
    note = [ln for ln in text.splitlines() if ln.startswith("Trained vs generated data")]
    assert note == [
        "Trained vs generated data: not drawn, no run logs the `data/*` composition keys "
        "(runs older than them)."
    ]
    # Apart from the composition section and the list of files, the summaries agree.
    head_new = new.read_text().split("## Trained vs generated data")[0]
    assert text.split("Trained vs generated data")[0] == head_new
