"""The node's time of a run, the x-axis ``node`` (column ``runtime/node_time``): how long a GPU
node would take, in units of t, one GPU's seconds to train one sample.

- ``runtime=distributed`` logs it, measured: the node's wall-clock less evaluations and
  snapshots, over its trainers' measured t (replay_exp/runtime/accounting.py). With
  ``runtime.generation_cost=modelled`` that is a GPU node's timing on this machine.
- An in-process run has no node clock, so :func:`modelled_node_time` models one on a node of
  ``gpus`` GPUs (the paper's 8) with the cost model of ``generation_cost=modelled``
  (replay_exp/compute/gencost.py: a rollout costs mu t on average on its GPU, a GPU's batch
  lasts as long as its longest response, lengths log-normal with log-sd ``sigma``):

  - ``schedule=sync`` (the on-policy baseline and synchronous replay): the whole node
    generates the step's R rollouts, R / g on each of the g GPUs, and waits for the slowest
    GPU, then trains B on all g. Step j lasts

        B / g + mu (R / g) M_j / E[M_(R/g)]

    where M_j is the longest of all R responses (the slowest GPU's longest) and E[M_(R/g)]
    the expected longest of one GPU's R / g (each GPU alone generates at mu t per rollout on
    average; waiting for the slowest is the stall). M_j is drawn by its quantile at levels
    stratified in blocks of 8 steps (:func:`replay_exp.compute.lengthmodel.quantile_levels`,
    stream ``"node"``), so the same run always gets the same clock.
  - ``schedule=async`` (the emulated cluster): its premise is trainers that never wait, so a
    step lasts B / T (the T trainers training B), gamma B (1 + mu) / g for W + T = g: node time
    is then compute times a constant, with no stalls.

  Without stalls (sigma = 0) a sync on-policy step lasts B (1 + mu) / g, one paper unit's
  worth, so the node axis differs from the compute axis only by the stalls the model puts in
  the synchronous runs (and, for real runs, whatever the runtime measured).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replay_exp.compute.lengthmodel import BLOCK, expected_max, longest, quantile_levels

NODE_GPUS = 8  # the paper's node
LENGTH_SIGMA = 0.5  # runtime.cost_model.length_sigma's default
COLUMN = "runtime/node_time"


def sync_step_times(
    steps: int, batch: int, rollouts: int, mu: float, seed: int,
    gpus: int = NODE_GPUS, sigma: float = LENGTH_SIGMA,
) -> np.ndarray:  # fmt: skip
    """Node time of each of ``steps`` synchronous steps (module docstring)."""
    per_gpu = max(1.0, rollouts / gpus)
    norm = expected_max(max(1, round(per_gpu)), sigma)
    blocks = [quantile_levels(seed, "node", b) for b in range(-(-steps // BLOCK))]
    levels = np.concatenate(blocks)[:steps] if blocks else np.zeros(0)
    m = np.array([longest(u, rollouts, sigma) for u in levels])
    return batch / gpus + mu * per_gpu * m / norm


def modelled_node_time(
    cfg: dict[str, Any], step: np.ndarray, gpus: int = NODE_GPUS, sigma: float = LENGTH_SIGMA
) -> np.ndarray:
    """Node time after each of the policy updates in ``step`` (an in-process run's flat
    config ``cfg``, as the loader reads it)."""
    step = np.asarray(step, dtype=float)
    B = cfg["schedule.batch_size"]
    if cfg.get("schedule.name") == "async":
        return step * B / cfg["schedule.trainers"]
    last = int(np.nanmax(step)) if len(step) else 0
    per_step = sync_step_times(
        last, B, cfg["derived.rollouts_per_step"], cfg["compute.mu"], int(cfg["seed"]),
        gpus=gpus, sigma=sigma,
    )  # fmt: skip
    cumulative = np.concatenate([[0.0], np.cumsum(per_step)])
    out = np.full(len(step), np.nan)
    ok = ~np.isnan(step)
    out[ok] = cumulative[step[ok].astype(int)]
    return out
