"""The analysis notebooks (``analysis/*.ipynb``) run headless end to end on the tiny sweeps and
write their figures and tables; and they are stored clean (no outputs, no execution counts).

Each notebook reads its sweep and output folder from ``REPLAY_EXP_SWEEP`` / ``REPLAY_EXP_OUT``;
the kernel inherits the test's environment, so ``monkeypatch.setenv`` points it at a fixture.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "analysis"

# (notebook, tiny sweep of the ``tiny_sweeps`` fixture): every notebook in analysis/ appears
# here (test_every_notebook_is_executed), so a new notebook cannot go untested.
CASES = {
    "compute_vs_accuracy": ("compute_vs_accuracy", "compute"),
    "buffer_heatmap": ("buffer_heatmap", "heatmap"),
    "telemetry_and_passk": ("telemetry_and_passk", "compute"),
    "telemetry_and_passk-no_baseline": ("telemetry_and_passk", "heatmap"),
    "theory": ("theory", "compute"),
}
COMPUTE_LABELS = {"on-policy", "FIFO, y=2"}
HEATMAP_LABELS = {"N=32, (6,2)", "N=32, (4,4)", "N=64, (6,2)", "N=64, (4,4)"}
CURVE_COLUMNS = ["config", "label", "x", "mean", "median", "q25", "q75"]


def _png(path: Path) -> None:
    assert path.is_file(), path
    assert path.stat().st_size > 5_000, path
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path


def _csv(path: Path, columns: list[str]) -> pd.DataFrame:
    assert path.is_file(), path
    table = pd.read_csv(path)
    assert len(table) > 0, path
    assert set(columns) <= set(table.columns), (path, list(table.columns))
    return table


@pytest.fixture(scope="session")
def jupyter_dir(tmp_path_factory) -> Path:
    """A ``python3`` kernelspec that launches *this* interpreter, in a private JUPYTER_PATH.

    The venv's own spec (``.venv/share/jupyter/kernels/python3``) says ``"python"``, which
    jupyter_client maps to ``sys.executable``; but a ``python3`` spec in the user's data dir
    (``~/.local/share/jupyter``) takes precedence over the venv's and may point to another
    Python without replay_exp. JUPYTER_PATH comes first in Jupyter's search path, so a spec
    written here, with the absolute path of the test's interpreter, is the one nbclient uses,
    whatever the machine has installed. Written in process (ipykernel's ``install``, the code
    behind ``python -m ipykernel install --prefix``)."""
    from ipykernel.kernelspec import install

    prefix = tmp_path_factory.mktemp("jupyter")
    install(kernel_name="python3", prefix=str(prefix))
    return prefix / "share" / "jupyter"


def _execute(name: str, sweep: Path, out: Path, tmp_path: Path, monkeypatch, jupyter_dir):
    """Run ``analysis/<name>.ipynb`` in a fresh kernel; returns the executed notebook and the
    text it printed. Raises (failing the test) on the first cell that errors."""
    import nbclient

    monkeypatch.setenv("REPLAY_EXP_SWEEP", str(sweep))
    monkeypatch.setenv("REPLAY_EXP_OUT", str(out))
    monkeypatch.setenv("JUPYTER_PATH", str(jupyter_dir))
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")  # silences jupyter_core's path warning
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))  # no user startup scripts
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    images = sum("image/png" in o.get("data", {}) for o in outputs)
    assert images >= 1, f"{name}: no figure displayed inline"
    return nb, text


def _check_compute_vs_accuracy(out: Path, text: str) -> None:
    for axis in ("compute", "steps", "wall"):
        _png(out / f"curves_{axis}.png")
        curves = _csv(out / f"curves_{axis}.csv", CURVE_COLUMNS)
        assert set(curves["label"]) == COMPUTE_LABELS
        assert curves["config"].nunique() == 2
    _png(out / "pareto_compute.png")
    pareto = _csv(out / "pareto_compute.csv", ["family", "x", "best", "label"])
    assert set(pareto["family"]) == {"on-policy", "replay"}
    targets = _csv(out / "targets.csv", ["label", "peak", "x_to_target"])
    assert targets["label"].tolist() == ["on-policy", "FIFO, y=2"]  # baseline first
    assert "saving_vs_baseline" in targets
    assert "baseline: on-policy" in text
    stats = _csv(out / "stats.csv", ["label", "final", "final_lo", "final_hi", "final_verdict"])
    assert stats["label"].tolist() == ["FIFO, y=2"]
    assert set(stats["final_verdict"]) <= {"better", "worse", "not separable"}
    assert (stats["final_lo"] <= stats["final"]).all() and (
        stats["final"] <= stats["final_hi"]
    ).all()


def _check_buffer_heatmap(out: Path, text: str) -> None:
    report = out / "report"
    _png(report / "heatmap.png")
    heat = _csv(report / "heatmap.csv", ["buffer.capacity", "(W,T)", "label", "peak"])
    assert sorted(zip(heat["buffer.capacity"], heat["(W,T)"], strict=True)) == [
        (32, "(4,4)"), (32, "(6,2)"), (64, "(4,4)"), (64, "(6,2)"),
    ]  # fmt: skip
    assert set(heat["label"]) == HEATMAP_LABELS
    _png(report / "curves_compute.png")
    assert len(_csv(report / "runs.csv", ["label", "seed", "status"])) == 8
    assert len(_csv(report / "targets.csv", ["label", "x_to_target"])) == 4
    assert "heatmap axes: ('buffer.capacity', '(W,T)')" in text


def _check_telemetry_and_passk(out: Path, text: str) -> None:
    _png(out / "telemetry.png")
    tele = _csv(out / "telemetry.csv", ["label", "stat", "bin", "count"])
    assert set(tele["label"]) == COMPUTE_LABELS
    assert {"off_policiness", "replay_count", "steps_since_last_use"} <= set(tele["stat"])
    _png(out / "passk_gain.png")
    gain = _csv(out / "passk_gain.csv", ["label", "k", "gain", "q25", "q75", "baseline"])
    assert sorted(set(gain["k"])) == [1, 4] and set(gain["label"]) == COMPUTE_LABELS
    assert (gain.query("label == 'on-policy'")["gain"] == 0).all()  # against itself


def _check_telemetry_no_baseline(out: Path, text: str) -> None:
    _png(out / "telemetry.png")
    assert set(_csv(out / "telemetry.csv", ["label"])["label"]) == HEATMAP_LABELS
    assert not (out / "passk_gain.png").exists()
    assert "has no on-policy baseline, so there is no pass@k gain" in text


def _check_theory(out: Path, text: str) -> None:
    _png(out / "theory_xy_vs_mu.png")
    _png(out / "theory_K.png")
    _csv(out / "theory_xy_vs_mu.csv", ["alpha", "rho", "mu", "x_star", "y_star", "on_policy"])
    _csv(out / "theory_K.csv", ["alpha", "rho", "mu", "x", "K_rel"])
    ex = _csv(out / "worked_examples.csv", ["x_closed_form", "y_closed_form", "x_numeric"])
    # The paper's worked examples, closed form and numeric.
    for col in ("x_closed_form", "x_numeric"):
        assert ex[col].iloc[:2].tolist() == pytest.approx([14.3, 0.19], rel=0.01)
    for col in ("y_closed_form", "y_numeric"):
        assert ex[col].iloc[:2].tolist() == pytest.approx([5.6, 0.4], rel=0.01)
    assert ex["on_policy"].tolist() == [False, True, False]
    assert "theory (mu=6.84, alpha=0.1, rho=0.1)" in text  # the recommendation at mu = 6.84
    assert "recommendation at the measured mu" in text  # and at the sweep's measured mu


CHECKS = {
    "compute_vs_accuracy": _check_compute_vs_accuracy,
    "buffer_heatmap": _check_buffer_heatmap,
    "telemetry_and_passk": _check_telemetry_and_passk,
    "telemetry_and_passk-no_baseline": _check_telemetry_no_baseline,
    "theory": _check_theory,
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_notebook_runs_on_a_tiny_sweep(case, tiny_sweeps, tmp_path, monkeypatch, jupyter_dir):
    name, sweep = CASES[case]
    out = tmp_path / "out"
    _, text = _execute(name, tiny_sweeps[sweep], out, tmp_path, monkeypatch, jupyter_dir)
    CHECKS[case](out, text)


def test_every_notebook_is_executed():
    stored = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
    assert stored == sorted({name for name, _ in CASES.values()})
    assert set(CHECKS) == set(CASES)


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_notebook_is_stored_clean(path):
    nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
    nbformat.validate(nb)
    assert nb.nbformat == 4
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, path
    for cell in code:
        assert cell.outputs == [], f"{path.name}: stored with outputs"
        assert cell.execution_count is None, f"{path.name}: stored with execution counts"
    assert nb.cells[0].cell_type == "markdown"  # the question and the sweeps it serves
    first = code[0].source
    assert "REPLAY_EXP_SWEEP" in first and "REPLAY_EXP_OUT" in first
