"""Snapshots of a run for automatic resume: atomic, checksummed, weights-only.

Layout under ``run_dir/checkpoints/``::

    step_000050/          the state after 50 updates
        <name>.pt         one ``torch.save`` of each component's ``state_dict()``
        meta.json         step, the trainer's JSON state (eval dicts), and a manifest
                          {file: {bytes, sha256}} of the .pt files
    latest                the name of the newest committed snapshot, e.g. "step_000050"
    .tmp_*                a snapshot being written; never read, removed by the next save

A component is anything with ``state_dict()`` / ``load_state_dict(state)`` (modules, optimizers,
buffers, the ledger, :class:`RNGState`, :class:`GeneratorState`, ...), registered by name with
a :class:`Checkpointer`. A run's snapshot has the same components in both runtimes
(:data:`RUN_LAYOUT`, written and read by :class:`RunSnapshots`): ``policy.pt``,
``optimizer.pt``, ``buffers.pt``, ``ledgers.pt`` and ``source.pt``; meta.json's trainer state
holds the eval dicts and the runtime's counters.

Write (:meth:`Checkpointer.save`): every file goes into a fresh temp dir inside ``checkpoints/``
and is fsynced, then the dir is renamed to ``step_XXXXXX`` and ``latest`` is replaced
(write-then-rename): a snapshot exists completely or not at all, and it is committed when
``latest`` names it. Older snapshots beyond ``keep`` are then deleted.

Read (:func:`load_latest`): the snapshot ``latest`` names, then every other ``step_*`` dir,
newest first. The first whose meta.json parses and whose every file matches its manifest and
loads with ``torch.load(weights_only=True)`` wins; each bad one is reported with a
:class:`SnapshotWarning` naming the bad file. If snapshots exist but none is good,
:class:`CheckpointError` names them all: a run never silently restarts over its results.

Formats are safe to load: tensors and plain containers through ``torch.load(weights_only=True)``
(no arbitrary pickle), metadata as JSON.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

FORMAT = 1
POINTER = "latest"
META = "meta.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")
_UMASK = os.umask(0o022)  # read the process umask (it can only be read by setting it) ...
os.umask(_UMASK)  # ... and put it back: files get the usual permissions despite mkstemp


class CheckpointError(RuntimeError):
    """No usable snapshot where one is needed; the message (one line) names the bad files."""


class SnapshotWarning(UserWarning):
    """A snapshot was skipped as corrupt or incomplete; the message names the bad file."""


class Stateful(Protocol):
    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> Any: ...


# ---------------------------------------------------------------------------------------------
# Components without a state_dict of their own.
# ---------------------------------------------------------------------------------------------


class RNGState:
    """The global random streams: torch CPU (and CUDA when available), numpy's legacy global
    generator and python's ``random``. The loop derives a seed per step and phase, so these
    should not matter; they are restored anyway, so nothing depends on that holding."""

    def state_dict(self) -> dict:
        np_state = np.random.get_state(legacy=False)
        state = {
            "torch": torch.get_rng_state(),
            "numpy": {
                "bit_generator": np_state["bit_generator"],
                "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                "pos": int(np_state["state"]["pos"]),
                "has_gauss": int(np_state["has_gauss"]),
                "gauss": float(np_state["gauss"]),
            },
            "python": random.getstate(),
        }
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(state["torch"])
        n = state["numpy"]
        np.random.set_state(
            {
                "bit_generator": n["bit_generator"],
                "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
                "has_gauss": n["has_gauss"],
                "gauss": n["gauss"],
            }
        )
        random.setstate(state["python"])
        cuda = state.get("cuda")  # skipped on a machine with a different set of GPUs
        n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if cuda is not None and len(cuda) == n_gpus:
            torch.cuda.set_rng_state_all(cuda)


class GeneratorState:
    """A generation backend's snapshot (``Generator.state_dict``): its policy version and, when
    it keeps a private weight copy (e.g. ``sync_every > 1``), those weights."""

    def __init__(self, generator: Any):
        self.generator = generator

    def state_dict(self) -> dict:
        return self.generator.state_dict()

    def load_state_dict(self, state: dict) -> None:
        try:
            self.generator.load_state_dict(state)
        except ValueError as e:
            raise CheckpointError(str(e)) from e


# ---------------------------------------------------------------------------------------------
# Small durable-file helpers.
# ---------------------------------------------------------------------------------------------


def fsync_path(path: Path) -> None:
    """Flush a file's data (any descriptor of a file flushes all of it) or a dir's entries."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data`` all at once: temp file in the same dir, fsync, rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_UMASK)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_path(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def _step_dirs(root: Path) -> dict[int, Path]:
    """Committed-looking snapshot dirs by step (temp dirs excluded)."""
    if not root.is_dir():
        return {}
    out = {}
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir():
            out[int(m.group(1))] = p
    return out


