"""Study runs small enough to commit: what the analysis needs of each finished run, so that a
study's reports can be rebuilt (and a half-done study continued) from the repository alone.

A run directory of a 3000-unit study holds ~30 MB, almost all of it ``metrics.jsonl`` rows of
training steps. Its archived copy keeps

- every ``metrics.jsonl`` row that carries an evaluation (``eval/...`` keys: the curves, finals,
  peaks, stability and compute to target of the report all come from these rows; each one also
  carries that step's training, buffer and ledger metrics), and the last row (the run's totals),
  xz-compressed as ``metrics.jsonl.xz``;
- ``eval_details.jsonl`` whole (per-problem results: the problem-level bootstrap), compressed as
  ``eval_details.jsonl.xz``, and ``config.yaml``, ``summary.json``, ``buffer_telemetry.json`` as
  they are (so the copy keeps the code that made the run: their ``provenance`` records);
- ``final_passk.json`` when the run has one (``python -m replay_exp.eval.final``);
- ``archive.json``: how many rows the source had and how many were kept, and when the run
  started and finished (the source's ``config.yaml`` and ``summary.json`` file times, which
  the copies do not keep: the report's sweep wall-clock reads them from here).

It is a run directory like any other: ``load_runs``, ``replay-exp-report`` and
``python -m replay_exp.analysis.studies.selection`` read it (``replay_exp.runlog.read_metrics``
reads a compressed copy where the plain file is absent) and give the same finals, peaks and
intervals as on the source (tested); training-step series between evaluations are gone.
Compressed, a 3000-unit run's copy is ~25 kB (~0.15 MB uncompressed), so a whole study fits in
the repository. The files are xz at preset 9e, which holds no time stamp, so the same run
archived twice gives the same bytes (``xzcat metrics.jsonl.xz`` reads one by hand); xz is ~25 %
smaller than the gzip -9 the archive wrote before (measured on the 294 runs archived then: 7.9
-> 5.9 MiB). Archives written as ``.gz`` are still read, and re-archiving such a run leaves it
as it is when its rows are the same.

``python -m replay_exp.analysis.archive runs/finding1_stage1_tiny --out analysis/runs`` copies
every finished run below the given sweep directories to ``analysis/runs/<sweep dir>/<run>/``.
Unfinished runs are skipped (listed). An existing archived run is left alone when its files are
the same, and is an error when they differ (a different run under the same name), unless
``--force``.
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import sys
from pathlib import Path

from replay_exp.analysis.loader import find_run_dirs, read_run
from replay_exp.runlog import COMPRESSED_OPENERS, jsonl_file, open_text

COPIED = (
    "config.yaml",
    "summary.json",
    "buffer_telemetry.json",
    "final_passk.json",  # python -m replay_exp.eval.final
)
COMPRESSED = ("eval_details.jsonl",)  # copied whole, as <name>.xz
XZ_PRESET = 9 | lzma.PRESET_EXTREME


def read_text(path: Path) -> str:
    """The text of ``path``, decompressed when it is a ``.xz`` or ``.gz`` file."""
    with open_text(path) as f:
        return f.read()


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, xz-compressed (preset 9e; xz keeps no time stamp, so the same
    text gives the same bytes) when the name ends in ``.xz``."""
    if path.suffix == ".xz":
        path.write_bytes(lzma.compress(text.encode(), preset=XZ_PRESET))
    else:
        path.write_text(text)


def existing(target: Path, name: str) -> Path | None:
    """The archived file ``target/name``, or, for a compressed name, the same rows under another
    compression (a ``.gz`` written before the archive moved to xz); None when there is none."""
    if (target / name).is_file():
        return target / name
    stem, suffix = name.rsplit(".", 1)
    if "." + suffix in COMPRESSED_OPENERS:
        return jsonl_file(target / stem)
    return None


def kept_rows(lines: list[str]) -> list[str]:
    """The metrics.jsonl lines an archive keeps: those with an ``eval/`` key, and the last."""
    out = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        if i == len(lines) - 1 or any(k.startswith("eval/") for k in json.loads(line)):
            out.append(line)
    return out


def archived_files(run_dir: Path) -> dict[str, str]:
    """File name -> text (uncompressed) of the archived copy of ``run_dir``; the files named
    ``*.xz`` are written compressed (:func:`write_text`)."""
    lines = read_text(jsonl_file(run_dir / "metrics.jsonl")).splitlines()
    rows = kept_rows(lines)
    files = {"metrics.jsonl.xz": "\n".join(rows) + "\n"}
    for name in COPIED:
        if (run_dir / name).is_file():
            files[name] = (run_dir / name).read_text()
    for name in COMPRESSED:
        source = jsonl_file(run_dir / name)
        if source is not None:
            files[name + ".xz"] = read_text(source)
    files["archive.json"] = (
        json.dumps(
            {
                "rows_source": sum(1 for line in lines if line.strip()),
                "rows_kept": len(rows),
                "kept": "rows with an eval/ key, and the last row",
                "started": (run_dir / "config.yaml").stat().st_mtime,
                "finished": (run_dir / "summary.json").stat().st_mtime,
            },
            indent=1,
        )
        + "\n"
    )
    return files


def archive(sources: list[Path], out: Path, force: bool = False) -> dict[str, list[str]]:
    """Archive every finished run below ``sources`` into ``out/<source dir name>/<run path>``.
    Returns the run paths written, unchanged and skipped (unfinished). Raises ValueError, before
    writing anything, for an existing archived run whose files differ (unless ``force``)."""
    plan: list[tuple[Path, dict[str, str]]] = []
    done: dict[str, list[str]] = {"written": [], "unchanged": [], "skipped": []}
    for src in sources:
        for _root, run_dir in find_run_dirs(src):
            rel = Path(src.name) / run_dir.relative_to(src) if run_dir != src else Path(src.name)
            if read_run(run_dir)[2] != "finished":
                done["skipped"].append(str(rel))
                continue
            plan.append((out / rel, archived_files(run_dir)))
    clashes = []
    for target, files in plan:
        if not target.exists():
            continue
        found = {n: existing(target, n) for n in files}
        same = all(f is not None and read_text(f) == files[n] for n, f in found.items())
        if same:
            done["unchanged"].append(str(target.relative_to(out)))
        elif not force:
            clashes.append(str(target))
    if clashes:
        raise ValueError(
            f"archived runs differ from their sources (--force replaces them): {', '.join(clashes)}"
        )
    for target, files in plan:
        if str(target.relative_to(out)) in done["unchanged"]:
            continue
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for name, text in files.items():
            write_text(target / name, text)
        done["written"].append(str(target.relative_to(out)))
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sources", nargs="+", type=Path, help="sweep directories (or run dirs)")
    ap.add_argument("--out", type=Path, required=True, help="archive root, e.g. analysis/runs")
    ap.add_argument("--force", action="store_true", help="replace archived runs that differ")
    args = ap.parse_args(argv)
    try:
        for src in args.sources:
            if not src.is_dir():
                raise ValueError(f"no such sweep directory: {src}")
        done = archive(args.sources, args.out, args.force)
    except ValueError as e:
        print(f"archive: {e}", file=sys.stderr)
        return 2
    for what, runs in done.items():
        print(f"{what}: {len(runs)}")
        if what == "skipped":
            for r in runs:
                print(f"  unfinished: {r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
