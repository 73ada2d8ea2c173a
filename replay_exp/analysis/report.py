"""``replay-exp-report <sweep_dir> [--x compute|steps|rollouts|flops|wall]``: a sweep's figures,
the CSVs behind them and a markdown summary, written into ``<sweep_dir>/report/``.

Always: accuracy vs the chosen x, vs steps and vs wall-clock (seed mean, IQR band), the
per-run table (runs.csv) and the per-configuration table (targets.csv). When the sweep has them:
Pareto envelopes (several configurations; one envelope per learning-rate family when the
learning rate is swept), heatmaps of best accuracy and compute-to-98%-of-best over N x (W, T),
pass@k gain over the baseline vs k, histograms of the buffer telemetry, the composition of the
data trained on vs the data generated (``data/*`` keys: reward, length, pass rate), and, with
``--theory DIR``, the theory curves for the sweep's mu (written once per mu into
``DIR/mu=<mu>/``, e.g. ``analysis/results/theory``, and linked from the summary: every sweep at
one mu shares the same figures, so reports do not each keep a copy). The baseline is the
on-policy configuration (the best one if several, e.g. over learning rates); savings are
measured at the accuracy it reaches (``--frac`` of its best seed-mean accuracy).

One number per statistic: every point estimate is the statistic of the seed-mean curve
(``replay_exp.analysis.curves``), and every interval is a percentile bootstrap centred on it
(``replay_exp.analysis.stats``); a statistic the bootstrap table gives (the saving) is not
repeated in the per-configuration table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from replay_exp import PROJECT
from replay_exp.analysis.curves import X_AXES, aggregate, target_table, x_label
from replay_exp.analysis.labels import config_label, split_label
from replay_exp.analysis.loader import Runs, load_runs
from replay_exp.analysis.plots import (
    plot_composition,
    plot_curves,
    plot_heatmaps,
    plot_pareto,
    plot_passk_gain,
    plot_telemetry,
)
from replay_exp.analysis.stats import INTERVALS, compare_to_baseline, equivalence
from replay_exp.analysis.studies.composition import (
    STATS,
    composition_curves,
    composition_final,
    composition_runs,
)

INTERVAL_NAMES = {
    "t": "seed-level t (Welch df) on the bootstrap SE of seeds and of problems",
    "percentile": "percentile bootstrap over problems and seeds",
}

SPLIT = "(W,T)"
# Fewer seeds than this per configuration: the summary opens with a warning.
MIN_SEEDS = 4


class ReportError(ValueError):
    """Bad input to the report (printed as one line); anything else is a bug and keeps its
    traceback."""


def is_baseline(frame: pd.DataFrame) -> pd.Series:
    """Rows of the on-policy baseline (``buffer.name == "on_policy"``)."""
    if "buffer.name" not in frame:
        return pd.Series(False, index=frame.index)
    return frame["buffer.name"] == "on_policy"


def baseline_label(runs: Runs, metric: str, x: str) -> str | None:
    """The on-policy configuration, the best one (peak of the seed-mean ``metric``) if there are
    several."""
    base = runs.runs[is_baseline(runs.runs)]
    if len(base) == 0:
        return None
    labels = list(dict.fromkeys(base["label"]))
    if len(labels) == 1:
        return labels[0]
    curves = aggregate(runs.steps[runs.steps["label"].isin(labels)], x, metric)
    return str(curves.groupby("label")["mean"].max().idxmax())


def families(runs: Runs, over: tuple[str, ...] = ("algo.lr",)) -> tuple[dict[str, str], str | None]:
    """Label -> Pareto family: over the keys ``over`` that vary (each family is a
    configuration without them; default: learning rates, e.g. ``("algo.lr",
    "buffer.capacity")`` for an envelope over lr x N), else "on-policy" vs "replay". Also
    returns the baseline family."""
    table = runs.runs.drop_duplicates("label")
    swept = [k for k in over if k in runs.config_keys]
    if swept:
        keys = [k for k in runs.config_keys if k not in swept]
        fam = {r["label"]: config_label(r.to_dict(), keys) for _, r in table.iterrows()}
    else:
        fam = {
            label: "on-policy" if base else "replay"
            for label, base in zip(table["label"], is_baseline(table), strict=True)
        }
    return fam, "on-policy" if "on-policy" in fam.values() else None


def pick_label(runs: Runs, name: str, option: str = "--baseline") -> str:
    """The configuration label equal to ``name``, else the only one containing it (errors
    name the command-line ``option`` it came from)."""
    labels = list(dict.fromkeys(runs.runs["label"]))
    if name in labels:
        return name
    hits = [label for label in labels if name in label]
    if len(hits) != 1:
        raise ReportError(f"{option} {name!r} matches {len(hits)} configurations; the labels: "
                          f"{'; '.join(labels)}")  # fmt: skip
    return hits[0]


def best_over(runs: Runs, key: str, metric: str, x: str) -> Runs:
    """Only the best value of ``key`` (e.g. ``algo.lr``) of every configuration family (the
    configuration without ``key``): the one with the highest peak seed-mean ``metric``, the same
    rule that picks the baseline among several on-policy configurations."""
    if key not in runs.runs:
        keys = ", ".join(runs.config_keys)
        raise ReportError(f"--best-over {key}: no run sets it (keys that vary: {keys})")
    others = [k for k in runs.config_keys if k != key]
    table = runs.runs.drop_duplicates("label")
    family = {r["label"]: config_label(r.to_dict(), others) for _, r in table.iterrows()}
    peaks = aggregate(runs.steps, x, metric).groupby("label")["mean"].max()
    best: dict[str, str] = {}
    for label, fam in family.items():
        if fam not in best or peaks[label] > peaks[best[fam]]:
            best[fam] = label
    keep = set(best.values())
    return dataclasses.replace(
        runs,
        runs=runs.runs[runs.runs["label"].isin(keep)],
        steps=runs.steps[runs.steps["label"].isin(keep)],
    )


def heatmap_axes(runs: Runs) -> tuple[str, str] | None:
    """(row key, column key) of a heatmap over the replay configurations (the baseline has
    no N): N x (W, T) as in the paper when both vary, else the two keys that vary when exactly
    two do."""
    replay = runs.runs[~is_baseline(runs.runs)]
    keys = [k for k in runs.config_keys if replay[k].astype(str).nunique() > 1]
    if "buffer.capacity" in keys and ("schedule.trainers" in keys or "schedule.workers" in keys):
        return "buffer.capacity", SPLIT
    keys = [k for k in keys if k != "schedule.workers"]  # moves with schedule.trainers
    return (keys[0], keys[1]) if len(keys) == 2 else None


def _fmt_x(v: float) -> str:
    return "not reached" if not math.isfinite(v) else f"{v:.3g}"


def _pct(v: float) -> str:
    if v is None or math.isnan(v):
        return "n/a"
    return "never gets there" if math.isinf(v) else f"{100 * v:+.0f}%"


def _to_final(r) -> str:
    """The saving to the baseline's final accuracy with its interval, or "not reached"."""
    v = r.get("saving_final", math.nan)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if math.isinf(v):
        return "not reached"
    lo, hi = r["saving_final_lo"], r["saving_final_hi"]
    low = "not reached" if math.isinf(lo) else _pct(lo)
    return f"{_pct(v)} [{low}, {_pct(hi)}]"


