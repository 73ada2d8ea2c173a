"""The study's figures. Each function draws one PNG and writes the data behind it as a CSV of
the same name, and returns both paths. Median lines with inter-quartile bands over seeds; the
on-policy baseline is drawn black and dashed; configurations are named by their meaning."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from replay_exp.analysis.curves import pareto_envelope  # noqa: E402

TELEMETRY = {
    "off_policiness": "off-policiness (steps since generation)",
    "replay_count": "replay count (uses over the run)",
    "steps_since_last_use": "steps since last use",
}


def save_png(fig, path: Path, dpi: int = 130) -> Path:
    """``fig`` as a palette PNG of 256 colours at ``path`` (and closed): a line plot loses
    nothing visible and takes a quarter of the bytes of matplotlib's RGBA file (257 kB -> 63
    kB for a 16-curve figure), what keeps the committed study figures under the tree's cap."""

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    quantize_png(path)
    return path


def quantize_png(path: Path) -> None:
    """Rewrite the PNG at ``path`` with a 256-colour palette (deterministic, lossless for
    figures of fewer colours)."""
    from PIL import Image

    with Image.open(path) as im:
        rgb = im.convert("RGB")
    rgb.quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(path, optimize=True)


def _save(fig, data: pd.DataFrame, path: Path) -> list[Path]:
    path = Path(path).with_suffix(".png")
    fig.tight_layout()
    save_png(fig, path)
    csv = path.with_suffix(".csv")
    data.to_csv(csv, index=False)
    return [path, csv]


def _style(label: str, baseline: str | None, i: int) -> dict:
    if label == baseline:
        return {"color": "black", "linestyle": "--", "linewidth": 2.0}
    return {"color": plt.get_cmap("tab10")(i % 10), "linewidth": 1.6}


def plot_curves(
    curves: pd.DataFrame,
    path: Path,
    x_label: str,
    y_label: str,
    baseline: str | None = None,
    logx: bool = False,
    title: str | None = None,
) -> list[Path]:
    """Seed mean (the report's point estimate) and IQR band over seeds of each configuration
    (rows of :func:`aggregate`)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    i = 0
    for label, g in curves.groupby("label", sort=False):
        style = _style(label, baseline, i)
        i += label != baseline
        n = int(g["n_runs"].iloc[0])
        ax.plot(g["x"], g["mean"], label=f"{label} (n={n})", **style)
        ax.fill_between(g["x"], g["q25"], g["q75"], color=style["color"], alpha=0.15, lw=0)
    ax.set(xlabel=x_label, ylabel=y_label, title=title)
    if logx:
        ax.set_xscale("symlog", linthresh=max(float(curves["x"][curves["x"] > 0].min()), 1e-9))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title="mean, IQR over seeds", title_fontsize=8)
    return _save(fig, curves, path)


def plot_pareto(
    curves: pd.DataFrame,
    families: dict[str, str],
    path: Path,
    x_label: str,
    y_label: str,
    baseline_family: str | None = None,
) -> list[Path]:
    """One Pareto envelope per family of configurations (``families`` maps a config label to
    its family, e.g. "FIFO N=256" for all its learning rates), over their seed-mean curves."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = []
    for _, g in curves.groupby("label", sort=False):
        ax.plot(g["x"], g["mean"], color="0.75", linewidth=0.8)
    fams = list(dict.fromkeys(families[label] for label in curves["label"].unique()))
    for i, fam in enumerate(fams):
        members = [label for label, f in families.items() if f == fam]
        env = pareto_envelope(curves[curves["label"].isin(members)])
        env.insert(0, "family", fam)
        rows.append(env)
        style = _style(fam, baseline_family, i)
        ax.plot(env["x"], env["best"], label=f"{fam} (best of {len(members)})", **style)
    ax.set(xlabel=x_label, ylabel=f"best {y_label} so far", title="Pareto envelopes")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title="grey: each configuration's mean", title_fontsize=8)
    data = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
    return _save(fig, data, path)


def plot_heatmaps(
    table: pd.DataFrame,
    row_key: str,
    col_key: str,
    path: Path,
    row_label: str,
    col_label: str,
    target: float,
    x_unit: str,
) -> list[Path]:
    """Two heatmaps over ``row_key`` x ``col_key`` (columns of ``table``, one row per
    configuration from :func:`target_table`): the peak of the seed-mean accuracy, and the
    compute to reach ``target`` on the seed-mean curve ("-" where it is never reached)."""
    table = table.assign(
        **{row_key: table[row_key].astype(str), col_key: table[col_key].astype(str)}
    )
    rows = list(dict.fromkeys(table[row_key]))
    cols = list(dict.fromkeys(table[col_key]))
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.6 * len(rows) + 2.4))
    panels = [
        ("peak", "peak seed-mean accuracy", "viridis", "{:.3f}"),
        ("x_to_target", f"compute to reach {target:.3f}", "viridis_r", "{:.3g}"),
    ]
    for ax, (value, title, cmap, fmt) in zip(axes, panels, strict=True):
        grid = np.full((len(rows), len(cols)), np.nan)
        for _, r in table.iterrows():
            v = r[value]
            grid[rows.index(r[row_key]), cols.index(r[col_key])] = v if np.isfinite(v) else np.nan
        im = ax.imshow(grid, cmap=cmap, aspect="auto")
        mid = np.nanmean(grid) if np.isfinite(grid).any() else 0.0
        for (i, j), v in np.ndenumerate(grid):
            dark = (v < mid) == (cmap == "viridis")  # text readable on the cell's colour
            ax.text(j, i, "-" if np.isnan(v) else fmt.format(v), ha="center", va="center",
                    color="white" if dark else "black", fontsize=9)  # fmt: skip
        ax.set_xticks(range(len(cols)), [str(c) for c in cols])
        ax.set_yticks(range(len(rows)), [str(r) for r in rows])
        ax.set(xlabel=col_label, ylabel=row_label, title=title)
        bar = fig.colorbar(im, ax=ax, shrink=0.8)
        if value == "x_to_target":
            bar.set_label(x_unit, fontsize=8)
    return _save(fig, table[[row_key, col_key, "label", "peak", "x_to_target"]], path)


