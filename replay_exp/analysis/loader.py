"""From run directories (or W&B runs) to two tidy pandas tables.

``load_runs(paths)`` finds every run under ``paths`` (a sweep directory, several, or single run
directories) and returns :class:`Runs`:

- ``steps``: one row per (run, logged step). Columns: ``run`` (the run's id: its path relative
  to the loaded root), ``config`` (the values of the keys that vary across the loaded runs,
  seed excluded: runs with equal ``config`` are seeds of one configuration), ``label`` (the same
  configuration named by its meaning, e.g. "FIFO N=256, y=4"), ``seed``, ``status``, every config
  key flattened with dotted names (``buffer.capacity``, ``derived.reuse_ratio``) and every
  logged metric (``eval/pass@1``, ``compute/paper_units``, ...). A metric a row did not log is NaN
  (evaluation rows are a subset of training rows).
- ``runs``: one row per run: config columns, status, last step, final and peak values of the
  main metric, the x at which the peak happened, and the initial value.

Both tables also carry the code that made each run (config.yaml's ``provenance``:
:func:`run_code`): ``commit`` (None where the run records none) and ``dirty`` (uncommitted
changes in the tree); ``replay-exp-report`` warns when they are not one clean commit.

Partial runs load with a warning, never an error: a truncated last line of metrics.jsonl is
skipped, a missing config.yaml is replaced by the overrides spelled in the directory name
(``key=value,...,seed=S``), a run without summary.json is ``status="unfinished"`` (still going,
or interrupted and resumable), one without any metrics is ``status="empty"``.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from replay_exp.analysis.labels import config_label
from replay_exp.analysis.studies.node_time import COLUMN as NODE_COLUMN
from replay_exp.analysis.studies.node_time import modelled_node_time
from replay_exp.runlog import flatten, jsonl_file, read_metrics

# Config keys that never distinguish configurations: where the run lives and how it is logged,
# what the machine picked (threads, device), and how often it is evaluated (training does not
# depend on it: docs/findings.md, the budget study; the statistics interpolate onto the
# baseline's grid).
IGNORED_KEYS = (
    "eval.every",
    "run_dir",
    "output_root",
    "sweep_name",
    "save_final_model",
    "device",
    "threads",
    "derived.device",
    "derived.threads",
)
IGNORED_PREFIXES = ("logger.", "checkpoint.", "hydra.")
# Skipped when looking for run directories below a root.
_NOT_RUNS = {"checkpoints", "final_model", "wandb", "report", ".hydra"}

META_COLUMNS = ("run", "config", "label", "seed", "status", "commit", "dirty", "run_dir")


@dataclass
class Runs:
    """The loaded runs. ``config_keys``: the config columns that vary (seed excluded)."""

    steps: pd.DataFrame
    runs: pd.DataFrame
    config_keys: list[str]

    def __len__(self) -> int:
        return len(self.runs)


def find_run_dirs(paths: str | Path | Iterable[str | Path]) -> list[tuple[Path, Path]]:
    """(root, run_dir) for every run directory under ``paths``: a directory holding
    metrics.jsonl (or an archived run's metrics.jsonl.xz) or config.yaml. A path that is itself
    a run directory is its own root. Ordered by root (as given), then by path."""
    if isinstance(paths, str | Path):
        paths = [paths]
    out: list[tuple[Path, Path]] = []
    for root in map(Path, paths):
        if not root.is_dir():
            raise FileNotFoundError(f"no such directory: {root}")
        if _is_run(root):
            out.append((root.parent, root))
            continue
        stack = [root]
        while stack:
            d = stack.pop()
            for child in sorted(p for p in d.iterdir() if p.is_dir() and p.name not in _NOT_RUNS):
                if _is_run(child):
                    out.append((root, child))
                else:
                    stack.append(child)
    rank: dict[Path, int] = {}  # roots in the order given; runs sorted within each root
    for r, _ in out:
        rank.setdefault(r, len(rank))
    return sorted(set(out), key=lambda rr: (rank[rr[0]], str(rr[1])))


def _is_run(d: Path) -> bool:
    return jsonl_file(d / "metrics.jsonl") is not None or (d / "config.yaml").is_file()


def read_run(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """(flat config, metric rows, status) of one run directory, warning about anything
    missing or damaged."""
    config: dict[str, Any] = {}
    cfg_file = run_dir / "config.yaml"
    try:
        config = flatten(yaml.safe_load(cfg_file.read_text()) or {}, ".")
    except (OSError, yaml.YAMLError) as e:
        config = overrides_from_name(run_dir.name)
        what = "missing" if isinstance(e, OSError) else "unreadable"
        warnings.warn(
            f"{run_dir}: {what} config.yaml; config taken from the directory name "
            f"({len(config)} keys)",
            stacklevel=2,
        )
    rows: list[dict[str, Any]] = []
    if jsonl_file(run_dir / "metrics.jsonl") is not None:  # or its .xz: an archived run
        rows = read_metrics(run_dir / "metrics.jsonl")
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}
    summary = summary if isinstance(summary, dict) else {}
    finished = summary.get("status") == "finished"
    if "provenance" not in config and isinstance(summary.get("provenance"), list):
        config["provenance"] = summary["provenance"]  # config.yaml lost: summary.json's copy
    status = "finished" if finished else "unfinished" if rows else "empty"
    if status == "empty":
        warnings.warn(f"{run_dir}: no metrics logged yet", stacklevel=2)
    return config, rows, status


def overrides_from_name(name: str) -> dict[str, Any]:
    """``"buffer.capacity=256,seed=1"`` -> ``{"buffer.capacity": 256, "seed": 1}`` (values parsed
    as YAML scalars; a part without ``=`` continues the previous value, e.g. a list)."""
    out: dict[str, Any] = {}
    key = None
    for part in name.split(","):
        if "=" in part and not part.startswith(("[", "{")):
            key, value = part.split("=", 1)
            out[key] = value
        elif key is not None:
            out[key] += "," + part
    parsed = {}
    for k, v in out.items():
        try:
            parsed[k] = yaml.safe_load(v)
        except yaml.YAMLError:
            parsed[k] = v
    return parsed


def load_runs(
    paths: str | Path | Iterable[str | Path],
    metric: str = "eval/pass@1",
    x: str = "compute",
) -> Runs:
    """Every run under ``paths`` as tidy tables (see the module docstring). A path
    ``wandb:entity/project`` reads that W&B project through the public API instead
    (:mod:`replay_exp.analysis.wandb_runs`). ``metric`` and ``x`` choose the main metric and
    x-axis of the per-run table (peak value and where it happened)."""
    if isinstance(paths, str | Path):
        paths = [paths]
    paths = list(paths)
    records = []
    for p in paths:
        if str(p).startswith("wandb:"):
            from replay_exp.analysis.wandb_runs import wandb_records

            records += wandb_records(str(p).removeprefix("wandb:"))
    local = [p for p in paths if not str(p).startswith("wandb:")]
    found = find_run_dirs(local) if local else []
    # A run's id is its path under the sweep directory it was found in; two sweeps that both
    # hold e.g. seed=5/ would share it (and their curves would be merged into one run), so then
    # every id is qualified by its sweep directory's name.
    ids = [str(run_dir.relative_to(root)) for root, run_dir in found]
    if len(set(ids)) < len(ids):
        ids = [f"{root.name}/{i}" for (root, _), i in zip(found, ids, strict=True)]
        if len(set(ids)) < len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(
                f"two runs share the id {dup[0]}: pass sweep directories with different names"
            )
    for (_, run_dir), run_id in zip(found, ids, strict=True):
        config, rows, status = read_run(run_dir)
        records.append((run_id, run_dir, config, rows, status))
    if not records:
        where = ", ".join(map(str, paths))
        raise FileNotFoundError(
            f"no runs (directories with metrics.jsonl or config.yaml) in {where}"
        )
    return from_records(records, metric=metric, x=x)


def from_records(
    records: Sequence[tuple[str, Path | str, dict[str, Any], list[dict[str, Any]], str]],
    metric: str = "eval/pass@1",
    x: str = "compute",
) -> Runs:
    """Build :class:`Runs` from ``(run id, location, flat config, metric rows, status)`` records:
    the common path of run directories and of W&B runs."""
    codes = [run_code(cfg) for _, _, cfg, _, _ in records]
    configs = [_plain({k: v for k, v in cfg.items() if not _is_provenance(k)})
               for _, _, cfg, _, _ in records]  # fmt: skip
    keys = varying_keys(configs)
    names = [",".join(f"{k}={cfg.get(k)}" for k in keys) or "all" for cfg in configs]
    per_run, step_frames = [], []
    for i in _one_per_seed(records, names, configs):
        (run_id, where, _, rows, status), cfg = records[i], configs[i]
        meta = {
            "run": run_id,
            "config": names[i],
            "label": config_label(cfg, keys),
            "seed": cfg.get("seed"),
            "status": status,
            "commit": codes[i][0],
            "dirty": codes[i][1],
            "run_dir": str(where),
        }
        # meta wins: run_dir is where the run was found, not the one its config names (an
        # archived copy's config still names runs/...); eval_details.jsonl is read from here.
        row = {**meta, **{k: v for k, v in cfg.items() if k not in meta}}
        per_run.append(row)
        if rows:
            frame = pd.DataFrame(rows)
            if x == "node":  # in process: a modelled node clock (analysis/node_time.py)
                frame = with_node_time(frame, cfg)
            # The run's columns first, built at once (column-by-column inserts fragment).
            const = pd.DataFrame({k: [v] * len(frame) for k, v in row.items()}, index=frame.index)
            frame = pd.concat([const, frame], axis=1)
            step_frames.append(frame)
    # Order: configurations by their key values (numbers numerically, the on-policy baseline
    # first), then seed; groupby(sort=False) downstream keeps this order in tables and legends.
    runs = pd.DataFrame(per_run)
    rank = {c: i for i, c in enumerate(_config_order(runs, keys))}
    runs = _sorted(runs, rank)
    steps = pd.concat(step_frames, ignore_index=True) if step_frames else pd.DataFrame()
    if "step" in steps:
        steps = _sorted(steps, rank, extra=["step"])
    runs = runs.merge(run_summary(steps, metric, x), on="run", how="left")
    return Runs(steps=steps, runs=runs, config_keys=keys)


def run_code(config: dict[str, Any]) -> tuple[str | None, bool | None]:
    """(commit, dirty) of a run from its flat config: config.yaml's ``provenance`` records (one
    per start or resume; ``replay_exp.rundir.record_provenance``) or a W&B run's
    ``provenance.commit`` / ``provenance.dirty``. ``commit``: the commit, or the distinct ones
    joined by ``+`` when parts of the run came from different commits; None when none is known
    (a run from before the record, or from outside a git checkout). ``dirty``: whether any part
    ran on a tree with uncommitted changes; None when unknown."""
    records = config.get("provenance")
    if not isinstance(records, list):
        records = [{"commit": config.get("provenance.commit"),
                    "dirty": config.get("provenance.dirty")}]  # fmt: skip
    records = [r for r in records if isinstance(r, dict)]
    commits = list(dict.fromkeys(r["commit"] for r in records if r.get("commit")))
    flags = [r.get("dirty") for r in records if r.get("commit")]
    dirty = True if any(flags) else False if flags and len(flags) == len(records) else None
    return ("+".join(commits) or None), dirty


def _is_provenance(key: str) -> bool:
    return key == "provenance" or key.startswith("provenance.")


def _one_per_seed(records: Sequence[tuple], names: list[str], configs: list[dict]) -> list[int]:
    """Indices of the records to keep: one per (configuration, seed). The same configuration
    reached through two sweeps (``experiment=replay_reuse4`` in one, ``buffer.capacity=512``
    at y = 4 in another) is one experiment, not two seeds: training is deterministic. The first
    in the order given (the sweep named first) is kept, with a warning naming the other."""
    keep, seen = [], {}
    for i in range(len(records)):
        seed = configs[i].get("seed")
        key = (names[i], repr(seed))
        if seed is not None and key in seen:
            warnings.warn(
                f"{records[i][1]}: the same configuration and seed as {seen[key]}; "
                "counted once (that one kept)",
                stacklevel=3,
            )
            continue
        seen[key] = records[i][1]
        keep.append(i)
    return keep


def with_node_time(frame: pd.DataFrame, cfg: dict[str, Any]) -> pd.DataFrame:
    """``frame`` with ``runtime/node_time`` modelled where the run did not log one (an
    in-process run; :func:`replay_exp.analysis.studies.node_time.modelled_node_time`)."""
    if "step" not in frame:
        return frame
    if NODE_COLUMN in frame and frame[NODE_COLUMN].notna().any():  # measured by the run itself
        # step 0 is the clock's origin: its evaluation row is logged before any step and
        # carries no runtime metrics, and a NaN there would leave peaks undefined
        at_start = (frame["step"] == 0) & frame[NODE_COLUMN].isna()
        return frame.assign(**{NODE_COLUMN: frame[NODE_COLUMN].mask(at_start, 0.0)})
    if cfg.get("runtime.name") == "distributed":
        return frame  # NaN throughout: a run before the node clock
    return frame.assign(**{NODE_COLUMN: modelled_node_time(cfg, frame["step"].to_numpy())})


def varying_keys(configs: Sequence[dict[str, Any]]) -> list[str]:
    """Config keys whose value differs between the runs that have them (seed, paths, logging
    and ``derived.*`` consequences of other keys excluded), sorted."""
    all_keys = sorted({k for c in configs for k in c})
    out = []
    for k in all_keys:
        if k == "seed" or k in IGNORED_KEYS or k.startswith(IGNORED_PREFIXES):
            continue
        if k.startswith("derived."):
            continue
        if len({repr(c[k]) for c in configs if k in c}) > 1:  # a lost config.yaml: no vote
            out.append(k)
    return out


def run_summary(
    steps: pd.DataFrame, metric: str, x: str, target: float | None = None, frac: float = 0.98
) -> pd.DataFrame:
    """One row per run: last step, initial / final / peak ``metric``, the ``x`` of the peak and
    the ``x`` needed to reach ``target`` (default: ``frac`` x the best peak of all runs; inf if
    never reached; see :mod:`replay_exp.analysis.curves` for the interpolation rule)."""
    from replay_exp.analysis.curves import compute_to_target, x_column

    cols = ["run", "last_step", "initial", "final", "peak", f"{x}_at_peak", f"{x}_to_target"]
    if steps.empty or metric not in steps:
        return pd.DataFrame({"run": steps["run"].unique() if "run" in steps else []}).reindex(
            columns=cols
        )
    xcol = x_column(x)
    if target is None:
        target = frac * steps[metric].max()
    out = []
    for run, g in steps.groupby("run", sort=False):
        evals = g.dropna(subset=[metric])
        row = {"run": run, "last_step": g["step"].max()}
        if len(evals):
            i = evals[metric].to_numpy().argmax()
            row.update(
                initial=evals[metric].iloc[0],
                final=evals[metric].iloc[-1],
                peak=evals[metric].iloc[i],
            )
            row[f"{x}_at_peak"] = evals[xcol].iloc[i] if xcol in evals else math.nan
            if xcol in evals:
                xs, ys = evals[xcol].to_numpy(), evals[metric].to_numpy()
                row[f"{x}_to_target"] = compute_to_target(xs, ys, target)
        out.append(row)
    return pd.DataFrame(out).reindex(columns=cols)


def _config_order(runs: pd.DataFrame, keys: list[str]) -> list[str]:
    """Configurations in display order: the on-policy baseline first, then by the values of
    the varying keys (numbers numerically, before strings)."""

    def value_key(v: Any) -> tuple:
        if isinstance(v, int | float) and not (isinstance(v, float) and math.isnan(v)):
            return (0, v, "")
        return (1, 0, str(v))

    def sort_key(row: pd.Series) -> tuple:
        return (row.get("buffer.name") != "on_policy", *(value_key(row.get(k)) for k in keys))

    table = runs.drop_duplicates("config")
    return [r["config"] for r in sorted((r for _, r in table.iterrows()), key=sort_key)]


def _sorted(frame: pd.DataFrame, rank: dict[str, int], extra: Sequence[str] = ()) -> pd.DataFrame:
    seed = frame["seed"].fillna(-1) if frame["seed"].notna().any() else 0
    # Sort a small key frame, not the wide one: every string column is its own pandas block,
    # and adding columns to a frame of hundreds of blocks raises a PerformanceWarning.
    keys = frame[["run", *extra]].assign(_rank=frame["config"].map(rank), _seed=seed)
    order = keys.sort_values(["_rank", "_seed", "run", *extra], kind="stable").index
    return frame.loc[order].reset_index(drop=True)


def _plain(cfg: dict[str, Any]) -> dict[str, Any]:
    """Hashable, comparable values: lists become their string form."""
    return {k: (str(v) if isinstance(v, list | dict | tuple) else v) for k, v in cfg.items()}