def make_report(
    paths: list[Path],
    x: str = "compute",
    metric: str = "eval/pass@1",
    frac: float = 0.98,
    out: Path | None = None,
    logx: bool = False,
    n_boot: int = 2000,
    best_over_key: str | None = None,
    reference: str | None = None,
    interval: str = "t",
    envelope_over: tuple[str, ...] = ("algo.lr",),
    margin: float | None = None,
    theory: Path | None = None,
) -> tuple[Path, list[Path]]:
    """Write the report of the runs under ``paths``; returns (summary.md, all files).
    ``best_over_key``: report only each configuration's best value of that key
    (:func:`best_over`), e.g. every arm at its best learning rate. ``reference``: compare to
    this configuration (:func:`pick_label`) instead of the on-policy baseline. ``interval``:
    ``t`` or ``percentile`` (``replay_exp.analysis.stats``). ``envelope_over``: the keys each
    Pareto envelope takes the best over (:func:`families`). ``margin``: also say whether each
    final difference is equivalent to 0 within +-margin (``replay_exp.analysis.stats``).
    ``theory``: draw the theory curves for the sweep's mu into ``theory/mu=<mu>/`` (none
    without it; the summary then says how)."""
    runs = load_runs(paths, metric=metric, x=x)
    if runs.steps.empty or metric not in runs.steps:
        raise ReportError(f"no run under {', '.join(map(str, paths))} has logged {metric!r} yet")
    if best_over_key is not None:
        runs = best_over(runs, best_over_key, metric, x)
    steps = runs.steps
    mixed = code_warning(runs)
    if mixed is not None:  # also the summary's first line; the command prints it as a warning
        warnings.warn(mixed, stacklevel=2)
    out = Path(out) if out is not None else Path(paths[0]) / "report"
    out.mkdir(parents=True, exist_ok=True)  # only now: bad input leaves nothing behind
    base = baseline_label(runs, metric, x) if reference is None else pick_label(runs, reference)
    written: list[Path] = []
    # Portable: runs are named by their id under the sweep, not by this machine's paths.
    portable = runs.runs.drop(columns=["run_dir", "output_root"], errors="ignore")
    portable.to_csv(out / "runs.csv", index=False)
    written.append(out / "runs.csv")

    y_label = {"eval/pass@1": "held-out pass@1 (greedy)"}.get(metric, metric)
    curves_by_axis = {axis: aggregate(steps, axis, metric) for axis in (x, "steps", "wall")}
    for axis, axis_curves in curves_by_axis.items():
        written += plot_curves(axis_curves, out / f"curves_{axis}", x_label(axis), y_label, base,
                               logx=logx, title=f"{y_label} vs {axis}")  # fmt: skip

    curves = curves_by_axis[x]
    if curves["label"].nunique() > 1:
        fam, base_fam = families(runs, envelope_over)
        written += plot_pareto(curves, fam, out / f"pareto_{x}", x_label(x), y_label, base_fam)

    # Savings at the accuracy the baseline reaches, and the overall target of the heatmaps.
    best_target = None
    table, target = target_table(steps, x, metric, frac=frac, baseline=base)
    if base is not None:
        base_peak = float(table.loc[table["label"] == base, "peak"].iloc[0])
        table, target = target_table(steps, x, metric, target=frac * base_peak, baseline=base)
    table.to_csv(out / "targets.csv", index=False)
    written.append(out / "targets.csv")
    stats = None
    if base is not None and runs.runs["label"].nunique() > 1:
        stats = compare_to_baseline(runs, base, x, metric, frac, n_boot=n_boot, method=interval)
        if margin is not None:
            stats["margin"] = margin
            stats["final_equivalence"] = [
                equivalence(lo, hi, margin)
                for lo, hi in zip(stats["final_lo"], stats["final_hi"], strict=True)
            ]
        stats.to_csv(out / "stats.csv", index=False)
        written.append(out / "stats.csv")

    axes = heatmap_axes(runs)
    if axes is not None:
        best_table, best_target = target_table(steps, x, metric, frac=frac)
        # Every replay configuration is a cell, a --baseline one included; an on-policy one
        # has no place on the N x (W, T) grid.
        on_policy = set(runs.runs.loc[is_baseline(runs.runs), "config"])
        best_table = best_table[~best_table["config"].isin(on_policy)]
        meta = runs.runs.drop_duplicates("config").set_index("config")
        if SPLIT in axes:
            meta[SPLIT] = [split_label(row) for row in meta.to_dict("records")]
        for key in axes:
            best_table[key] = best_table["config"].map(meta[key])
        labels = {"buffer.capacity": "buffer size N", SPLIT: "(W, T): inference, trainers"}
        written += plot_heatmaps(best_table, axes[0], axes[1], out / "heatmap",
                                 labels.get(axes[0], axes[0]), labels.get(axes[1], axes[1]),
                                 best_target, x_label(x))  # fmt: skip

    final = steps.dropna(subset=[metric]).groupby("run", sort=False).last().reset_index()
    passk = None
    if base is not None and any(c.endswith("_sampled") for c in final):
        written += plot_passk_gain(final, base, out / "passk_gain")
        if stats is not None:  # the gain at every k with its interval, as for pass@1
            passk = passk_stats(runs, base, x, frac, n_boot, interval)
            passk.to_csv(out / "passk_stats.csv", index=False)
            written.append(out / "passk_stats.csv")

    composition, composition_lines = _composition(runs, x, base, out)
    written += composition
    controlled, controller_lines = _controller(runs, x, base, out)
    written += controlled

    if any((Path(d) / "buffer_telemetry.json").is_file() for d in runs.runs["run_dir"]):
        written += plot_telemetry(runs.runs, out / "telemetry")

    mu = runs.runs.get("compute.mu")
    mu = float(mu.dropna().iloc[0]) if mu is not None and mu.notna().any() else None
    if mu is not None and theory is not None:
        from replay_exp.theory.cli import plot_theory

        written += [Path(p) for p in plot_theory(Path(theory) / f"mu={mu:g}", mu=mu)]

    summary = out / "summary.md"
    text = _markdown(runs, table, target, base, paths, x, metric, frac, written, best_target, stats,
                     n_boot, out, theory_note(mu) if theory is None else None)  # fmt: skip
    extra = [] if passk is None else _passk_markdown(passk, x)
    extra += ([""] if extra and composition_lines else []) + composition_lines
    extra += ([""] if extra and controller_lines else []) + controller_lines
    if extra:  # before the list of files
        head, sep, files = text.partition("\n## Files\n")
        text = head + "\n" + "\n".join(extra) + "\n" + sep + files
    if best_over_key is not None:
        head, _, rest = text.partition("\n\n")
        text = (f"{head}\n\nEvery configuration at its best `{best_over_key}` (highest peak "
                f"of the seed mean) only: `--best-over {best_over_key}`.\n\n{rest}")  # fmt: skip
    summary.write_text(text)
    return summary, [summary, *written]


