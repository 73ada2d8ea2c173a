"""The committed archive of study runs (replay_exp/analysis/archive.py): an archived run
(metrics and per-problem results xz-compressed) loads and compares exactly as its source does;
unfinished runs are skipped; a clash loses nothing; an archive written as gzip before the move
to xz still reads and re-archives as unchanged."""

from __future__ import annotations

import gzip
import json
import lzma
import shutil

import pandas as pd
import pytest
import yaml

from replay_exp.analysis.archive import archive, main
from replay_exp.analysis.loader import load_runs
from replay_exp.analysis.report import sweep_wall_seconds
from replay_exp.analysis.stats import compare_to_baseline
from replay_exp.runlog import read_metrics
from replay_exp.theory.bound import estimate_mu_from_run


@pytest.mark.slow
def test_an_archived_sweep_gives_the_sources_finals_peaks_and_intervals(tiny_sweeps, tmp_path):
    src = tiny_sweeps["compute"]
    done = archive([src], tmp_path / "archive")
    assert len(done["written"]) == 4 and not done["skipped"]
    copy = tmp_path / "archive" / src.name
    a, b = load_runs([src]), load_runs([copy])
    cols = ["label", "seed", "status", "commit", "dirty", "last_step", "initial", "final", "peak"]
    cols += [c for c in a.runs if c.endswith(("_at_peak", "_to_target"))]
    key = ["label", "seed"]
    pd.testing.assert_frame_equal(
        a.runs[cols].sort_values(key).reset_index(drop=True),
        b.runs[cols].sort_values(key).reset_index(drop=True),
    )
    # The verdicts (problem bootstrap inside: eval_details.jsonl kept whole) are identical.
    sa = compare_to_baseline(a, "on-policy", n_boot=200)
    sb = compare_to_baseline(b, "on-policy", n_boot=200)
    pd.testing.assert_frame_equal(sa, sb)
    # Fewer rows: only evaluations (every 2 of 4 steps: 0, 2, 4) and the last one.
    meta = json.loads(next(copy.rglob("archive.json")).read_text())
    assert meta["rows_kept"] < meta["rows_source"]
    # The sweep's wall-clock: the sources' start and finish times, not the copies' file times.
    assert sweep_wall_seconds(a) > 0
    assert sweep_wall_seconds(b) == sweep_wall_seconds(a)
    copies = {str(p.parent) for p in copy.rglob("archive.json")}
    assert set(b.runs["run_dir"]) == copies
    # Compressed: the kept rows and eval_details.jsonl read back as the source's.
    archived = next(copy.rglob("archive.json")).parent
    source = src / archived.relative_to(copy)
    assert sorted(p.name for p in archived.iterdir()) == [
        "archive.json", "buffer_telemetry.json", "config.yaml", "eval_details.jsonl.xz",
        "metrics.jsonl.xz", "summary.json",
    ]  # fmt: skip
    rows = read_metrics(source / "metrics.jsonl")
    kept = [r for i, r in enumerate(rows) if i == len(rows) - 1 or any("eval/" in k for k in r)]
    assert read_metrics(archived / "metrics.jsonl") == kept
    details = read_metrics(source / "eval_details.jsonl")
    assert read_metrics(archived / "eval_details.jsonl") == details and details
    assert estimate_mu_from_run(archived) == estimate_mu_from_run(source)  # replay-exp-theory --run
    # Archiving again changes nothing; elsewhere it gives the same bytes (xz has no time stamp).
    again = archive([src], tmp_path / "archive")
    assert len(again["unchanged"]) == 4 and not again["written"]
    archive([src], tmp_path / "other")

    def files(root):
        return {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}

    assert files(tmp_path / "archive") == files(tmp_path / "other")


