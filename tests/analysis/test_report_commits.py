"""The report says when its runs do not come from one clean commit (each run's config.yaml
``provenance``, read by the loader into ``commit`` / ``dirty``): one warning line naming the
commits and how many runs each, in summary.md and on the command's stderr."""

from __future__ import annotations

import json

import pytest
import yaml

from replay_exp.analysis.loader import from_records
from replay_exp.analysis.report import code_warning, main

A, B = "a" * 40, "b" * 40
ROWS = [{"step": s, "compute/paper_units": s, "compute/seconds": s, "eval/pass@1": p}
        for s, p in enumerate((0.2, 0.4, 0.5))]  # fmt: skip


def _code(commit, dirty=False, step=0):
    return {"step": step, "started": "2026-12-06 12:00:00", "commit": commit, "dirty": dirty,
            "versions": {"python": "3.11.7"}}  # fmt: skip


def _config(seed, provenance):
    cfg = {"buffer": {"name": "fifo", "capacity": 64}, "seed": seed}
    return cfg if provenance is None else {**cfg, "provenance": provenance}


def _runs(*provenances):
    records = [(f"seed={i}", f"/runs/seed={i}", _config(i, p), ROWS, "finished")
               for i, p in enumerate(provenances)]  # fmt: skip
    return from_records(records)


TAIL = ", so their results may come from different code (config.yaml: provenance)"


@pytest.mark.parametrize(
    ("provenances", "warning"),
    [
        ([[_code(A)], [_code(A)]], None),  # one clean commit
        ([None, None], None),  # none recorded (runs from before the record): nothing to compare
        (
            [[_code(A)], [_code(B)], [_code(A)]],
            f"these 3 runs do not come from one commit: {A[:12]} (2 runs), {B[:12]} (1 run)",
        ),
        (
            [[_code(A)], [_code(A, dirty=True)]],
            f"these 2 runs come from commit {A[:12]}; 1 run ran on a tree with uncommitted "
            "changes (dirty)",
        ),
        # Resumed on another commit: the run counts for both.
        (
            [[_code(A)], [_code(A), _code(B, step=5)]],
            f"these 2 runs do not come from one commit: {A[:12]} (2 runs), {B[:12]} (1 run)",
        ),
        # A commit and runs that record none (from before the record, or outside a checkout).
        (
            [[_code(A)], None, [_code(None, dirty=None)]],
            f"these 3 runs do not come from one commit: unrecorded (2 runs), {A[:12]} (1 run)",
        ),
    ],
    ids=["one_commit", "none_recorded", "two_commits", "dirty", "resumed", "unrecorded"],
)
def test_the_warning_names_the_commits_and_counts(provenances, warning):
    got = code_warning(_runs(*provenances))
    assert got == (None if warning is None else warning + TAIL)


def _sweep(root, provenances):
    for i, p in enumerate(provenances):
        run_dir = root / f"seed={i}"
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(_config(i, p), sort_keys=False))
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
        (run_dir / "summary.json").write_text(json.dumps({"status": "finished", "provenance": p}))
    return root


def test_the_report_warns_on_mixed_commits_in_its_summary_and_on_stderr(tmp_path, capsys):
    mixed = _sweep(tmp_path / "mixed", [[_code(A)], [_code(B, dirty=True)], [_code(A)]])
    main([str(mixed), "--out", str(tmp_path / "report"), "--n-boot", "20"])
    want = (f"these 3 runs do not come from one commit: {A[:12]} (2 runs), {B[:12]} (1 run); "
            f"1 run ran on a tree with uncommitted changes (dirty){TAIL}")  # fmt: skip
    err = capsys.readouterr().err
    assert f"warning: {want}\n" in err
    summary = (tmp_path / "report" / "summary.md").read_text().splitlines()
    assert summary[2] == f"**Warning: {want}**"  # under the title, before anything else
    # runs.csv names each run's commit.
    assert sorted((tmp_path / "report" / "runs.csv").read_text().count(c) for c in (A, B)) == [1, 2]
    # One clean commit: no warning.
    clean = _sweep(tmp_path / "clean", [[_code(A)], [_code(A)]])
    main([str(clean), "--out", str(tmp_path / "clean_report"), "--n-boot", "20"])
    assert "commit" not in capsys.readouterr().err
    assert "commit" not in (tmp_path / "clean_report" / "summary.md").read_text()