# What a committed report keeps (--slim; docs/analysis.md, "Where study data lives"): the
# summary, the tables its text is made of and the figures it cites; the per-step figure data and
# the other figures are redrawn from the archived runs.
SLIM_KEEP = ("summary.md", "runs.csv", "targets.csv", "stats.csv", "passk_stats.csv",
             "composition_final.csv", "controller_final.csv", "curves_{x}.png", "heatmap.png",
             "controller_reuse_ratio_{x}.png", "controller_horizon_{x}.png")  # fmt: skip


def slim(summary: Path, files: list[Path], x: str, command: str) -> list[Path]:
    """Delete the files of ``files`` (a report in ``summary``'s folder) that :data:`SLIM_KEEP`
    does not keep and end the summary's file list with what was dropped and the ``command``
    that redraws it; returns the kept files. Links to files elsewhere (theory curves) stay."""
    keep = {k.format(x=x) for k in SLIM_KEEP}
    out = summary.parent
    dropped = [f for f in files if f.parent == out and f.name not in keep]
    for f in dropped:
        f.unlink(missing_ok=True)
    gone = {f.name for f in dropped}
    head, sep, listing = summary.read_text().partition("\n## Files\n")
    links = {f"- [{n}]({n})" for n in gone}
    lines = [line for line in listing.splitlines() if line not in links]
    if gone:
        lines.append(f"- not kept in the repository: {', '.join(sorted(gone))}; redrawn from "
                     f"the archived runs by `{command}` (the rest of this summary comes out the "
                     "same)")  # fmt: skip
    summary.write_text(head + sep + "\n".join(lines).rstrip("\n") + "\n")
    return [f for f in files if f not in dropped]


