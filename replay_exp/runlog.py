"""Run-directory logging: ``metrics.jsonl`` is the source of truth.

The trainer talks to one logger (:func:`make_logger`): ``log(row)``, ``log_histograms(step,
telemetry)`` at each evaluation, ``close(summary)``. ``logger=jsonl`` writes metrics.jsonl only;
``logger=wandb`` writes it too and mirrors rows, buffer histograms, config and summary to W&B.

Each row is written with one ``os.write`` on a file opened with O_APPEND, so a run killed
mid-write leaves at most one truncated last line; :func:`read_metrics` skips such a line with a
warning instead of failing. It also reads an archived run's compressed copy (``metrics.jsonl.xz``,
``eval_details.jsonl.xz``: :mod:`replay_exp.analysis.archive`; ``.gz`` in archives written before
it moved to xz) where the plain file is absent (:func:`jsonl_file`).

Every run records the code that made it (:func:`code_provenance`): the git commit of the
package's checkout and whether the tree was dirty (null, with the reason, outside a checkout),
and the versions of Python and the main packages. ``replay_exp.rundir.record_provenance`` adds
one record per start or resume to config.yaml; summary.json and the W&B run carry them too.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import json
import logging
import lzma
import math
import os
import platform
import subprocess
import warnings
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger("replay_exp")

# The rows a run appends to its directory: metrics (the source of truth) and the per-problem
# evaluation details. A snapshot covers them (fsynced before it is committed); a resume cuts
# them back to its step, a fresh start removes them.
LOG_FILES = ("metrics.jsonl", "eval_details.jsonl")


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN/inf; null keeps the file readable everywhere
    return v


class MetricsWriter:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, row: dict[str, Any]) -> None:
        line = json.dumps({k: _clean(v) for k, v in row.items()}, sort_keys=False) + "\n"
        os.write(self._fd, line.encode())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


# An archived copy of a run's rows: xz (what replay_exp.analysis.archive writes), or gzip (what
# it wrote before; still read).
COMPRESSED_OPENERS = {".xz": lzma.open, ".gz": gzip.open}


def jsonl_file(path: str | Path) -> Path | None:
    """The file holding the rows of ``path`` (a run's ``metrics.jsonl`` or
    ``eval_details.jsonl``): ``path`` itself, else its compressed copy ``<path>.xz`` or
    ``<path>.gz`` (how archived runs keep them), else None."""
    path = Path(path)
    for found in (path, *(path.with_name(path.name + s) for s in COMPRESSED_OPENERS)):
        if found.is_file():
            return found
    return None


def open_text(path: str | Path):
    """``path`` opened for reading text, decompressed when it is a ``.xz`` or ``.gz`` file."""
    path = Path(path)
    opener = COMPRESSED_OPENERS.get(path.suffix)
    return opener(path, "rt") if opener else open(path)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All complete rows of a metrics.jsonl (or of its compressed copy: :func:`jsonl_file`); a
    truncated or corrupt line is skipped with a warning."""
    found = jsonl_file(path)
    if found is None:
        raise FileNotFoundError(f"no such file: {path} (nor a compressed copy {path}.xz/.gz)")
    path = found
    rows = []
    with open_text(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                warnings.warn(f"{path}:{i}: skipping a truncated or corrupt line", stacklevel=2)
    return rows


# ---------------------------------------------------------------------------------------------
# Loggers: what the trainer calls. metrics.jsonl is always written; W&B mirrors it.
# ---------------------------------------------------------------------------------------------

TELEMETRY_EDGES = list(range(66))  # bins 0..63, then the overflow bin drawn as [64, 65)


class JsonlLogger:
    """``logger=jsonl``: rows go to ``run_dir/metrics.jsonl``; histograms already live in
    ``buffer_telemetry.json``, so :meth:`log_histograms` does nothing."""

    def __init__(self, run_dir: str | Path):
        self.writer = MetricsWriter(Path(run_dir) / "metrics.jsonl")

    def log(self, row: dict[str, Any]) -> None:
        """One metrics row; ``row["step"]`` is its step."""
        self.writer.write(row)

    def log_histograms(self, step: int, telemetry: dict[str, list[int]]) -> None:
        """The buffer's cumulative bin counts (bins 0..63 + overflow) at an evaluation."""

    def close(self, summary: dict[str, Any] | None = None) -> None:
        self.writer.close()


class WandbLogger(JsonlLogger):
    """``logger=wandb``: everything :class:`JsonlLogger` writes, mirrored to a W&B run.

    The W&B run lives in ``run_dir/wandb`` and its id is derived from the run directory, so a
    resumed run continues the same W&B run. Any W&B failure (import, init, log, finish) logs
    one warning and turns W&B off for the rest of the run; metrics.jsonl carries on.
    """

    def __init__(self, cfg: Any, run_dir: str | Path, config: dict[str, Any]):
        """``cfg`` is the ``logger.wandb`` node."""
        super().__init__(run_dir)
        self.run = None
        run_dir = Path(run_dir)
        try:
            import wandb

            self._wandb = wandb
            # this start's (or resume's) record of the code: provenance.commit, .dirty, ...
            recorded = read_provenance(run_dir)
            config = {**config, "provenance": recorded[-1] if recorded else code_provenance()}
            self.run = wandb.init(
                project=cfg.project,
                entity=cfg.entity,
                group=cfg.group if cfg.group is not None else sweep_name(run_dir),
                name=cfg.name if cfg.name is not None else run_dir.name,
                tags=list(cfg.tags),
                mode=cfg.mode,
                dir=str(run_dir),
                id=wandb_run_id(run_dir),
                resume="allow",
                config=flatten(config, "."),
            )
        except Exception as e:  # W&B must never stop training
            self._disable("init", e)

    def log(self, row: dict[str, Any]) -> None:
        super().log(row)
        if self.run is not None:
            try:
                self.run.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])
            except Exception as e:
                self._disable("log", e)

    def log_histograms(self, step: int, telemetry: dict[str, list[int]]) -> None:
        if self.run is None:
            return
        try:
            hists = {
                f"buffer_telemetry/{name}": self._wandb.Histogram(
                    np_histogram=(list(counts), TELEMETRY_EDGES[: len(counts) + 1])
                )
                for name, counts in telemetry.items()
            }
            self.run.log(hists, step=step)
        except Exception as e:
            self._disable("log_histograms", e)

    def close(self, summary: dict[str, Any] | None = None) -> None:
        super().close()
        if self.run is None:
            return
        try:
            if summary:
                self.run.summary.update(flatten(summary, "/"))
            self.run.finish()
        except Exception as e:
            self._disable("finish", e)
        self.run = None

    def _disable(self, what: str, e: Exception) -> None:
        msg = " ".join(f"{type(e).__name__}: {e}".split())  # one line
        log.warning(
            "W&B %s failed (%s); W&B is off for the rest of this run, metrics.jsonl continues",
            what,
            msg,
        )
        run, self.run = self.run, None
        if run is not None:
            with contextlib.suppress(Exception):  # already off; nothing more to do
                run.finish(exit_code=1)


