"""The committed studies rebuild from the repository alone: ``replay-exp-report`` over the
archived runs in ``analysis/runs/`` (metrics and per-problem results xz-compressed,
``replay_exp/analysis/archive.py``) gives the committed ``analysis/results/<study>/summary.md``,
number for number. Three studies: a two-sweep report against the on-policy baseline, a
one-sweep report against a named baseline and a slim three-sweep report with a margin."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from replay_exp.analysis.report import make_report

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "analysis" / "runs"
# study -> (archived sweeps, report options): the report command in the sweep's header
# (sweeps/<study>.yaml), on the archived copies of its runs.
STUDIES = {
    "finding1_stage2_tiny": (["finding1_stage2_onpolicy_tiny", "finding1_stage2_tiny"], {}),
    "finding5_confirm_tiny": (["finding5_confirm_tiny"], {"reference": "sync every 1"}),
    # A --slim report with an equivalence margin and a controller's table.
    "controller_verdict_tiny": (
        [
            "controller_verdict_onpolicy_tiny",
            "controller_verdict_fixed_tiny",
            "controller_verdict_tiny",
        ],
        {"margin": 0.015},
    ),
}


def _tables(summary: str) -> dict[str, list[str]]:
    """Each markdown table of a summary, by its header: the rows under it."""
    tables: dict[str, list[str]] = {}
    header = None
    for line in summary.splitlines():
        if not line.startswith("|"):
            header = None
        elif header is None:
            header = line
            tables[header] = []
        elif not line.startswith("|---"):
            tables[header].append(line)
    return tables


@pytest.mark.parametrize("study", STUDIES)
def test_the_archived_runs_give_the_committed_summary(study, tmp_path):
    sweeps, options = STUDIES[study]
    if not all((RUNS / s).is_dir() for s in sweeps):
        pytest.skip("not in a checkout with analysis/runs")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary, _ = make_report([RUNS / s for s in sweeps], out=tmp_path, **options)
    new = summary.read_text().partition("\n## Files\n")[0]
    committed = (ROOT / "analysis" / "results" / study / "summary.md").read_text()
    committed = committed.partition("\n## Files\n")[0]
    # The key numbers first, so that a failure names the table that moved: per configuration
    # peak / final / drawdown / compute to target, and against the baseline the final, peak,
    # saving and stability differences with their 95 % intervals, verdicts and MDEs.
    old_tables, new_tables = _tables(committed), _tables(new)
    finals = next(h for h in old_tables if h.startswith("| configuration | seeds | peak |"))
    intervals = next(h for h in old_tables if h.startswith("| configuration | seeds (paired) |"))
    assert new_tables[finals] == old_tables[finals]
    assert new_tables[intervals] == old_tables[intervals]
    assert len(old_tables[intervals]) >= 1
    # Then everything above the list of files (wall-clock from archive.json included).
    assert new == committed