# ---------------------------------------------------------------------------------------------
# Writing.
# ---------------------------------------------------------------------------------------------


class Checkpointer:
    """Saves and restores the named ``components`` under ``root`` (``run_dir/checkpoints``).

    ``sync_files`` (e.g. metrics.jsonl) are fsynced before each snapshot, so the rows a
    snapshot covers are on disk before it is committed."""

    def __init__(
        self,
        root: str | Path,
        components: dict[str, Stateful],
        keep: int = 2,
        sync_files: Iterable[str | Path] = (),
    ):
        if keep < 1:
            raise ValueError(f"keep={keep} must be >= 1")
        bad = [n for n in components if not re.fullmatch(r"[A-Za-z0-9_\-]+", n)]
        if bad:
            raise ValueError(f"component names must be [A-Za-z0-9_-]+, got {bad}")
        self.root = Path(root)
        self.components = dict(components)
        self.keep = keep
        self.sync_files = [Path(p) for p in sync_files]

    def save(self, step: int, **trainer_state: Any) -> Path:
        """Snapshot every component at ``step``, plus ``trainer_state`` (JSON values)."""
        for p in self.sync_files:
            if p.exists():
                fsync_path(p)
        self.root.mkdir(parents=True, exist_ok=True)
        name = step_dir_name(step)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp_{name}_", dir=self.root))
        try:
            os.chmod(tmp, 0o777 & ~_UMASK)
            files = {}
            for cname, obj in self.components.items():
                path = tmp / f"{cname}.pt"
                with open(path, "wb") as f:
                    torch.save(obj.state_dict(), f)
                    f.flush()
                    os.fsync(f.fileno())
                files[path.name] = {"bytes": path.stat().st_size, "sha256": _sha256(path)}
            meta = {"format": FORMAT, "step": step, "trainer": trainer_state, "files": files}
            with open(tmp / META, "w") as f:
                json.dump(meta, f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            fsync_path(tmp)
            final = self.root / name
            if final.exists():  # a bad or stale snapshot of this step (we resumed before it)
                shutil.rmtree(final)
            os.rename(tmp, final)
            fsync_path(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        atomic_write_text(self.root / POINTER, name + "\n")
        self._prune(step)
        return final

    def _prune(self, step: int) -> None:
        """Keep the ``keep`` newest snapshots up to ``step``; delete older ones, newer (stale)
        ones and temp files left by an interrupted save."""
        dirs = _step_dirs(self.root)
        kept = sorted(s for s in dirs if s <= step)[-self.keep :]
        for s, p in dirs.items():
            if s not in kept:
                shutil.rmtree(p, ignore_errors=True)
        for p in self.root.glob(".*"):  # .tmp_* dirs, .latest.*.tmp files
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)

    def restore(self, snapshot: Snapshot) -> dict[str, Any]:
        """Load every component from ``snapshot``; return its trainer state."""
        have, want = sorted(snapshot.states), sorted(self.components)
        if have != want:
            raise CheckpointError(
                f"{snapshot.path} holds components {have}, this run has {want}; it was written "
                "by a different version of the trainer"
            )
        for cname, obj in self.components.items():
            try:
                obj.load_state_dict(snapshot.states[cname])
            except (KeyError, IndexError, ValueError, RuntimeError, TypeError) as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise CheckpointError(
                    f"{snapshot.path / (cname + '.pt')} does not fit this run's {cname}: {first}"
                ) from e
        return snapshot.trainer


# ---------------------------------------------------------------------------------------------
# A run's snapshot: one layout for both runtimes.
# ---------------------------------------------------------------------------------------------

# The components of a run's snapshot (a file <name>.pt each), in process and under
# runtime=distributed alike; meta.json adds first_eval, last_eval and ``runtime`` (the
# runtime's JSON counters: in process the weight syncs, distributed the replica checks and the
# node's seconds).
RUN_LAYOUT = {
    "policy": "the policy's full weights (unwrapped; under fsdp gathered from the shards)",
    "optimizer": "the optimizer's full state (under fsdp gathered from the shards)",
    "buffers": "[each trainer's replay buffer (its shard)], by trainer rank: one in process",
    "ledgers": "[each trainer's compute ledger], by trainer rank: one in process",
    "source": "where the next rollouts come from. In process: the generation backend (its "
    "version, and its weights when it keeps a private copy), the weight history of a sync lag "
    "and the global random streams. Distributed: per generator the index of its next batch, "
    "and per trainer the rollouts received from each generator",
}
PER_TRAINER = ("buffers", "ledgers")


class _Slot:
    """A component of a run's snapshot: the value handed to :meth:`RunSnapshots.save`, and on
    restore the function that loads its state."""

    def __init__(self) -> None:
        self.value: Any = None
        self.load: Callable[[Any], Any] | None = None

    def state_dict(self) -> Any:
        return self.value

    def load_state_dict(self, state: Any) -> None:
        self.load(state)


class RunSnapshots:
    """The snapshots of a run (``run_dir/checkpoints``) in the one layout of
    :data:`RUN_LAYOUT`, covering the run's ``log_files`` (``runlog.LOG_FILES``: fsynced
    first). A runtime hands :meth:`save` the values (trainer rank 0 gathers every trainer's
    first) and :meth:`restore` a loader per component."""

    def __init__(self, run_dir: str | Path, keep: int, log_files: Iterable[str]):
        run_dir = Path(run_dir)
        self.slots = {name: _Slot() for name in RUN_LAYOUT}
        self.checkpointer = Checkpointer(
            run_dir / "checkpoints", self.slots, keep=keep,
            sync_files=[run_dir / name for name in log_files],
        )  # fmt: skip

    def save(self, step: int, values: dict[str, Any], **trainer_state: Any) -> Path:
        """Snapshot ``values`` (one per component of :data:`RUN_LAYOUT`) at ``step``, with
        ``trainer_state`` (JSON values) in meta.json."""
        if sorted(values) != sorted(RUN_LAYOUT):
            raise ValueError(f"a run's snapshot holds {sorted(RUN_LAYOUT)}, got {sorted(values)}")
        for name, slot in self.slots.items():
            slot.value = values[name]
        try:
            return self.checkpointer.save(step, **trainer_state)
        finally:
            for slot in self.slots.values():
                slot.value = None

    def restore(self, snapshot: Snapshot, rank: int, **load: Callable[[Any], Any]) -> dict:
        """Hand each component's state to ``load[name]``, in the layout's order: of
        ``buffers`` and ``ledgers`` the entry of trainer ``rank`` (0 in process). Returns the
        trainer state (the eval dicts, ``runtime``). A state that does not fit is a
        :class:`CheckpointError` naming its file."""
        for name, slot in self.slots.items():
            fn = load[name]
            slot.load = (lambda states, fn=fn: fn(states[rank])) if name in PER_TRAINER else fn
        try:
            return self.checkpointer.restore(snapshot)
        finally:
            for slot in self.slots.values():
                slot.load = None


# ---------------------------------------------------------------------------------------------
# Reading.
# ---------------------------------------------------------------------------------------------


@dataclass
class Snapshot:
    path: Path
    step: int
    trainer: dict[str, Any]  # the trainer's JSON state (eval dicts)
    states: dict[str, Any]  # component name -> state dict (tensors on CPU)
    skipped: list[str] = field(default_factory=list)  # why newer snapshots were not used


def read_snapshot(path: str | Path) -> Snapshot:
    """Load and verify one snapshot dir; ``CheckpointError`` names the bad file."""
    path = Path(path)
    meta_path = path / META
    try:
        meta = json.loads(meta_path.read_text())
        files, step, trainer = meta["files"], int(meta["step"]), meta["trainer"]
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')} != {FORMAT}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{meta_path} is missing or corrupt ({_short(e)})") from e
    states = {}
    for fname, info in files.items():
        fpath = path / fname
        try:
            size = fpath.stat().st_size
        except OSError as e:
            raise CheckpointError(f"{fpath} is missing ({_short(e)})") from e
        if size != info["bytes"]:
            raise CheckpointError(f"{fpath} is truncated ({size} bytes, expected {info['bytes']})")
        if _sha256(fpath) != info["sha256"]:
            raise CheckpointError(f"{fpath} is corrupt (sha256 mismatch)")
        try:
            states[fname.removesuffix(".pt")] = torch.load(
                fpath, map_location="cpu", weights_only=True
            )
        except Exception as e:  # any unpickling failure means the file is unusable
            raise CheckpointError(f"{fpath} does not load ({_short(e)})") from e
    return Snapshot(path=path, step=step, trainer=trainer, states=states)


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def has_snapshots(root: str | Path) -> bool:
    root = Path(root)
    return (root / POINTER).exists() or bool(_step_dirs(root))


def load_latest(root: str | Path) -> Snapshot | None:
    """The newest good snapshot under ``root`` (see the module docstring for the order).

    None if there is no snapshot at all; ``CheckpointError`` if there are some but none is
    good. Each skipped snapshot raises a :class:`SnapshotWarning` naming the bad file and is
    listed in ``Snapshot.skipped``."""
    root = Path(root)
    dirs = _step_dirs(root)
    pointer = root / POINTER
    candidates: list[Path] = []
    problems: list[str] = []
    if pointer.exists():
        name = pointer.read_text(errors="replace").strip()
        if _STEP_DIR.match(name) and (root / name).is_dir():
            candidates.append(root / name)
        else:
            problems.append(f"{pointer} names {name!r}, which is not a snapshot dir")
    candidates += [dirs[s] for s in sorted(dirs, reverse=True) if dirs[s] not in candidates]
    if not candidates and not problems:
        return None
    for msg in problems:
        warnings.warn(f"skipping snapshot: {msg}", SnapshotWarning, stacklevel=2)
    for path in candidates:
        try:
            snap = read_snapshot(path)
        except CheckpointError as e:
            problems.append(str(e))
            warnings.warn(f"skipping snapshot: {e}", SnapshotWarning, stacklevel=2)
            continue
        snap.skipped = problems
        return snap
    raise CheckpointError(f"no good snapshot in {root}: " + "; ".join(problems))


# ---------------------------------------------------------------------------------------------
# metrics.jsonl and config.yaml on resume.
# ---------------------------------------------------------------------------------------------


def _rows(path: Path) -> list[tuple[bytes, dict | None]]:
    """(line bytes, parsed row or None if truncated/corrupt) for each non-empty line."""
    out = []
    for line in Path(path).read_bytes().splitlines(keepends=True):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        out.append((line, row if isinstance(row, dict) else None))
    return out


def metrics_steps(path: str | Path) -> list[int]:
    """Steps of the complete rows of a metrics.jsonl ([] if it does not exist)."""
    if not Path(path).exists():
        return []
    return [int(r["step"]) for _, r in _rows(Path(path)) if r is not None and "step" in r]


def truncate_metrics(path: str | Path, step: int) -> int:
    """Keep only the complete rows with ``step <= step`` (bytes unchanged), rewriting the
    file atomically if anything goes; return the number of lines dropped."""
    path = Path(path)
    rows = _rows(path)
    kept = [
        line if line.endswith(b"\n") else line + b"\n"
        for line, r in rows
        if r is not None and int(r.get("step", -1)) <= step
    ]
    dropped = len(rows) - len(kept)
    data = b"".join(kept)
    if data != path.read_bytes():
        atomic_write_bytes(path, data)
    return dropped


MISSING_VALUE = "<absent>"


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> {"a.b.c": leaf}; lists are leaves."""
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def config_differences(
    saved: dict, current: dict, ignore: Iterable[str] = ()
) -> list[tuple[str, Any, Any]]:
    """(key, saved value, current value) for every leaf that differs, keys sorted; a key
    missing on one side has the value ``MISSING_VALUE``. A key missing on one side and null on
    the other is no difference (an unused knob that an older config listed, or a derived size
    it did not record). Keys in ``ignore`` (or under them) are skipped."""
    a, b = flatten(saved), flatten(current)
    ignore = tuple(ignore)
    out = []
    for key in sorted(set(a) | set(b)):
        if any(key == k or key.startswith(k + ".") for k in ignore):
            continue
        va, vb = a.get(key, MISSING_VALUE), b.get(key, MISSING_VALUE)
        if (va is None and vb == MISSING_VALUE) or (vb is None and va == MISSING_VALUE):
            continue
        if va != vb:
            out.append((key, va, vb))
    return out


def format_value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)