LOGGERS = {"jsonl": JsonlLogger, "wandb": WandbLogger}
WANDB_MODES = ("online", "offline", "disabled")


def make_logger(cfg: Any, run_dir: str | Path, config: dict[str, Any]) -> JsonlLogger:
    """The logger named by ``cfg.logger.name`` for ``run_dir``; ``config`` is the resolved
    config (with ``derived``), sent to W&B as flat dotted keys (``buffer.capacity``)."""
    if cfg.logger.name == "wandb":
        return WandbLogger(cfg.logger.wandb, run_dir, config)
    return JsonlLogger(run_dir)


def wandb_run_id(run_dir: str | Path) -> str:
    """A stable W&B run id: a hash of the run directory's absolute path."""
    path = str(Path(run_dir).expanduser().resolve())
    return hashlib.sha1(path.encode()).hexdigest()[:16]


def in_multirun() -> bool:
    """Whether this process runs a job of a Hydra multirun (``-m``)."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.initialized() and str(HydraConfig.get().mode) == "RunMode.MULTIRUN"


def sweep_name(run_dir: str | Path) -> str | None:
    """The sweep's folder (the parent of ``run_dir``) inside a Hydra multirun, else None."""
    if not in_multirun():
        return None
    return Path(run_dir).expanduser().resolve().parent.name