def sources_title(paths) -> str:
    """The report's sources for its title: a sweep directory by its name; run directories given
    one by one (a shell glob over a sweep's runs) by their sweep's name and how many, in order:
    ``a/s1 b/s2/r1 b/s2/r2`` -> "s1, s2 (2 runs)"."""
    names: dict[str, int] = {}
    for p in map(Path, paths):
        if (p / "config.yaml").is_file():
            names[p.parent.name] = names.get(p.parent.name, 0) + 1
        else:
            names.setdefault(p.name, 0)
    return ", ".join(f"{k} ({n} run{'s' * (n > 1)})" if n else k for k, n in names.items())


def sources_args(paths) -> list[str]:
    """The report's sources as a shell would be given them: run directories that are siblings
    (a shell glob over a sweep's runs) become that glob again, unquoted, when it matches exactly
    them: their common name prefix, cut after its last ``,`` (the ``key=value`` pairs they share)
    where that still matches exactly (``s/mu=2,seed=40 s/mu=2,seed=41`` -> ``s/mu=2,*``), else
    whole; anything else is kept as given, shell-quoted. For the "redrawn by" command
    of a slim report, which otherwise lists every run."""
    out: list[str] = []
    groups: list[list[str]] = []
    for p in map(str, paths):
        parent = str(Path(p).parent)
        run = (Path(p) / "config.yaml").is_file()
        if run and groups and str(Path(groups[-1][0]).parent) == parent:
            groups[-1].append(p)
        else:
            groups.append([p])
    for group in groups:
        glob = _sibling_glob(group) if len(group) > 1 else None
        out.extend([glob] if glob else map(shlex.quote, group))
    return out


def _sibling_glob(group: list[str]) -> str | None:
    """``parent/prefix*`` (prefix shell-quoted) matching exactly the run directories ``group``,
    all children of one parent; None when no prefix does."""
    parent = Path(group[0]).parent
    names = [Path(p).name for p in group]
    if names != sorted(names):  # a shell's glob hands them sorted: the glob would reorder them
        return None
    runs = {d.name for d in parent.iterdir() if (d / "config.yaml").is_file()}
    common = os.path.commonprefix(names)
    # Run names are "key=value,key=value": the shared whole pairs first (a glob that stays right
    # when runs of other values are added beside them), else the whole common prefix.
    for prefix in (common[: common.rfind(",") + 1], common):
        if prefix and {n for n in runs if n.startswith(prefix)} == set(names):
            return shlex.quote(os.path.join(os.path.dirname(group[0]), prefix)) + "*"
    return None


def theory_note(mu: float | None) -> str | None:
    """The summary's line about the theory curves a report drew without ``--theory``."""
    if mu is None:
        return None
    committed = f"analysis/results/theory/mu={mu:g}"
    where = f"; committed once in `{committed}/`" if (PROJECT / committed).is_dir() else ""
    return (f"theory curves for mu = {mu:g}: not drawn here (`--theory DIR` draws them into "
            f"`DIR/mu={mu:g}/`, or `replay-exp-theory --mu {mu:g} --plot DIR`{where})")  # fmt: skip


