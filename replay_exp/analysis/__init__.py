"""From sweep directories to tidy tables, curves over seeds, Pareto envelopes, figures and a
report: ``replay-exp-report <sweep_dir>`` (:mod:`replay_exp.analysis.report`)."""

from replay_exp.analysis.curves import (
    X_AXES,
    aggregate,
    compute_to_target,
    drawdown,
    interpolate,
    make_grid,
    pareto_envelope,
    pareto_front,
    run_curves,
    target_table,
    x_column,
    x_label,
)
from replay_exp.analysis.labels import config_label
from replay_exp.analysis.loader import Runs, find_run_dirs, from_records, load_runs

__all__ = [
    "X_AXES",
    "Runs",
    "aggregate",
    "compute_to_target",
    "config_label",
    "drawdown",
    "find_run_dirs",
    "from_records",
    "interpolate",
    "load_runs",
    "make_grid",
    "pareto_envelope",
    "pareto_front",
    "run_curves",
    "target_table",
    "x_column",
    "x_label",
]