def flatten(d: dict[str, Any], sep: str, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (with ``sep="."``); lists stay values."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{sep}{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flatten(v, sep, key))
        else:
            out[key] = v
    return out


def prefixed(prefix: str, d: dict[str, Any]) -> dict[str, Any]:
    """``{k: v}`` -> ``{"prefix/k": v}``."""
    return {f"{prefix}/{k}": v for k, v in d.items()}


def update_metrics(stats: dict[str, Any]) -> dict[str, Any]:
    """A policy update's stats as row keys: ``loss/*``, and the diagnostics ``diag/*`` as
    they are (without their timing, which is not a metric)."""
    out = prefixed("loss", {k: v for k, v in stats.items() if not k.startswith("diag/")})
    out.update({k: v for k, v in stats.items() if k.startswith("diag/") and k != "diag/seconds"})
    return out


def format_eval(metrics: dict[str, float]) -> str:
    """The key eval metrics on one console line."""
    keys = ["eval/pass@1", "eval/pass@8_sampled", "eval/sample_reward", "eval/entropy"]
    return "  ".join(f"{k.removeprefix('eval/')} {metrics[k]:.3f}" for k in keys if k in metrics)


def write_telemetry(run_dir: str | Path, step: int, telemetry: dict, logger=None) -> None:
    """``buffer_telemetry.json``: a buffer's cumulative per-use histograms (off-policiness,
    age, previous uses, steps since last use, replay count; the paper's Figure 2) up to
    ``step``, rewritten atomically at every evaluation (and sent to ``logger``, if given)."""
    # Here, not at the top: replay_exp.checkpoint imports torch, and the analysis reads
    # metrics through this module without it (tests/test_layering.py).
    from replay_exp.checkpoint import atomic_write_text

    payload = {"step": step, "bins": "0..63 then one overflow bin", **telemetry}
    atomic_write_text(Path(run_dir) / "buffer_telemetry.json", json.dumps(payload))
    if logger is not None:
        logger.log_histograms(step, telemetry)


# ---------------------------------------------------------------------------------------------
# Provenance: the code that made a run (config.yaml, summary.json and W&B record it).
# ---------------------------------------------------------------------------------------------

# The distributions whose versions every run records (null where one is missing), then the
# optional ones, recorded only where installed.
VERSIONED = ("replay-exp", "torch", "transformers", "tokenizers", "hydra-core", "omegaconf",
             "numpy")  # fmt: skip
VERSIONED_IF_INSTALLED = ("vllm", "reasoning-gym", "gguf", "accelerate")
GIT_TIMEOUT_S = 10.0


def _git(where: Path, *args: str) -> str:
    """The stdout of ``git -C where args...``; RuntimeError with one line when git fails, is
    missing or takes longer than ``GIT_TIMEOUT_S``. Never takes the index lock (a status that
    refreshes the index could race a commit in the same checkout)."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}
    try:
        out = subprocess.run(
            ["git", "-C", str(where), *args],
            capture_output=True, text=True, timeout=GIT_TIMEOUT_S, env=env, check=False,
        )  # fmt: skip
    except FileNotFoundError:
        raise RuntimeError("git not found") from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"git {args[0]} took over {GIT_TIMEOUT_S:g} s") from None
    except OSError as e:
        raise RuntimeError(f"git could not run: {e}") from None
    if out.returncode != 0:
        first = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[0]
        raise RuntimeError(f"git {args[0]}: {first}")
    return out.stdout


def git_state(where: str | Path) -> dict[str, Any]:
    """``{"commit", "dirty"}`` of the git checkout that tracks the directory ``where``: HEAD's
    hash, and whether ``git status --porcelain`` lists anything (a modified, staged, deleted or
    untracked file anywhere in the checkout). Where ``where`` is no tracked part of a checkout
    (an installed wheel, even one inside a repository's ignored ``.venv``), or git is missing or
    fails: both None and ``"git"`` says why. Never raises."""
    where = Path(where)
    try:
        commit = _git(where, "rev-parse", "--verify", "HEAD").strip()
        if not _git(where, "ls-files", "--", ".").strip():
            raise RuntimeError(f"{where} is not tracked by the git checkout around it")
        dirty = bool(_git(where, "status", "--porcelain").strip())
    except RuntimeError as e:
        return {"commit": None, "dirty": None, "git": f"no commit recorded: {e}"}
    return {"commit": commit, "dirty": dirty}


def package_versions() -> dict[str, str | None]:
    """Python's version and the installed versions of :data:`VERSIONED` (None: not installed)
    and of those of :data:`VERSIONED_IF_INSTALLED` that are, by their distribution metadata
    (nothing is imported)."""
    from importlib import metadata

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    out: dict[str, str | None] = {"python": platform.python_version()}
    out.update({name: version(name) for name in VERSIONED})
    out.update({n: v for n in VERSIONED_IF_INSTALLED if (v := version(n)) is not None})
    return out


@functools.cache
def code_provenance() -> dict[str, Any]:
    """The code this process runs: :func:`git_state` of the package's source directory and
    :func:`package_versions`. Taken once per process (the code a process imported does not
    change under it; a later edit of the checkout is not what it runs)."""
    return {**git_state(Path(__file__).resolve().parent), "versions": package_versions()}


def read_provenance(run_dir: str | Path) -> list[dict[str, Any]]:
    """The provenance records of ``run_dir``'s config.yaml (``provenance:``, one per start or
    resume, oldest first; ``replay_exp.rundir.record_provenance``), [] if it has none."""
    try:
        saved = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return []
    records = saved.get("provenance") if isinstance(saved, dict) else None
    return [r for r in records if isinstance(r, dict)] if isinstance(records, list) else []