def _markdown(
    runs, table, target, base, paths, x, metric, frac, written, best_target, stats=None,
    n_boot=2000, out=Path("."), note=None,
) -> str:  # fmt: skip
    n = runs.runs["status"].value_counts().to_dict()
    seeds = runs.runs.groupby("config").size()
    with_stats = stats is not None and len(stats) > 0
    lines = [f"# Report: {sources_title(paths)}", ""]
    mixed = code_warning(runs)
    if mixed is not None:
        lines += [f"**Warning: {mixed}**", ""]
    if seeds.min() < MIN_SEEDS:
        few = ", ".join(
            f"{runs.runs.loc[runs.runs['config'] == c, 'label'].iloc[0]} ({k})"
            for c, k in seeds.items()
            if k < MIN_SEEDS
        )
        lines += [
            f"**Warning: fewer than {MIN_SEEDS} seeds per configuration** ({few}): means and "
            "bootstrap intervals over so few seeds are not reliable; run more seeds before "
            "drawing a conclusion.",
            "",
        ]
    how = "mean over seeds (each statistic of the seed-mean curve)"
    if with_stats:
        how += (
            f"; 95 % intervals: {INTERVAL_NAMES[stats['interval'].iloc[0]]}, B = {n_boot}, "
            "centred on the same statistics"
        )
    lines += [
        f"{len(runs)} runs ({', '.join(f'{v} {k}' for k, v in n.items())}), "
        f"{len(seeds)} configurations, {seeds.min()}-{seeds.max()} seeds each. "
        f"Metric: `{metric}`; x-axis: {x_label(x)}. Point estimates: {how}. Each statistic is "
        "given once." + _wall_line(runs),
        "",
    ]
    best = table.loc[table["peak"].idxmax()]
    lines += [
        "## Best configuration",
        "",
        f"**{best['label']}**: the highest peak of the seed-mean curve (table below).",
        "",
    ]
    if base is not None:
        b = table.loc[table["label"] == base].iloc[0]
        rest = table[table["label"] != base]
        saving = (
            "The saving, with its interval, is in the bootstrap table below."
            if with_stats
            else f"Saving = 1 - {x} / {x}_baseline."
        )
        lines += [
            f"## Compute to the baseline's accuracy ({frac:.0%} of its peak: {target:.3f})",
            "",
            f"Baseline: **{base}**. Per configuration, on its seed-mean curve: peak, final, "
            "drawdown (the mean over seeds of the largest drop below the seed's own running "
            f"peak) and the {x} to reach the target; seeds reaching it: how many seeds' own "
            f"curves do. {saving}",
            "",
        ]
        if len(rest) and not np.isfinite(rest["x_to_target"]).any():
            lines += ["No other configuration's seed-mean curve gets there.", ""]
        elif len(rest):
            winner = rest.loc[rest["x_to_target"].idxmin()]
            never = "" if math.isfinite(b["x_to_target"]) else " (the baseline never does)"
            lines += [f"Cheapest of the others to get there: **{winner['label']}**{never}.", ""]
    else:
        lines += [f"No on-policy baseline in this sweep; target = {frac:.0%} of the best peak.", ""]
    header = (
        f"| configuration | seeds | peak | final | drawdown | {x} to target | seeds reaching it |"
    )
    saving_col = base is not None and not with_stats
    header += " saving vs baseline |" if saving_col else ""
    lines += [header, _rule(header)]
    for _, r in table.iterrows():
        row = (
            f"| {r['label']} | {r['seeds']} | {r['peak']:.3f} | {r['final']:.3f} | "
            f"{r['drawdown']:.3f} | {_fmt_x(r['x_to_target'])} | "
            f"{r['seeds_reaching_target']} of {r['seeds']} |"
        )
        if saving_col:
            row += f" {_pct(r.get('saving_vs_baseline', np.nan))} |"
        lines.append(row)
    if best_target is not None:
        lines += ["", f"Heatmap target: {frac:.0%} of the best peak over all: {best_target:.3f}."]
    if with_stats:
        lines += ["", *_stats_markdown(stats, x, frac, n_boot)]
    lines += ["", "## Files", ""]
    # Relative links: the theory curves may live outside the report (--theory DIR).
    lines += [f"- [{p.name}]({Path(os.path.relpath(p, out)).as_posix()})" for p in written]
    lines += [f"- {note}"] if note else []
    return "\n".join(lines) + "\n"


def code_warning(runs: Runs) -> str | None:
    """One line when the runs do not all come from one clean commit (the loader's ``commit``
    and ``dirty`` columns, from each run's config.yaml ``provenance``): the commits with how
    many runs each (a run resumed on another commit counts for both; "unrecorded": a run that
    records none), and how many ran on a dirty tree. None when every run records the same
    clean commit, or when none records any (runs from before the record)."""
    table = runs.runs
    if "commit" not in table:
        return None
    counts: dict[str, int] = {}
    for commit in table["commit"]:
        for c in commit.split("+") if isinstance(commit, str) and commit else ["unrecorded"]:
            counts[c] = counts.get(c, 0) + 1
    dirty = int(table["dirty"].eq(True).sum()) if "dirty" in table else 0
    if list(counts) == ["unrecorded"] or (len(counts) == 1 and not dirty):
        return None

    def n_runs(n: int) -> str:
        return f"{n} run{'' if n == 1 else 's'}"

    ranked = sorted(counts.items(), key=lambda cn: -cn[1])  # stable: first seen first
    named = ", ".join(f"{c[:12]} ({n_runs(n)})" for c, n in ranked)
    if len(counts) > 1:
        text = f"these {n_runs(len(table))} do not come from one commit: {named}"
    else:
        text = f"these {n_runs(len(table))} come from commit {ranked[0][0][:12]}"
    if dirty:
        text += f"; {n_runs(dirty)} ran on a tree with uncommitted changes (dirty)"
    return text + ", so their results may come from different code (config.yaml: provenance)"