def plot_passk_gain(final: pd.DataFrame, baseline: str, path: Path) -> list[Path]:
    """pass@k of each configuration minus the baseline's, vs k (log2), at the last evaluation.
    ``final``: one row per run with ``label`` and ``eval/pass@{k}_sampled`` columns. Mean over
    seeds of the configuration minus the baseline's mean (the point estimate of the report's
    pass@k table); bars: the configuration's IQR over seeds, relative to the same mean."""
    ks = sorted(
        int(c.split("@")[1].split("_")[0]) for c in final if c.startswith("eval/pass@") and
        c.endswith("_sampled")
    )  # fmt: skip
    base = final[final["label"] == baseline]
    rows = []
    for label, g in final.groupby("label", sort=False):
        for k in ks:
            col = f"eval/pass@{k}_sampled"
            ref = float(base[col].mean())
            vals = g[col].to_numpy(dtype=float)
            q25, q75 = np.percentile(vals, [25, 75])
            rows.append({"label": label, "k": k, "gain": vals.mean() - ref, "q25": q25 - ref,
                         "q75": q75 - ref, "baseline": ref})  # fmt: skip
    data = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    i = 0
    for label, g in data.groupby("label", sort=False):
        style = _style(label, baseline, i)
        i += label != baseline
        # The IQR as a bar of its own: a mean may lie outside its seeds' IQR.
        ax.plot(g["k"], g["gain"], marker="o", label=label, **style)
        ax.vlines(g["k"], g["q25"], g["q75"], color=style["color"], linewidth=1.2)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set(xlabel="k (samples per problem)", ylabel="pass@k gain over the baseline",
           title="pass@k gain vs k (last evaluation)")  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, data, path)


def plot_telemetry(runs: pd.DataFrame, path: Path, names: Sequence[str] = tuple(TELEMETRY)):
    """Histograms of the buffer's per-use statistics (run_dir/buffer_telemetry.json), summed
    over each configuration's seeds and normalised; the last bin holds everything >= 64."""
    rows = []
    for _, r in runs.iterrows():
        f = Path(r["run_dir"]) / "buffer_telemetry.json"
        if not f.is_file():
            continue
        t = json.loads(f.read_text())
        for name in names:
            for b, c in enumerate(t.get(name, [])):
                rows.append({"label": r["label"], "stat": name, "bin": b, "count": c})
    data = pd.DataFrame(rows, columns=["label", "stat", "bin", "count"])
    data = data.groupby(["label", "stat", "bin"], sort=False, as_index=False)["count"].sum()
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.8))
    for ax, name in zip(np.atleast_1d(axes), names, strict=True):
        stat = data[data["stat"] == name]
        last = stat.loc[stat["count"] > 0, "bin"].max() if (stat["count"] > 0).any() else 1
        ax.set_xlim(-0.5, last + 1.5)
        for i, (label, g) in enumerate(stat.groupby("label", sort=False)):
            total = g["count"].sum()
            if total == 0:
                continue
            ax.step(g["bin"], g["count"] / total, where="mid", label=label,
                    color=plt.get_cmap("tab10")(i % 10))  # fmt: skip
        ax.set_yscale("log")
        ax.set(xlabel=f"{TELEMETRY.get(name, name)} (last bin: >= 64)", ylabel="fraction")
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].legend(fontsize=7)
    return _save(fig, data, path)


def plot_composition(
    curves: pd.DataFrame,
    stats: dict[str, str],
    path: Path,
    x_label: str,
    baseline: str | None = None,
) -> list[Path]:
    """What was trained on minus what was generated, over each evaluation interval, vs x: one
    panel per stat (``stats``: name -> axis label), one line per configuration (seed mean, IQR
    band over seeds; rows of :func:`replay_exp.analysis.studies.composition.composition_curves`).
    Above 0: the trained samples have more of it than the rollouts generated (e.g. a pass rate
    above 0: hard problems are starved)."""
    fig, axes = plt.subplots(1, len(stats), figsize=(4.6 * len(stats), 4.0), squeeze=False)
    labels = list(dict.fromkeys(curves["label"]))
    for ax, (stat, name) in zip(axes[0], stats.items(), strict=True):
        i = 0
        for label in labels:
            g = curves[(curves["stat"] == stat) & (curves["label"] == label)]
            style = _style(label, baseline, i)
            i += label != baseline
            if g.empty:
                continue
            n = int(g["n_runs"].iloc[0])
            ax.plot(g["x"], g["mean"], marker="o", markersize=3, label=f"{label} (n={n})", **style)
            ax.fill_between(g["x"], g["q25"], g["q75"], color=style["color"], alpha=0.15, lw=0)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set(xlabel=x_label, ylabel="trained - generated", title=name)
        ax.grid(alpha=0.3)
    if len(curves):
        axes[0][0].legend(fontsize=8, title="mean, IQR over seeds", title_fontsize=8)
    fig.suptitle("Trained vs generated data, per evaluation interval", fontsize=10)
    return _save(fig, curves, path)
