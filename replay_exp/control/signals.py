"""What a replay controller reads: training-side signals, accumulated over the window of steps
since its last decision. Never the held-out evaluation.

Per step (from the update's statistics, ``policy_update(signals=True)``, and the step's data):

- ``kl``: KL(behaviour || current) of the batch's tokens before the update (``loss/approx_kl``,
  the k3 estimate): how stale the trained data is;
- ``clip_frac``: tokens whose gradient the PPO clip zeroed (NaN for a loss without one);
- ``ess``: the batch's sequence-level effective sample size over its rows (``ess_frac``);
- ``grad_norm``: the update's gradient norm (before clipping);
- ``fresh_reward`` / ``trained_reward``: mean reward of the step's generated rollouts and of
  the trained batch;
- ``rows``: each trained row's lag (versions since it was generated) and sequence
  log-importance-weight, for the model-based policy's estimate of alpha.

The window's summary is the mean of each scalar over its steps (NaN values left out; under
``runtime=distributed`` over every trainer rank's values), the number of steps and ``lag``,
the mean lag of every row the window trained (NaN: none recorded). Its state (a snapshot
mid-window) is tensors and lists only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

SCALARS = ("kl", "clip_frac", "ess", "grad_norm", "fresh_reward", "trained_reward")


class Window:
    """The signals of the steps since the last decision."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.values: dict[str, list[float]] = {k: [] for k in SCALARS}
        self.rows: list[tuple[np.ndarray, np.ndarray]] = []  # (lag, log w) per step

    def __len__(self) -> int:
        return len(self.steps)

    def add(self, step: int, stats: dict[str, Any], fresh_reward: float,
            trained_reward: float) -> None:  # fmt: skip
        """One step's signals: ``stats`` is the update's (``control_rows`` popped from it)."""
        nan = math.nan
        got = {
            "kl": stats.get("approx_kl", nan),
            "clip_frac": stats.get("clip_frac", nan),
            "ess": stats.get("ess_frac", nan),
            "grad_norm": stats.get("grad_norm", nan),
            "fresh_reward": fresh_reward,
            "trained_reward": trained_reward,
        }
        self.steps.append(int(step))
        for k in SCALARS:
            self.values[k].append(float(got[k]))
        rows = stats.get("control_rows")
        if rows is not None:
            self.rows.append((np.asarray(rows["lag"], np.int64), np.asarray(rows["logw"], float)))

    @classmethod
    def merged(cls, windows: list[Window]) -> Window:
        """One window of several trainer ranks' (``runtime=distributed``) over the same steps:
        their signals and rows pooled, so the summary's means are over every rank's values;
        one window is itself."""
        if len(windows) == 1:
            return windows[0]
        out = cls()
        out.steps = list(windows[0].steps)
        for w in windows:
            for k in SCALARS:
                out.values[k] += w.values[k]
            out.rows += w.rows
        return out

    def summary(self) -> dict[str, float]:
        """Mean of each signal over the window's steps (NaNs left out; NaN if all are) and the
        mean lag of the trained rows."""
        out = {"steps": float(len(self.steps))}
        for k, vals in self.values.items():
            v = np.asarray(vals, float)
            v = v[np.isfinite(v)]
            out[k] = float(v.mean()) if len(v) else math.nan
        lags = [lag for lag, _ in self.rows if len(lag)]
        out["lag"] = float(np.concatenate(lags).mean()) if lags else math.nan
        return out

    def state_dict(self) -> dict:
        return {
            "steps": torch.tensor(self.steps, dtype=torch.long),
            "values": {k: torch.tensor(v, dtype=torch.float64) for k, v in self.values.items()},
            "rows": [(torch.from_numpy(lag), torch.from_numpy(w)) for lag, w in self.rows],
        }

    def load_state_dict(self, state: dict) -> None:
        self.steps = [int(s) for s in state["steps"].tolist()]
        self.values = {k: [float(x) for x in state["values"][k].tolist()] for k in SCALARS}
        self.rows = [(lag.numpy().copy(), w.numpy().copy()) for lag, w in state["rows"]]
