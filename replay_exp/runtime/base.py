"""What the one loop (``replay_exp.loop.train``) asks of a runtime: where the step's fresh
rollouts come from, and what is shared between trainer processes; and the one generation
step (:func:`generate_groups`) both sources of rollouts run.

Two runtimes implement it:

- ``InProcess`` (``runtime=inprocess``, ``replay_exp.runtime.inprocess``): the loop generates
  its own rollouts (R per step under the sync schedule, the emulated cluster's deterministic
  arrivals under async); nothing is shared (one process).
- ``TrainerRank`` (``runtime=distributed``, ``replay_exp.runtime.trainer``): the rollouts are
  what W generator ranks delivered to this trainer's inbox; gradients are all-reduced (DDP) or
  sharded (FSDP), and ledgers, buffer views and the snapshot are gathered on trainer rank 0.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from replay_exp.compute.ledger import Ledger
from replay_exp.config.seeding import derive_seed
from replay_exp.models.build import BuiltPolicy
from replay_exp.rollout import SamplingParams
from replay_exp.rollout.base import Generator
from replay_exp.rollout.collect import generate_rollouts, with_trainer_logp
from replay_exp.types import RolloutBatch


@dataclass
class Arrival:
    """Fresh rollouts for this step: scored, advantages frozen, with the seconds their
    generation took and any statistics of their making (``generation/*``)."""

    batch: RolloutBatch
    seconds: float
    stats: dict[str, float] = field(default_factory=dict)


class Runtime(Protocol):
    # (step, first_eval, last_eval) of the snapshot every component was restored from; None
    # for a fresh run.
    resumed: tuple[int, dict | None, dict] | None
    # Whether ``take(step, wait=True)`` blocks for deliveries (the generator ranks of
    # runtime=distributed); in process the arrivals of a step are fixed, nothing to wait for.
    can_wait: bool
    # ``runtime.lockstep``: the rollouts each step must bring before it trains (a trainer
    # rank's B / T, every one generated with the step's own weights); 0: whatever arrived.
    whole_step: int

    def take(self, step: int, wait: bool) -> list[Arrival]:
        """The rollouts that arrived for ``step`` (``wait``: the buffer is empty, so return
        at least one unless the step must stop)."""

    def stop_now(self, step: int) -> bool:
        """Whether every trainer stops at ``step`` (a generator rank died)."""

    def after_update(self, version: int, need_weights: bool) -> None:
        """After the optimizer step to ``version``: replicas checked, weights made current
        where ``need_weights`` (an eval or snapshot follows) or a push is due, pushed."""

    def node_ledger(self) -> Ledger:
        """The whole node's compute (every trainer rank's ledger merged)."""

    def gather(self, obj: Any) -> list | None:
        """Every trainer's ``obj``, in rank order, on the lead (None elsewhere); a collective."""

    def broadcast(self, obj: Any) -> Any:
        """The lead's ``obj`` on every trainer; a collective."""

    def gather_step(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """On the lead: ``{"ranks": [every trainer's record], "buffers": [buffer views]}``."""

    def metrics(self, led: Ledger) -> dict[str, Any]:
        """``runtime/*`` and ``policy/generator_version`` of a logged row."""

    def evaluator(self, version: int) -> tuple[Any, torch.nn.Module]:
        """(generation backend, module) holding the weights of ``version``, to evaluate."""

    def paused(self) -> AbstractContextManager:
        """A block during which the node stands still (an evaluation): generator ranks start
        no call, and its seconds are left out of ``runtime/node_seconds``."""

    def save(self, step: int, **evals: Any) -> None:
        """Snapshot every component (a collective across trainer ranks)."""

    def finish(self, final_step: int, add_arrivals: Any) -> dict[str, Any]:
        """Stop the generators, ``add_arrivals`` (charge and buffer) what is still in flight;
        on the lead the counts
        ``account`` balances, ``generators`` (each generator process's report) and
        ``stopped`` (why the run stopped early)."""

    def final_model(self) -> torch.nn.Module | None:
        """The trained policy with its full weights (on the lead; a collective)."""

    def close(self) -> None: ...


def generate_groups(
    cfg: Any,
    d: Any,
    built: BuiltPolicy,
    engine: Generator,
    *,
    n_groups: int,
    first_group: int,
    version: int,
    seed_tags: tuple,
    stream: str = "",
) -> Arrival:
    """One generation step, the same in process (``runtime/inprocess.py``), on a generator rank
    (``runtime/generator.py``) and in the noise measurement: ``n_groups`` prompts -> G samples
    each from ``engine`` -> rewards -> group advantages, frozen now -> behaviour log-probs.

    The prompts are drawn with ``derive_seed(seed, stream + "prompts", *seed_tags)`` and
    sampled with ``derive_seed(seed, stream + "gen", *seed_tags)``; the groups are numbered
    from ``first_group`` (rollout uids from ``first_group * G``) and stamped with the policy
    ``version`` that generated them. Under ``generation.behaviour_logp=trainer`` the stored
    behaviour log-probs are ``built.policy``'s (the generating weights, in process only);
    under ``generation.store_trainer_logp`` the engine's stay and the engine mismatch
    (``built.policy`` minus engine) is stored beside them, and the arrival's stats carry
    ``behaviour_logp_absdiff_*``."""
    a, g = cfg.algo, cfg.generation
    t0 = time.perf_counter()
    rng = np.random.default_rng(derive_seed(cfg.seed, stream + "prompts", *seed_tags))
    prompts = built.task.sample_train(rng, n_groups)
    decoding = SamplingParams(g.temperature, g.top_p, d.max_new_tokens)
    fresh = generate_rollouts(
        engine, built.tokenizer, built.task, prompts, a.group_size, decoding,
        seed=derive_seed(cfg.seed, stream + "gen", *seed_tags), step=version,
        first_uid=first_group * a.group_size, first_group=first_group,
        advantage=dict(normalize_std=a.adv_normalize_std, std=a.adv_std, eps=a.adv_eps),
        chat=built.chat,
    )  # fmt: skip
    stats = {}
    if g.behaviour_logp == "trainer" or g.store_trainer_logp:  # the generating weights'
        use = "behaviour" if g.behaviour_logp == "trainer" else "gap"
        fresh, stats = with_trainer_logp(
            built.policy, fresh, g.temperature, use, a.micro_batch_size
        )
    return Arrival(fresh, time.perf_counter() - t0, stats)
