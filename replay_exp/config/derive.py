"""``resolve()``: validate a composed config once and derive every size from it.

Layering: the schemas (``replay_exp.config.schemas``) and ``ConfigError``
(``replay_exp.config.errors``) are leaf modules; this module sits above the registries it
validates names against (buffers, samplers, tasks, losses, backends, loggers), through
``replay_exp.config.checks``, and nothing below imports it.

``resolve()`` reads like a checklist, each part a small function:

1. :func:`~replay_exp.config.checks.check_options`: every option name is known and its node
   has its option's keys;
2. :func:`~replay_exp.config.checks.check_values`: ranges of single keys and the rules between
   keys of one group;
3. the pure derivations, each tested with numbers: :func:`derive_rollouts` (R, the most a step
   brings, the async split), :func:`derive_capacity` (N), :func:`units_per_step`,
   :func:`derive_steps`;
4. :func:`~replay_exp.config.probe.probe_inputs`: the one place with I/O (a local model's
   config.json and tokenizer, the task's data) for the token lengths;
5. the machine: device, dtypes (:func:`derive_precision`), threads.

Each failure is a :class:`ConfigError` with one line naming the keys and values, raised before
any model is built or any file is written.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf

from replay_exp.buffer.positive_bias import correct_slots
from replay_exp.compute import costmodel
from replay_exp.config.checks import check_options, check_values
from replay_exp.config.errors import fail, positive
from replay_exp.config.probe import probe_inputs

log = logging.getLogger("replay_exp")


@dataclass
class Derived:
    """Sizes computed from the config; saved with the run as ``derived``."""

    rollouts_per_step: float  # R (the mean arrivals per step under the async emulation)
    prompts_per_step: float  # R / G
    reuse_ratio: float  # y = B / R
    capacity: int  # N
    staleness_horizon: float  # x = N / R
    total_steps: int
    max_new_tokens: int
    max_prompt_len: int  # tokens, incl. BOS
    paper_units_per_step: float  # (B + mu R) / (B (1 + mu)), or gamma (async); on-policy: 1
    device: str
    threads: int
    dtype: str = "float32"  # the compute dtype: model.dtype with auto resolved
    param_dtype: str = "float32"  # the trained weights' and Adam's (model.param_dtype)
    workers: int | None = None  # W of the async emulation (null under schedule=sync)
    trainers: int | None = None  # T of the async emulation
    # Sizes of one rank (runtime=distributed; one process: the whole run's).
    batch_per_trainer: int = 0  # B / T rollouts each trainer samples per step (B in one process)
    capacity_per_trainer: int = 0  # N / T rollouts in each trainer's buffer shard (N)
    groups_per_batch: int | None = None  # prompt groups per generator call (null: one process)
    rank_threads: int = 0  # torch threads of each rank (one process: threads)
    # controller=adaptive: the most rollouts its buffer may hold (the store's capacity; it
    # starts at ``capacity``); null without a controller.
    max_capacity: int | None = None
    # runtime.lockstep: each step trains on its own B rollouts (R = B, a step costs 1 unit).
    lockstep: bool = False


def resolve(cfg: DictConfig) -> tuple[DictConfig, Derived]:
    """Validate ``cfg`` and compute the derived sizes (module docstring).

    Returns the fully interpolated config (a new object; under ``schedule=async`` with
    ``schedule.workers`` filled in) and the :class:`Derived` sizes. Raises
    :class:`ConfigError` with a one-line message on the first problem found.
    """
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    check_options(cfg)
    check_values(cfg)
    s, B, G, mu = cfg.schedule, cfg.schedule.batch_size, cfg.algo.group_size, cfg.compute.mu
    lockstep = cfg.runtime.name == "distributed" and bool(cfg.runtime.lockstep)
    arrivals = derive_rollouts(s, G, mu)
    if lockstep:  # every step brings its own batch, generated with its weights: R = B, y = 1
        arrivals = arrivals._replace(R=B, R_max=B)
    if s.name == "async":
        s.workers = arrivals.workers  # saved with the run: the split it trained with
    N = derive_capacity(cfg.buffer, s, arrivals, G)
    # a lockstep step is a synchronous on-policy one (the node's sides take turns): 1 unit
    units = 1.0 if lockstep else units_per_step(s, arrivals.R, mu)
    max_prompt_len, max_new = probe_inputs(cfg)
    sched = cfg.compute.mu_schedule  # sync only (checks.check_mu_schedule)
    steps = derive_steps(s, arrivals.R, units, cost=(mu, sched))
    max_capacity = None
    if cfg.controller.policy is not None:
        steps, max_capacity = derive_controlled(cfg.controller, s, G, mu, arrivals.R, N, sched)
    device = cfg.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype, param_dtype = derive_precision(cfg.model, device)
    threads = cfg.threads or int(os.environ.get("SLURM_CPUS_PER_TASK", 0)) or os.cpu_count() or 1
    derived = Derived(
        rollouts_per_step=arrivals.R,
        prompts_per_step=arrivals.R / G,
        reuse_ratio=B / arrivals.R,
        capacity=N,
        staleness_horizon=N / arrivals.R,
        total_steps=steps,
        max_new_tokens=max_new,
        max_prompt_len=max_prompt_len,
        paper_units_per_step=units,
        device=device,
        threads=threads,
        dtype=dtype,
        param_dtype=param_dtype,
        workers=arrivals.workers,
        trainers=arrivals.trainers,
        **rank_sizes(cfg, B, N, threads),
        max_capacity=max_capacity,
        lockstep=lockstep,
    )
    return cfg, derived


def derive_precision(m: DictConfig, device: str) -> tuple[str, str]:
    """(compute dtype, parameter dtype) of ``model`` on ``device`` (models.precision).

    ``model.dtype=auto`` computes in bfloat16 on CUDA, float32 elsewhere. The parameters are
    float32 master weights, or the compute dtype itself (pure low precision, warned);
    float16 compute over float32 weights needs a loss scale, which is not implemented."""
    dtype = m.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    param = m.param_dtype
    if param not in ("float32", dtype):
        fail(
            f"model.param_dtype={param} with model.dtype={m.dtype} (computes in {dtype}): "
            f"choose float32 (master weights) or {dtype} (pure {dtype} weights)"
        )
    if dtype == "float16" and param == "float32":
        fail(
            "model.dtype=float16 with model.param_dtype=float32 needs a loss scale, which is "
            "not implemented; use model.dtype=bfloat16 (or model.param_dtype=float16)"
        )
    if param != "float32":
        log.warning(
            "model.param_dtype=%s: the weights and Adam's state are %s; an Adam step below "
            "its resolution is lost (at lr 1e-6 most of them; docs/real-models.md)",
            param,
            param,
        )
    return dtype, param


def rank_sizes(cfg: DictConfig, B: int, N: int, threads: int) -> dict[str, Any]:
    """The sizes of one rank: under ``runtime=distributed`` each of the T trainers samples B/T
    from its shard of N/T, each generator call makes ``runtime.groups_per_batch`` prompt groups
    (null: B / (G T), one trainer's share of a batch), and a local rank runs ``threads``
    threads if set, else 1 (W + T processes share the cores; a SLURM task: its CPUs)."""
    if cfg.runtime.name != "distributed":
        return {"batch_per_trainer": B, "capacity_per_trainer": N, "rank_threads": threads}
    T, r = cfg.schedule.trainers, cfg.runtime
    groups = r.groups_per_batch or max(1, B // (cfg.algo.group_size * T))
    in_slurm = int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_PROCID" in os.environ
    return {
        "batch_per_trainer": B // T,
        "capacity_per_trainer": N // T,
        "groups_per_batch": int(groups),
        "rank_threads": cfg.threads or (threads if in_slurm else 1),
    }


class Arrivals(NamedTuple):
    """What a step brings: R (mean fresh rollouts per step), the most one step can bring (the
    buffer must hold them), and the async split (None under schedule=sync)."""

    R: float
    R_max: int
    workers: int | None = None
    trainers: int | None = None


def derive_rollouts(s: Any, group_size: int, mu: float) -> Arrivals:
    """R from the schedule node ``s``: sync gives R or y = B/R (neither: R = B, a multiple of
    G); async derives W (``costmodel.workers_of``) and the mean arrivals B W / (mu T)
    (``costmodel.async_rollouts_per_step``), delivered as whole groups of G."""
    B, G = s.batch_size, group_size
    if s.name == "async":
        positive("schedule.trainers", s.trainers)
        W = s.workers
        if W is None:
            if s.gpus is None:
                fail("schedule.workers=null and schedule.gpus=null: set one of them")
            W = costmodel.workers_of(s.gpus, s.trainers)  # the paper's node: W + T = gpus
        elif s.gpus is not None and W + s.trainers != s.gpus:
            fail(
                f"schedule.workers={W} + schedule.trainers={s.trainers} != "
                f"schedule.gpus={s.gpus}; set schedule.gpus=null to use another node size"
            )
        positive("schedule.workers", W)
        positive("compute.mu", mu)
        R = costmodel.async_rollouts_per_step(B, W, s.trainers, mu)
        return Arrivals(R, G * max(1, math.ceil(R / G - 1e-9)), W, s.trainers)
    R, y = s.rollouts_per_step, s.reuse_ratio
    if R is not None and y is not None:
        fail(
            f"schedule.rollouts_per_step={R} and schedule.reuse_ratio={y} are mutually "
            "exclusive; set one of them to null"
        )
    if y is not None:
        positive("schedule.reuse_ratio", y)
        R_float = B / y
        if abs(R_float - round(R_float)) > 1e-9:
            fail(
                f"schedule.reuse_ratio={y} gives a non-integer rollouts_per_step "
                f"B/y = {B}/{y} = {R_float:g}"
            )
        R = round(R_float)
    if R is None:
        R = B
    positive("schedule.rollouts_per_step", R)
    if R % G:
        fail(f"schedule.rollouts_per_step={R} is not a multiple of algo.group_size={G}")
    return Arrivals(R, R)


def derive_capacity(b: Any, s: Any, arrivals: Arrivals, group_size: int) -> int:
    """N from the buffer node ``b``: the given capacity, or on_policy's B, or max_age's
    (A + 1) R_max rounded up to a multiple of the shards; checked against B, R_max, the
    generator's staleness and positive_bias's fresh share."""
    B, G, R, R_max = s.batch_size, group_size, arrivals.R, arrivals.R_max
    N, T = b.capacity, b.shards
    fresh_name = "schedule.rollouts_per_step" if R_max == R else "the most rollouts a step brings"
    if b.name == "max_age":
        lag = s.sync_every - 1 + s.sync_lag
        if b.max_age < lag:
            fail(
                f"buffer.max_age={b.max_age} is below the generator's staleness {lag} "
                f"(schedule.sync_every - 1 + schedule.sync_lag): rollouts would be evicted "
                f"before any use"
            )
        if (b.max_age + 1) * R < B:
            fail(
                f"buffer.max_age={b.max_age} keeps at most (max_age + 1) R = "
                f"{(b.max_age + 1) * R:g} rollouts, fewer than schedule.batch_size={B}"
            )
    if b.name == "on_policy":
        if R != B:
            fail(
                f"buffer=on_policy uses each rollout once, so it needs "
                f"schedule.rollouts_per_step={R} == schedule.batch_size={B}"
            )
        if N is None:
            N = B
        if N < B:
            fail(f"buffer.capacity={N} is smaller than schedule.batch_size={B}")
        if T > 1 and float(R / G).is_integer() and int(R // G) % T:
            fail(
                f"buffer=on_policy with buffer.shards={T} needs the {int(R // G)} prompt groups "
                f"of a step (schedule.rollouts_per_step={R} / algo.group_size={G}) to split "
                f"evenly over the shards"
            )
    else:
        if N is None and b.name == "max_age":  # never binds: A + 1 steps of arrivals at most
            N = T * math.ceil((b.max_age + 1) * R_max / T)
        if N is None:
            fail(f"buffer.capacity=null: buffer={b.name} needs a capacity N")
        if N < B:
            fail(f"buffer.capacity={N} is smaller than schedule.batch_size={B}")
        if R_max > N:
            fail(f"buffer.capacity={N} is smaller than {fresh_name}={R_max}")
    if B % T:
        fail(f"buffer.shards={T} does not divide schedule.batch_size={B}")
    if b.name == "positive_bias":
        fresh = T * (N // T - correct_slots(b.delta, N // T))
        if fresh < R_max:
            fail(
                f"buffer.delta={b.delta} leaves {fresh} of buffer.capacity={N} for the freshest "
                f"rollouts, fewer than {fresh_name}={R_max}: new rollouts would be evicted "
                f"before any use"
            )
    return N


def units_per_step(s: Any, R: float, mu: float) -> float:
    """Paper units of one step: gamma (``costmodel.async_gamma``, the whole node for one
    trainer step) under async, else training on B and generating R
    (``costmodel.paper_units``); an on-policy step is 1."""
    if s.name == "async":
        return costmodel.async_gamma(s.workers, s.trainers, mu)
    return costmodel.paper_units(costmodel.sample_units(s.batch_size, R, mu), mu, s.batch_size)


def derive_controlled(c: Any, s: Any, G: int, mu: float, R0: float, N0: int,
                      schedule: Any = None) -> tuple[int, int]:  # fmt: skip
    """(the most steps the budget can buy, the largest N) of a run under ``controller=adaptive``,
    which may set R down to ``controller.min_rollouts_per_step`` (null: G; under async R is
    not its knob and the step count is the fixed run's) and N up to
    ``controller.max_capacity`` (null: every rollout the budget can generate, the most at R =
    B), at the generation cost of ``compute.mu`` and ``schedule`` (``compute.mu_schedule``).
    The run stops when its budget is spent (``Controller.last``); the step count is a bound."""
    cost = (mu, schedule)
    R_min = c.min_rollouts_per_step or G
    if s.name == "async":  # R emerges (W, T, mu): the fixed run's step count
        if c.policy == "model" and R0 < G:
            fail(
                f"controller.policy=model scores an async split as the sync design at R in "
                f"whole groups, but schedule.workers={s.workers} and trainers={s.trainers} at "
                f"compute.mu={mu:g} bring R={R0:.3g} < algo.group_size={G} a step"
            )
        steps = derive_steps(s, R0, units_per_step(s, R0, mu))
    elif R_min > R0:
        fail(
            f"controller.min_rollouts_per_step={R_min} is above the run's own "
            f"schedule.rollouts_per_step={R0:g}, where the controller starts"
        )
    else:
        steps = derive_steps(s, R_min, units_per_step(s, R_min, mu), cost)
    N_max = c.max_capacity
    if N_max is None:
        B = s.batch_size
        N_max = max(N0, derive_steps(s, B, units_per_step(s, B, mu), cost) * B)
    if N_max < N0:
        fail(
            f"controller.max_capacity={N_max} is below the run's own buffer.capacity={N0}, "
            "where the controller starts"
        )
    return steps, int(N_max)


def derive_steps(s: Any, R: float, units: float, cost: tuple | None = None) -> int:
    """Training steps from the one budget given: steps, generated rollouts (whole steps of R)
    or compute (whole steps of ``units``; with a generation cost that changes, ``cost`` =
    (``compute.mu``, ``compute.mu_schedule``), whole steps of what each costs when it starts:
    ``costmodel.scheduled_steps``)."""
    budgets = {k: s[k] for k in ("max_steps", "max_rollouts", "max_compute") if s[k] is not None}
    if len(budgets) != 1:
        given = ", ".join(f"schedule.{k}={v}" for k, v in budgets.items()) or "none"
        fail(
            "exactly one budget of schedule.max_steps / max_rollouts / max_compute must be "
            f"set (given: {given}); set the others to null"
        )
    ((kind, value),) = budgets.items()
    positive(f"schedule.{kind}", value)
    if kind == "max_steps":
        steps = int(value)
    elif kind == "max_rollouts":
        steps = int(math.floor(value / R + 1e-9))
    elif cost is not None and cost[1]:
        steps = costmodel.scheduled_steps(s.batch_size, R, cost[0], cost[1], value)
    else:
        steps = int(math.floor(value / units + 1e-9))
    if steps < 1:
        fail(
            f"schedule.{kind}={value} buys no training step (one step costs "
            f"{R if kind == 'max_rollouts' else units:g})"
        )
    return steps
