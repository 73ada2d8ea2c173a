"""The tracked tree stays small enough to travel: a GPU machine this project borrows carries at
most 64 MiB of working tree, and study data is what grows. So: at most 25 MiB in git; archived
runs compressed (no loose ``.jsonl`` under ``analysis/``); each figure stored once; and every
link in the committed study summaries resolves (docs/analysis.md, "Where study data lives")."""

from __future__ import annotations

import hashlib
import re
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT_MIB = 25.0
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _tracked() -> list[Path]:
    """Every file git tracks in this checkout that is on disk (skips the test elsewhere)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    paths = [ROOT / p for p in out.stdout.decode().split("\0") if p]
    if not paths:
        pytest.skip("not a git checkout")
    return [p for p in paths if p.is_file()]  # a deletion not yet committed is gone already


def test_the_tracked_tree_is_at_most_25_mib():
    files = _tracked()
    sizes = {p: p.stat().st_size for p in files}
    total = sum(sizes.values()) / 2**20
    by_dir: Counter[str] = Counter()
    for p, s in sizes.items():
        by_dir["/".join(p.relative_to(ROOT).parts[:2])] += s
    largest = ", ".join(f"{d} {s / 2**20:.1f}" for d, s in by_dir.most_common(5))
    assert total <= LIMIT_MIB, (
        f"{total:.1f} MiB tracked (at most {LIMIT_MIB:g}); largest, MiB: {largest}. Raw runs go "
        "compressed under analysis/runs, figure data is regenerated or .csv.gz: docs/analysis.md"
    )


def test_no_loose_jsonl_under_analysis():
    loose = [
        str(p.relative_to(ROOT))
        for p in _tracked()
        if p.relative_to(ROOT).parts[0] == "analysis" and p.name.endswith(".jsonl")
    ]
    assert loose == [], (
        f"{len(loose)} uncompressed .jsonl tracked under analysis/ (first: {loose[:3]}); "
        "archive runs with python -m replay_exp.analysis.archive, which writes .jsonl.xz"
    )


def test_each_figure_is_stored_once():
    copies = defaultdict(list)
    for p in _tracked():
        if p.suffix == ".png" and p.relative_to(ROOT).parts[0] == "analysis":
            copies[hashlib.sha256(p.read_bytes()).hexdigest()].append(str(p.relative_to(ROOT)))
    same = [paths for paths in copies.values() if len(paths) > 1]
    assert same == [], f"the same figure stored more than once: {same[:3]}"


def test_study_summaries_link_to_files_that_exist():
    tracked = set(_tracked())
    broken = []
    for md in sorted(p for p in tracked if p.suffix == ".md" and "analysis" in p.parts):
        text = re.sub(r"`[^`\n]*`", "", md.read_text())  # inline code names, not links
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            dest = (md.parent / target.partition("#")[0]).resolve()
            if not (dest in tracked or dest.is_dir()):
                broken.append(f"{md.relative_to(ROOT)}: {target}")
    assert broken == [], f"{len(broken)} links to files not in the repository: {broken[:5]}"
