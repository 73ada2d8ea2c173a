"""Per-use telemetry of a buffer: what the paper's Figure 2 plots, and the batch statistics.

At every use of a rollout (a row of a sampled batch at training step ``step``) it records:
- ``off_policiness`` = step - version (policy versions between the generating and the current
  weights; the ``version_lag`` of the stats keys),
- ``age`` = step - created_step (0 at the step that generated it),
- ``prev_uses`` = uses before this one,
- ``steps_since_last_use`` = step - the step of its previous use; a first use has none and is
  counted in ``first_uses`` instead.
When a rollout leaves the buffer (evicted, or retired after ``max_reuse`` uses / consumed by
``on_policy``) its lifetime ``replay_count`` (total uses) is recorded.

Histograms are cumulative over the run, one integer bin per value 0..63 plus an overflow bin
(index 64) for every value >= 64; negative values (impossible in the loop) count in bin 0.
Batch statistics use the last sampled batch: p50/p90 are the smallest recorded value v with at
least 50% / 90% of the batch <= v (``numpy.quantile(method="inverted_cdf")``).
"""

from __future__ import annotations

import math

import numpy as np

from replay_exp.buffer.store import to_numpy, to_tensor

BINS = 64  # per-value bins 0..63; index BINS is the overflow bin (values >= 64)
USE_FIELDS = ("off_policiness", "age", "prev_uses", "steps_since_last_use")
HISTS = (*USE_FIELDS, "replay_count")
_TOTALS = (
    "uses",
    "first_uses",
    "fresh_uses",  # uses at age 0
    "off_policiness",
    "age",
    "prev_uses",
    "steps_since_last_use",  # summed over uses that are not first uses
    "departed",
    "replay_count",  # summed over departed rollouts
)
# stats key stem for each use field (the existing keys say version_lag for off-policiness)
_STEM = {
    "off_policiness": "version_lag",
    "age": "age",
    "prev_uses": "prev_uses",
    "steps_since_last_use": "since_last_use",
}


def histogram(values: np.ndarray) -> np.ndarray:
    """Counts of ``values`` in bins 0..63 plus the overflow bin: int64[65]."""
    v = np.minimum(np.maximum(values, 0), BINS)  # (np.clip is ~10x slower on small arrays)
    return np.bincount(v, minlength=BINS + 1).astype(np.int64)


def _summary(x: np.ndarray) -> tuple[float, float, float, float]:
    if len(x) == 0:
        return (math.nan,) * 4
    p50, p90 = np.quantile(x, [0.5, 0.9], method="inverted_cdf")
    return float(x.mean()), float(x.max()), float(p50), float(p90)


class Telemetry:
    """Cumulative histograms and totals, and the last batch's per-use values."""

    def __init__(self):
        self.hist = {k: np.zeros(BINS + 1, dtype=np.int64) for k in HISTS}
        self.totals = dict.fromkeys(_TOTALS, 0)
        self.last_step = -1  # step of the last recorded batch
        # per-use values of the last batch; steps_since_last_use is -1 on a first use
        self.last = {k: np.zeros(0, dtype=np.int64) for k in USE_FIELDS}

    def record_uses(
        self,
        step: int,
        version: np.ndarray,
        created_step: np.ndarray,
        prev_uses: np.ndarray,
        last_used_step: np.ndarray,
    ) -> None:
        """One batch: metadata of its rows BEFORE this use is recorded in the store."""
        first = last_used_step < 0
        vals = {
            "off_policiness": step - version,
            "age": step - created_step,
            "prev_uses": prev_uses.astype(np.int64),
            "steps_since_last_use": np.where(first, -1, step - last_used_step),
        }
        for k in ("off_policiness", "age", "prev_uses"):
            self.hist[k] += histogram(vals[k])
            self.totals[k] += int(vals[k].sum())
        since = vals["steps_since_last_use"][~first]
        self.hist["steps_since_last_use"] += histogram(since)
        self.totals["steps_since_last_use"] += int(since.sum())
        self.totals["uses"] += len(first)
        self.totals["first_uses"] += int(first.sum())
        self.totals["fresh_uses"] += int((vals["age"] == 0).sum())
        self.last_step = step
        self.last = vals

    def record_departures(self, uses: np.ndarray) -> None:
        """Rollouts leaving the buffer, with their lifetime use counts."""
        self.hist["replay_count"] += histogram(uses)
        self.totals["departed"] += len(uses)
        self.totals["replay_count"] += int(uses.sum())

    @staticmethod
    def merged(parts: list[Telemetry]) -> Telemetry:
        """Sum of the parts (shards); the last batch joins the parts sampled at the latest
        step (a shard that was empty at that step contributes nothing)."""
        if len(parts) == 1:
            return parts[0]
        out = Telemetry()
        for p in parts:
            for k in HISTS:
                out.hist[k] += p.hist[k]
            for k in _TOTALS:
                out.totals[k] += p.totals[k]
        out.last_step = max(p.last_step for p in parts)
        now = [p for p in parts if p.last_step == out.last_step]
        out.last = {k: np.concatenate([p.last[k] for p in now]) for k in USE_FIELDS}
        return out

    def stats(self) -> dict[str, float]:
        """``batch_*`` (last batch; NaN before the first) and ``run_*`` (whole run) floats."""
        nan = math.nan
        last, t = self.last, self.totals
        n = len(last["age"])
        first = last["steps_since_last_use"] < 0
        out: dict[str, float] = {"batch_size": float(n)}
        for k in USE_FIELDS:
            x = last[k][~first] if k == "steps_since_last_use" else last[k]
            mean, mx, p50, p90 = _summary(x)
            stem = _STEM[k]
            out.update(
                {
                    f"batch_{stem}_mean": mean,
                    f"batch_{stem}_max": mx,
                    f"batch_{stem}_p50": p50,
                    f"batch_{stem}_p90": p90,
                }
            )
        out["batch_frac_fresh"] = float((last["age"] == 0).mean()) if n else nan
        out["batch_frac_first_use"] = float(first.mean()) if n else nan
        uses, repeat = t["uses"], t["uses"] - t["first_uses"]
        out.update(
            {
                "run_version_lag_mean": t["off_policiness"] / uses if uses else nan,
                "run_age_mean": t["age"] / uses if uses else nan,
                "run_prev_uses_mean": t["prev_uses"] / uses if uses else nan,
                "run_since_last_use_mean": t["steps_since_last_use"] / repeat if repeat else nan,
                "run_frac_first_use": t["first_uses"] / uses if uses else nan,
                "run_frac_fresh": t["fresh_uses"] / uses if uses else nan,
                "run_replay_count_mean": (
                    t["replay_count"] / t["departed"] if t["departed"] else nan
                ),
            }
        )
        return out

    def state_dict(self) -> dict:
        return {
            "hist": {k: to_tensor(v) for k, v in self.hist.items()},
            "totals": dict(self.totals),
            "last_step": self.last_step,
            "last": {k: to_tensor(v) for k, v in self.last.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.hist = {k: to_numpy(state["hist"][k]) for k in HISTS}
        self.totals = {k: int(state["totals"][k]) for k in _TOTALS}
        self.last_step = int(state["last_step"])
        self.last = {k: to_numpy(state["last"][k]) for k in USE_FIELDS}
