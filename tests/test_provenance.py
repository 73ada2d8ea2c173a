"""Every run records the code that made it (replay_exp/runlog.py, ``code_provenance``): the git
commit of the package's checkout, whether the tree was dirty (null, with the reason, outside a
checkout or without git) and the package versions, in config.yaml (one record per start or
resume: ``rundir.record_provenance``) and summary.json; a resume with other code still
resumes, and adds its own record."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from replay_exp import runlog
from replay_exp.analysis.loader import load_runs
from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.runlog import git_state, package_versions, read_metrics, read_provenance
from replay_exp.train import run

PACKAGE = Path(runlog.__file__).resolve().parent


def _git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git checkout with one commit: pkg/__init__.py tracked, .venv/ ignored."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("x = 1\n")
    (repo / ".gitignore").write_text(".venv/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "one")
    return repo


def test_a_clean_checkout_records_its_commit_and_a_change_makes_it_dirty(repo):
    head = _git(repo, "rev-parse", "HEAD").strip()
    assert len(head) == 40
    assert git_state(repo / "pkg") == {"commit": head, "dirty": False}
    (repo / "pkg" / "__init__.py").write_text("x = 2\n")  # a modified tracked file
    assert git_state(repo / "pkg") == {"commit": head, "dirty": True}
    _git(repo, "commit", "-q", "-am", "two")
    new = _git(repo, "rev-parse", "HEAD").strip()
    assert new != head and git_state(repo / "pkg") == {"commit": new, "dirty": False}
    (repo / "notes.txt").write_text("a new file, outside the package\n")  # untracked
    assert git_state(repo / "pkg") == {"commit": new, "dirty": True}
    (repo / "notes.txt").unlink()
    (repo / ".venv").mkdir()
    (repo / ".venv" / "ignored.py").write_text("")  # ignored: not a change
    assert git_state(repo / "pkg")["dirty"] is False


def test_no_commit_outside_a_checkout_or_without_git(repo, tmp_path, monkeypatch):
    plain = tmp_path / "plain"
    plain.mkdir()
    got = git_state(plain)
    assert got["commit"] is None and got["dirty"] is None
    assert got["git"].startswith("no commit recorded: git rev-parse: ")
    assert "not a git repository" in got["git"]
    # An installed copy inside a checkout's ignored .venv: the checkout's HEAD is not its code.
    wheel = repo / ".venv" / "site-packages" / "pkg"
    wheel.mkdir(parents=True)
    (wheel / "__init__.py").write_text("x = 1\n")
    got = git_state(wheel)
    assert got["commit"] is None and "not tracked by the git checkout" in got["git"]
    # A checkout without a commit yet.
    empty = tmp_path / "empty"
    empty.mkdir()
    _git(empty, "init", "-q")
    assert git_state(empty)["commit"] is None
    # git missing, and git hanging: null, with the reason; never an error.
    monkeypatch.setenv("PATH", str(tmp_path / "no-such-bin"))
    assert git_state(repo / "pkg") == {
        "commit": None,
        "dirty": None,
        "git": "no commit recorded: git not found",
    }
    slow = tmp_path / "slow-bin"
    slow.mkdir()
    (slow / "git").write_text(f"#!{sys.executable}\nimport time\ntime.sleep(30)\n")
    (slow / "git").chmod(0o755)
    monkeypatch.setenv("PATH", str(slow))
    monkeypatch.setattr(runlog, "GIT_TIMEOUT_S", 0.2)
    got = git_state(repo / "pkg")
    assert got["commit"] is None
    assert got["git"] == "no commit recorded: git rev-parse took over 0.2 s"


def test_versions_are_read_from_the_metadata_without_importing_anything(monkeypatch):
    got = package_versions()
    assert got["python"] == platform.python_version()
    assert got["torch"] == torch.__version__ and got["replay-exp"] == "0.1.0"
    assert {"transformers", "tokenizers", "hydra-core", "numpy"} <= set(got)
    assert None not in got.values()  # all installed here
    monkeypatch.setattr(runlog, "VERSIONED", ("numpy", "no-such-distribution"))
    monkeypatch.setattr(runlog, "VERSIONED_IF_INSTALLED", ("hydra-core", "no-such-optional"))
    got = package_versions()
    assert got.keys() == {"python", "numpy", "no-such-distribution", "hydra-core"}
    assert got["no-such-distribution"] is None  # a required one missing: null
    # The analysis records nothing but reads runlog: it must not load torch through it.
    code = "import sys, replay_exp.runlog as r; r.code_provenance(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def _expected_code() -> dict:
    """The project's own git state, asked here without the package's helper: a checkout's
    HEAD and ``git status --porcelain``; None outside one (an installed wheel)."""
    try:
        head = _git(PACKAGE, "rev-parse", "HEAD").strip()
        tracked = _git(PACKAGE, "ls-files", "--", ".").strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return {"commit": None, "dirty": None}
    if not tracked:
        return {"commit": None, "dirty": None}
    return {"commit": head, "dirty": bool(_git(PACKAGE, "status", "--porcelain").strip())}


def _run(overrides: list[str], run_dir: Path) -> dict:
    cfg, derived = resolve(compose([*overrides, f"run_dir={run_dir}"]))
    return run(cfg, derived, run_dir)


@pytest.mark.slow
def test_a_run_records_its_code_in_config_and_summary(fast, tmp_path):
    run_dir = tmp_path / "run"
    summary = _run([*fast, "schedule.max_steps=1", "save_final_model=false"], run_dir)
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    (record,) = saved["provenance"]  # the last key of config.yaml: one record, the start's
    assert list(saved)[-1] == "provenance"
    assert record["step"] == 0 and record["started"]
    want = _expected_code()
    assert record["commit"] == want["commit"] and record["dirty"] == want["dirty"]
    assert record["versions"]["torch"] == torch.__version__
    assert record["versions"]["python"] == platform.python_version()
    assert record["versions"]["replay-exp"] == "0.1.0"
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert summary["provenance"] == on_disk["provenance"] == [record]
    # The analysis exposes it per run, and it is no configuration key.
    runs = load_runs(run_dir)
    assert runs.runs.loc[0, "commit"] == want["commit"]
    assert runs.runs.loc[0, "dirty"] == want["dirty"]
    assert not any(c.startswith("provenance") for c in runs.runs.columns)


@pytest.mark.slow
def test_a_resume_with_other_code_resumes_and_adds_its_record(fast, tmp_path):
    """A run whose first part came from another commit and other versions (written into its
    config.yaml here) resumes from its snapshot; config.yaml then holds both records, oldest
    first, with its file time kept, and summary.json the same list."""
    run_dir = tmp_path / "run"
    over = [*fast, "schedule.max_steps=2", "checkpoint.every=1", "save_final_model=false"]
    _run(over, run_dir)
    # Unfinish it at step 1: drop the summary and the step-2 snapshot.
    (run_dir / "summary.json").unlink()
    shutil.rmtree(run_dir / "checkpoints" / "step_000002")
    (run_dir / "checkpoints" / "latest").unlink(missing_ok=True)
    path = run_dir / "config.yaml"
    saved = yaml.safe_load(path.read_text())
    old = {**saved["provenance"][0], "commit": "a" * 40, "dirty": False}
    old["versions"] = {**old["versions"], "torch": "1.0.0"}
    head = path.read_text().rpartition("\nprovenance:\n")[0]
    path.write_text(head + "\n" + yaml.safe_dump({"provenance": [old]}, sort_keys=False))
    os.utime(path, (1_000_000_000, 1_000_000_000))

    summary = _run(over, run_dir)
    assert summary["status"] == "finished"
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [0, 1, 2]
    first, resumed = read_provenance(run_dir)
    assert first == old
    want = _expected_code()
    assert resumed["step"] == 1 and resumed["commit"] == want["commit"]  # from the snapshot
    assert resumed["versions"]["torch"] == torch.__version__
    assert json.loads((run_dir / "summary.json").read_text())["provenance"] == [first, resumed]
    assert path.stat().st_mtime == 1_000_000_000  # when the run started
    log = (run_dir / "train.log").read_text()
    assert "its steps come from more than one version of the code" in log
    # The loader names both commits of the run.
    runs = load_runs(run_dir)
    assert runs.runs.loc[0, "commit"] == "+".join(c for c in ("a" * 40, want["commit"]) if c)