def sweep_wall_seconds(runs: Runs) -> float | None:
    """Wall-clock of the runs as a whole: the first ``config.yaml`` written (a run starts) to
    the last ``summary.json`` (a run finishes), from the run directories' file times, or for an
    archived copy from the source's times in its ``archive.json``; None when a run has no
    directory here (W&B), has not finished, or is an archive without the times."""
    starts, ends = [], []
    for d in runs.runs.get("run_dir", pd.Series(dtype=object)):
        start, end, record = (Path(str(d)) / n for n in ("config.yaml", "summary.json",
                                                         "archive.json"))  # fmt: skip
        if record.is_file():  # the copy's file times are when it was copied
            times = json.loads(record.read_text())
            if "started" not in times:
                return None
            starts.append(times["started"])
            ends.append(times["finished"])
            continue
        if not (start.is_file() and end.is_file()):
            return None
        starts.append(start.stat().st_mtime)
        ends.append(end.stat().st_mtime)
    return max(ends) - min(starts) if starts else None


def _wall_line(runs: Runs) -> str:
    wall = sweep_wall_seconds(runs)
    if wall is None:
        return ""
    return (f" Wall-clock of these runs, first start to last finish: {wall / 60:.1f} min "
            "(from the run directories' file times).")  # fmt: skip


def _stats_markdown(stats: pd.DataFrame, x: str, frac: float, n_boot: int = 2000) -> list[str]:
    """The "against the baseline" section: intervals and verdicts (replay_exp.analysis.stats)."""
    first = stats.iloc[0]
    resampled = bool(stats["problems_resampled"].all())
    how = (
        f"problems ({int(first['problems'])} held-out, the same for every run) and seeds"
        if resampled
        else "seeds only: some runs have no eval_details.jsonl, so problems are not resampled "
        "and the intervals are too narrow"
    )
    lines = [
        f"## Against the baseline ({first['baseline']}): 95 % intervals",
        "",
        f"Interval: {INTERVAL_NAMES[first['interval']]} (`replay_exp/analysis/stats.py`).",
        "",
        f"Differences of the seed-mean curves at matched {x} (up to {first['x_matched']:.4g}, "
        f"the last {x} every run reached), bootstrapped ({n_boot} replicates) over {how}; "
        "seeds are paired where "
        f"both arms ran the same ones. final = at that {x}; peak = best evaluation of each "
        f"curve; saving = 1 - {x}_config / {x}_baseline to reach {frac:.0%} of the baseline's "
        f"peak; to baseline final = 1 - {x}_config / {x}_matched to reach the baseline's "
        "seed-mean final accuracy (the share of the baseline's budget it saves; not reached: "
        "the curve never gets there). Verdict: better / worse when the interval excludes 0, "
        "else not separable. "
        "MDE: the minimal detectable effect, the true difference a two-sided 5 % test would "
        "detect with 80 % power at these seeds (t intervals only): a not-separable verdict "
        "rules out effects larger than about that, not smaller ones.",
        "",
    ]
    margin = first.get("margin") if "final_equivalence" in stats else None
    if margin is not None:
        lines[-1:-1] = [
            f"Equivalence margin {margin:g} (`--margin`, stated before the data): a final "
            f"difference is **equivalent** when its whole 95 % interval lies inside "
            f"[-{margin:g}, +{margin:g}]; **non-inferior** when it lies above -{margin:g} but "
            f"reaches past +{margin:g} (maybe better by more than the margin); otherwise not "
            "shown.",
            "",
        ]
    header = (
        "| configuration | seeds (paired) | final diff [95 % CI] | verdict | peak diff [95 % CI] "
        f"| verdict | {x} saving [95 % CI] | verdict | {x} saved to baseline final [95 % CI] "
        "| stability [95 % CI] | verdict "
        "| MDE final / peak | per-seed final diffs |"
        + (f" final vs margin ±{margin:g} |" if margin is not None else "")
    )
    lines += [header, _rule(header)]
    for _, r in stats.iterrows():
        pair = "yes" if r["paired_seeds"] else "no"
        per_seed = r.get("final_per_seed")
        per_seed = per_seed if isinstance(per_seed, str) else "unpaired"
        lines.append(
            f"| {r['label']} | {r['seeds']} ({pair}) | {_signed(r['final'])} "
            f"[{_signed(r['final_lo'])}, {_signed(r['final_hi'])}] | {r['final_verdict']} | "
            f"{_signed(r['peak'])} [{_signed(r['peak_lo'])}, {_signed(r['peak_hi'])}] | "
            f"{r['peak_verdict']} | {_pct(r['saving'])} [{_pct(r['saving_lo'])}, "
            f"{_pct(r['saving_hi'])}] | {r['saving_verdict']} | {_to_final(r)} | "
            f"{_signed(r['stability'])} "
            f"[{_signed(r['stability_lo'])}, {_signed(r['stability_hi'])}] | "
            f"{r['stability_verdict']} | {_mde(r, 'final')} / {_mde(r, 'peak')} | {per_seed} |"
            + (f" {r['final_equivalence']} |" if margin is not None else "")
        )
    return lines