def test_unfinished_runs_are_skipped_and_a_clash_writes_nothing(tiny_sweeps, tmp_path, capsys):
    src = tmp_path / "compute"
    shutil.copytree(tiny_sweeps["compute"], src)
    runs = sorted(p.parent for p in src.rglob("summary.json"))
    (runs[0] / "summary.json").unlink()  # an unfinished run
    out = tmp_path / "archive"
    assert main([str(src), "--out", str(out)]) == 0
    assert "skipped: 1" in capsys.readouterr().out
    # A different run under an archived name: an error naming it, and nothing overwritten.
    victim = out / "compute" / runs[1].relative_to(src) / "metrics.jsonl.xz"
    before = victim.read_bytes()
    with (runs[1] / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 99, "eval/pass@1": 1.0}) + "\n")
    assert main([str(src), "--out", str(out)]) == 2
    assert "differ from their sources" in capsys.readouterr().err
    assert victim.read_bytes() == before
    with pytest.raises(ValueError):
        archive([src], out)
    assert archive([src], out, force=True)["written"] == [str(victim.parent.relative_to(out))]


def test_a_gzip_archive_from_before_xz_reads_the_same_and_re_archives_as_unchanged(
    tiny_sweeps, tmp_path
):
    src = tiny_sweeps["compute"]
    archive([src], tmp_path / "xz")
    old = tmp_path / "gz"
    shutil.copytree(tmp_path / "xz", old)
    for f in list(old.rglob("*.xz")):  # the layout the archive wrote before: gzip -9
        rows = lzma.decompress(f.read_bytes())
        f.with_suffix(".gz").write_bytes(gzip.compress(rows, 9, mtime=0))
        f.unlink()
    assert not list(old.rglob("*.xz")) and list(old.rglob("metrics.jsonl.gz"))
    a, b = load_runs([tmp_path / "xz" / src.name]), load_runs([old / src.name])
    cols = ["label", "seed", "status", "final", "peak"]
    pd.testing.assert_frame_equal(
        a.runs[cols].sort_values(["label", "seed"]).reset_index(drop=True),
        b.runs[cols].sort_values(["label", "seed"]).reset_index(drop=True),
    )
    for run in (old / src.name).rglob("archive.json"):
        for name in ("metrics.jsonl", "eval_details.jsonl"):
            xz = tmp_path / "xz" / run.parent.relative_to(old) / name
            assert read_metrics(run.parent / name) == read_metrics(xz)
    # Same rows under the old compression: unchanged, nothing rewritten, no clash.
    again = archive([src], old)
    assert len(again["unchanged"]) == 4 and not again["written"]
    assert not list(old.rglob("*.xz"))


def test_an_archived_run_keeps_the_code_that_made_it(tmp_path):
    """config.yaml's and summary.json's provenance records (commit, dirty, versions; one per
    start or resume) come through the archive as they are, and the loader reads them there."""
    records = [
        {"step": 0, "started": "2026-12-06 12:00:00", "commit": "a" * 40, "dirty": False,
         "versions": {"python": "3.11.7", "torch": "2.13.0+cpu"}},
        {"step": 4, "started": "2026-12-06 13:00:00", "commit": "b" * 40, "dirty": True,
         "versions": {"python": "3.11.7", "torch": "2.13.0+cpu"}},
    ]  # fmt: skip
    run = tmp_path / "sweep" / "seed=0"
    run.mkdir(parents=True)
    config = {"buffer": {"name": "fifo"}, "seed": 0, "provenance": records}
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    rows = [{"step": s, "compute/paper_units": s, "eval/pass@1": 0.1 * s} for s in range(3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "summary.json").write_text(json.dumps({"status": "finished", "provenance": records}))
    assert archive([tmp_path / "sweep"], tmp_path / "archive")["written"] == ["sweep/seed=0"]
    copy = tmp_path / "archive" / "sweep" / "seed=0"
    assert yaml.safe_load((copy / "config.yaml").read_text())["provenance"] == records
    assert json.loads((copy / "summary.json").read_text())["provenance"] == records
    runs = load_runs(copy)
    assert runs.runs.loc[0, "commit"] == "a" * 40 + "+" + "b" * 40
    assert bool(runs.runs.loc[0, "dirty"]) is True