def passk_stats(
    runs: Runs, base: str, x: str, frac: float, n_boot: int, interval: str = "t"
) -> pd.DataFrame:
    """Final pass@k difference to the baseline with its interval, for every sampled k
    (``replay_exp.analysis.stats``: per-problem unbiased pass@k, paired bootstrap)."""
    ks = sorted(
        int(c.split("@")[1].split("_")[0])
        for c in runs.steps
        if c.startswith("eval/pass@") and c.endswith("_sampled")
    )
    rows = []
    for k in ks:
        st = compare_to_baseline(
            runs, base, x, f"eval/pass@{k}_sampled", frac, n_boot=n_boot, method=interval
        )
        cols = ["label", "final", "final_lo", "final_hi", "final_verdict", "problems"]
        rows += [{"k": k, **r} for r in st[cols].to_dict("records")]
    return pd.DataFrame(rows)


def _passk_markdown(passk: pd.DataFrame, x: str) -> list[str]:
    lines = [
        "## pass@k gain over the baseline: 95 % bootstrap intervals",
        "",
        f"Final pass@k (unbiased estimate per problem from the sampled evaluation, on "
        f"{int(passk['problems'].iloc[0])} problems) minus the baseline's at matched {x}; "
        "problems and seeds resampled as above.",
        "",
    ]
    header = "| configuration | k | gain [95 % CI] | verdict |"
    lines += [header, _rule(header)]
    for _, r in passk.iterrows():
        lines.append(
            f"| {r['label']} | {r['k']} | {_signed(r['final'])} [{_signed(r['final_lo'])}, "
            f"{_signed(r['final_hi'])}] | {r['final_verdict']} |"
        )
    return lines


def _composition(runs: Runs, x: str, base: str | None, out: Path) -> tuple[list[Path], list[str]]:
    """The trained-vs-generated figure (``composition_<x>``), the final cumulative table
    (``composition_final.csv``) and the summary's lines about them
    (:mod:`replay_exp.analysis.studies.composition`). Runs without the ``data/*`` keys are left
    out of
    these only, with a one-line note; none with them: no figure, the note alone."""
    with_keys, without = composition_runs(runs.steps)
    if not with_keys:
        return [], [
            "Trained vs generated data: not drawn, no run logs the `data/*` composition keys "
            "(runs older than them)."
        ]
    steps = runs.steps[runs.steps["run"].isin(with_keys)]
    written = plot_composition(composition_curves(steps, x), STATS, out / f"composition_{x}",
                               x_label(x), base)  # fmt: skip
    final = composition_final(steps)
    final.to_csv(out / "composition_final.csv", index=False)
    written.append(out / "composition_final.csv")
    lines = [
        "## Trained vs generated data",
        "",
        "What the runs trained on (each use of a replayed rollout counted) against what they "
        "generated: reward, response length (tokens) and the pass rate of the rollout's prompt "
        "group at generation (easiness). Final cumulative values (each run's last logged "
        "`data/*`, mean over seeds); trained - generated above 0 in pass rate: hard problems are "
        f"starved. Per evaluation interval vs {x}: `composition_{x}.png`.",
        "",
    ]
    header = "| configuration | seeds | stat | generated | trained | trained - generated |"
    lines += [header, _rule(header)]
    for _, r in final.iterrows():
        fmt = {"count": "{:.0f}", "length": "{:.1f}"}.get(r["stat"], "{:.3f}")
        sfmt = {"count": "{:+.0f}", "length": "{:+.1f}"}.get(r["stat"], "{:+.3f}")
        cells = [
            "n/a" if math.isnan(v) else f.format(v)
            for v, f in ((r["generated"], fmt), (r["trained"], fmt), (r["diff"], sfmt))
        ]
        lines.append(f"| {r['label']} | {r['seeds']} | {r['stat']} | {' | '.join(cells)} |")
    if without:
        skipped = runs.runs[runs.runs["run"].isin(without)]
        which = ", ".join(f"{label} ({n})" for label, n in
                          skipped.groupby("label", sort=False).size().items())  # fmt: skip
        n = len(with_keys) + len(without)
        lines += ["", f"{len(without)} of {n} runs left out of this section (no `data/*` "
                  f"composition keys: logged before them): {which}."]  # fmt: skip
    return written, lines


# The knobs a controller (controller=adaptive) logs on every evaluated row, and their names.
KNOBS = {
    "controller/reuse_ratio": "reuse ratio y = B / R",
    "controller/horizon": "horizon x = N / R",
}


def _controller(runs: Runs, x: str, base: str | None, out: Path) -> tuple[list[Path], list[str]]:
    """Runs under controller=adaptive: the seed-mean path of each knob vs ``x``
    (``controller_<knob>_<x>``) and a table of where each configuration ended (final knobs and
    decisions, means over seeds); nothing when no run has a controller."""
    steps = runs.steps
    if "controller/reuse_ratio" not in steps or steps["controller/reuse_ratio"].isna().all():
        return [], []
    ctl = steps[steps["controller/reuse_ratio"].notna()]
    written: list[Path] = []
    for key, name in KNOBS.items():
        stem = f"controller_{key.split('/')[1]}_{x}"
        written += plot_curves(aggregate(ctl, x, key), out / stem, x_label(x), name, base,
                               title=f"the controller's {name}")  # fmt: skip
    last = ctl.groupby("run", sort=False).last().reset_index()
    cols = ["controller/reuse_ratio", "controller/capacity", "controller/horizon",
            "controller/lr_scale", "controller/decisions", "controller/moves_up",
            "controller/moves_down"]  # fmt: skip
    table = last.groupby("label", sort=False).agg(
        seeds=("run", "count"), **{c.split("/")[1]: (c, "mean") for c in cols if c in last}
    )
    table.reset_index().to_csv(out / "controller_final.csv", index=False)
    written.append(out / "controller_final.csv")
    lines = ["## The controller", "",
             "Runs under `controller=adaptive` (docs/controller.md): where each configuration's "
             "knobs ended and how often it moved (last logged values, mean over seeds); the "
             f"paths vs {x}: " + ", ".join(f"`controller_{k.split('/')[1]}_{x}.png`"
                                            for k in KNOBS) + ".", ""]  # fmt: skip
    header = "| configuration | " + " | ".join(table.columns) + " |"
    lines += [header, _rule(header)]
    for label, r in table.iterrows():
        lines.append(f"| {label} | " + " | ".join(f"{v:.4g}" for v in r.to_numpy()) + " |")
    return written, lines


def _mde(r, name: str) -> str:
    v = r.get(f"{name}_mde")
    return "n/a" if v is None or not isinstance(v, float) or math.isnan(v) else f"{v:.3f}"


def _signed(v: float) -> str:
    return "n/a" if v is None or math.isnan(v) else f"{v:+.3f}"


def _rule(header: str) -> str:
    return "|" + "---|" * (header.count("|") - 1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="replay-exp-report", description=__doc__.split("\n\n")[0].replace("``", "")
    )
    p.add_argument("sweep_dirs", nargs="+", type=Path, help="sweep (or run) directories")
    p.add_argument("--x", default="compute", choices=sorted(X_AXES), help="x-axis")
    p.add_argument("--metric", default="eval/pass@1", help="the accuracy column")
    p.add_argument("--frac", type=float, default=0.98, help="target = frac x best accuracy")
    p.add_argument("--out", type=Path, default=None, help="default: <first sweep dir>/report")
    p.add_argument("--logx", action="store_true", help="log-scale x for the accuracy curves")
    p.add_argument("--n-boot", type=int, default=2000, help="bootstrap replicates (stats.csv)")
    p.add_argument(
        "--envelope-over",
        nargs="+",
        default=["algo.lr"],
        metavar="KEY",
        help="keys each Pareto envelope takes the best over (default algo.lr; e.g. algo.lr "
        "buffer.capacity: one envelope per arm over lr x N)",
    )
    p.add_argument(
        "--interval",
        default="t",
        choices=INTERVALS,
        help="t: seed-level t over the bootstrap's SE (default); percentile: the old bootstrap",
    )
    p.add_argument(
        "--baseline",
        default=None,
        metavar="LABEL",
        help="compare to this configuration (its label, or a unique part of it) instead of the "
        "on-policy one",
    )
    p.add_argument(
        "--best-over",
        default=None,
        metavar="KEY",
        help="keep each configuration's best value of KEY only (e.g. algo.lr)",
    )
    p.add_argument(
        "--theory",
        type=Path,
        default=None,
        metavar="DIR",
        help="draw the theory curves for the sweep's mu into DIR/mu=<mu>/ (one copy for every "
        "report at that mu, e.g. analysis/results/theory) and link them; default: not drawn",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=None,
        help="equivalence margin of the final difference, in the metric's units (e.g. 0.02 = 2 "
        "points): equivalent when its whole 95 %% interval lies inside +-margin, non-inferior "
        "when it lies above -margin but reaches past +margin",
    )
    p.add_argument(
        "--slim",
        action="store_true",
        help="a report to commit beside archived runs: keep the summary, its tables and the "
        "figures it cites; the summary names the rest and the command that redraws it",
    )
    args = p.parse_args(argv)
    try:
        if not 0 < args.frac <= 1:
            raise ReportError(f"--frac must be in (0, 1], got {args.frac}")
        if args.margin is not None and not args.margin > 0:
            raise ReportError(f"--margin must be > 0, got {args.margin}")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            summary, files = make_report(
                args.sweep_dirs,
                args.x,
                args.metric,
                args.frac,
                args.out,
                args.logx,
                args.n_boot,
                args.best_over,
                args.baseline,
                args.interval,
                tuple(args.envelope_over),
                args.margin,
                args.theory,
            )
    except (FileNotFoundError, ReportError) as e:
        print(f"report error: {e}", file=sys.stderr)
        sys.exit(2)
    if args.slim:
        given = set(args.sweep_dirs)
        rest = [a for a in (sys.argv[1:] if argv is None else argv)
                if a != "--slim" and Path(a) not in given]  # fmt: skip
        command = " ".join(
            ["replay-exp-report", *sources_args(args.sweep_dirs), *map(shlex.quote, rest)]
        )
        files = slim(summary, files, args.x, command)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    print(summary.read_text())
    print(f"wrote {len(files)} files to {summary.parent}")


if __name__ == "__main__":
    main()
