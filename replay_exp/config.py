"""Config schemas (one dataclass per Hydra group) and ``resolve()``, which derives and validates.

Every YAML under ``conf/`` is backed by a dataclass registered in Hydra's ConfigStore, so a typo
or a wrong type fails at compose time. ``resolve()`` then computes every derived size once
(R, reuse ratio y = B/R, staleness horizon x = N/R, steps from the budget, ...) and rejects
impossible combinations with a one-line :class:`ConfigError` naming the keys and values, before
any model is built or any file is written.
"""

import hashlib
import importlib.util
import json
import math
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from replay_exp.theory import async_gamma

# Values of eval.unit (the x-axis the evaluation grid is laid on, every eval.every of it) and
# the cumulative ledger quantity (replay_exp.compute.Ledger) behind each.
EVAL_UNITS = {"steps": "steps", "compute": "paper_units", "rollouts": "rollouts"}


class ConfigError(ValueError):
    """An impossible configuration; the message is one line naming keys and values."""


# ---------------------------------------------------------------------------------------------
# Schemas. Field comments are short; the YAML files carry the user-facing documentation.
# ---------------------------------------------------------------------------------------------


@dataclass
class WarmStartConfig:
    steps: int = 0  # supervised steps on the task's train split; 0 = no warm start
    batch_size: int = 64
    lr: float = 1e-3
    seed: int = 0  # independent of the RL seed: all RL seeds share one warm start
    shipped: bool = True  # use the package's copy when this recipe is shipped
    cache_dir: str = "~/.cache/replay-exp/warm_start"


@dataclass
class ModelConfig:
    name: str = MISSING  # a label for logs and run names
    arch: str = "llama"  # llama | qwen2, for models built from a config
    pretrained: str | None = MISSING  # local dir or hub id for from_pretrained; null = tiny
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    intermediate_size: int = 384
    max_position_embeddings: int = 64
    tie_word_embeddings: bool | None = True  # pretrained: null = as saved, false = untie
    dtype: str = "float32"  # float32 | bfloat16 | float16 | auto (bfloat16 on CUDA, else float32)
    chat_template: bool = False  # wrap prompts in the tokenizer's chat template
    gradient_checkpointing: bool = False
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)


@dataclass
class ArithmeticTaskConfig:
    name: str = "arithmetic"
    n_digits: int = 3  # difficulty: operands uniform in [0, 10**n_digits)
    operations: list[str] = field(default_factory=lambda: ["+"])
    n_eval: int = 256  # held-out problems
    eval_fraction: float = 0.01  # share of the problem space reserved for held-out
    split_seed: int = 0
    demo_carry_drop: float = 0.0  # warm-start demonstrations only


@dataclass
class MathTaskConfig:
    name: str = MISSING  # gsm8k | math | openr1_math (the dataset's format)
    path: str | None = None  # local .jsonl / .json / .parquet file or folder; null = the hub
    hub_id: str | None = None  # null: the dataset's usual hub id
    config: str | None = None  # hub config; null: the dataset's default
    split: str = "train"  # hub split of the training problems
    limit: int | None = None  # keep the first `limit` usable rows
    eval_dataset: str | None = None  # format of the held-out source; null: as `name`
    eval_path: str | None = None  # local held-out file
    eval_hub_id: str | None = None  # hub id of the held-out split; null: `hub_id`
    eval_config: str | None = None
    eval_split: str | None = None  # hub split held out (hub loads only); null: hold out n_eval
    n_eval: int = 500  # held out of the training data when no separate eval source is used
    split_seed: int = 0
    template: str = "default"  # math_data.PROMPT_TEMPLATES key or a string with {question}
    max_prompt_tokens: int = 512  # longer prompts are dropped (after the chat template)
    max_response_tokens: int = 1024  # generation.max_new_tokens when that is null
    cache_dir: str | None = None  # datasets cache; null: the datasets default


@dataclass
class BufferConfig:
    name: str = MISSING  # eviction: on_policy | fifo | max_age | positive_bias | priority
    capacity: int | None = None  # N; on_policy: B if None; max_age: (max_age+1) R if None
    sampling: str = "uniform"  # uniform | without_replacement | never_used_first | recency
    # | prioritized
    max_reuse: int | None = None  # K: a rollout leaves after K uses; None = unlimited
    shards: int = 1  # T independent buffers of N/T each (one per trainer)
    max_age: int | None = None  # max_age only: evict when step - version > A
    delta: float | None = None  # positive_bias only: share of N for older correct rollouts
    priority: str = "abs_advantage"  # abs_advantage | group_reward_var (priority, prioritized)
    priority_alpha: float = 1.0  # prioritized: sampling weight = priority ** alpha
    recency_tau: float | None = None  # recency only: sampling weight = exp(-age / tau)


@dataclass
class ScheduleConfig:
    name: str = "sync"  # sync | async (the async-cluster emulation)
    batch_size: int = 64  # B
    rollouts_per_step: int | None = None  # R (sync)
    reuse_ratio: float | None = None  # y = B / R (sync)
    workers: int | None = None  # W inference workers (async); null = gpus - trainers
    trainers: int = 2  # T trainers (async)
    gpus: int | None = 8  # W + T GPUs of the node (async); null = W and T as given
    sync_every: int = 1  # k
    sync_lag: int = 0  # generator weights are this many versions old at a sync
    max_steps: int | None = None
    max_rollouts: int | None = None
    max_compute: float | None = None


@dataclass
class AlgoConfig:
    name: str = "grpo"
    group_size: int = 8  # G
    eps_low: float = 0.2
    eps_high: float = 0.2
    kl_coef: float = 0.0
    loss_agg: str = "token_mean"
    adv_normalize_std: bool = True
    lr: float = 1e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    weight_decay: float = 0.0
    grad_clip: float | None = 1.0
    tis_cap: float | None = None  # grpo: truncated IS weight cap c; None = off
    tis_level: str = "token"  # grpo: "token" or "sequence" importance weight
    asymre_dv: float = -0.1  # asymre: baseline shift dV in (r - (V_hat + dV)) * log pi
    micro_batch_size: int | None = None  # rollouts per forward/backward; None = the whole batch


@dataclass
class GenerationConfig:
    backend: str = "hf"
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int | None = None  # None: the task's longest answer + EOS
    chunk_size: int = 256  # prompts x samples per generate() call
    sampler: str = "cached_loop"  # hf backend: cached_loop (ours) | generate (transformers)
    behaviour_logp: str = "engine"  # engine (the generator's) | trainer (recomputed, logged)
    gpu_memory_utilization: float = 0.35  # vllm: share of GPU memory the engine may take
    enforce_eager: bool = False  # vllm: no CUDA graphs (slower, starts faster)
    kv_cache_memory_bytes: int | None = None  # vllm: fixed KV-cache size instead of the share


@dataclass
class EvalConfig:
    every: float = 25  # on the grid of eval.unit
    unit: str = "steps"  # steps | compute (paper units) | rollouts
    at_start: bool = True
    n_problems: int | None = None  # None: the whole held-out split
    sampled_problems: int | None = None  # pass@k / entropy on the first ones; None: all
    pass1_temperature: float = 0.0  # 0 = greedy
    pass1_top_p: float = 1.0
    pass_k: list[int] = field(default_factory=lambda: [1, 4, 8])
    n_samples: int = 8
    sample_temperature: float = 1.0
    sample_top_p: float = 1.0


@dataclass
class WandbConfig:
    project: str = "replay-exp"
    entity: str | None = None
    group: str | None = None  # None: the sweep's folder inside a multirun, else no group
    tags: list[str] = field(default_factory=list)
    mode: str | None = None  # online | offline | disabled; None = $WANDB_MODE / wandb default
    name: str | None = None  # None: the run directory's name


@dataclass
class LoggerConfig:
    name: str = "jsonl"  # jsonl | wandb (metrics.jsonl is always written)
    log_every: int = 1
    progress: bool = True
    diagnostics: bool = True  # per-update diag/* metrics (one no-grad forward per step)
    wandb: WandbConfig = field(default_factory=WandbConfig)  # read by logger=wandb only


@dataclass
class ComputeConfig:
    mu: float = 1.0  # generation cost / training cost per rollout, for the paper's units


@dataclass
class CheckpointConfig:
    every: int | None = 50  # steps between snapshots (and one at step 0); null or 0 = off
    keep: int = 2  # newest snapshots kept in run_dir/checkpoints


@dataclass
class TrainConfig:
    model: ModelConfig = MISSING
    task: Any = MISSING  # per-task schema, chosen by the task group's YAML
    buffer: BufferConfig = MISSING
    schedule: ScheduleConfig = MISSING
    algo: AlgoConfig = MISSING
    generation: GenerationConfig = MISSING
    eval: EvalConfig = MISSING
    logger: LoggerConfig = MISSING
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    seed: int = 0
    device: str = "auto"
    threads: int | None = None
    output_root: str = "runs"
    sweep_name: str | None = None
    run_dir: str = MISSING
    save_final_model: bool = True


def register_configs() -> None:
    """Register every schema with Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(group="task", name="arithmetic_schema", node=ArithmeticTaskConfig)
    cs.store(group="task", name="math_schema", node=MathTaskConfig)
    for group, node in [
        ("model", ModelConfig),
        ("buffer", BufferConfig),
        ("schedule", ScheduleConfig),
        ("algo", AlgoConfig),
        ("generation", GenerationConfig),
        ("eval", EvalConfig),
        ("logger", LoggerConfig),
    ]:
        cs.store(group=group, name="schema", node=node)


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


def _fail(msg: str) -> None:
    raise ConfigError(msg)


def _positive(name: str, value: Any) -> None:
    if value is None or value <= 0:
        _fail(f"{name}={value} must be > 0")


def resolve(cfg: DictConfig) -> tuple[DictConfig, Derived]:
    """Validate ``cfg`` and compute the derived sizes.

    Returns the fully interpolated config (a new object) and the :class:`Derived` sizes.
    Raises :class:`ConfigError` with a one-line message on the first problem found.
    """
    from replay_exp.buffer import BUFFERS
    from replay_exp.rollout import BACKENDS
    from replay_exp.rollout.hf import SAMPLERS
    from replay_exp.tasks import TASKS, make_task

    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    s, a, b, g, e = cfg.schedule, cfg.algo, cfg.buffer, cfg.generation, cfg.eval

    if OmegaConf.is_missing(cfg.model, "pretrained"):
        _fail("model=pretrained needs model.pretrained=<local dir or hub org/name>")

    # Option names.
    if cfg.task.name not in TASKS:
        _fail(f"task.name={cfg.task.name} is unknown; choose one of {sorted(TASKS)}")
    if b.name not in BUFFERS:
        _fail(f"buffer.name={b.name} is unknown; choose one of {sorted(BUFFERS)}")
    if g.backend not in BACKENDS:
        _fail(f"generation.backend={g.backend} is unknown; choose one of {sorted(BACKENDS)}")
    if g.sampler not in SAMPLERS:
        _fail(f"generation.sampler={g.sampler} is unknown; choose one of {sorted(SAMPLERS)}")
    if g.behaviour_logp not in ("engine", "trainer"):
        _fail(f"generation.behaviour_logp={g.behaviour_logp} is unknown; choose engine or trainer")
    if not 0 < g.gpu_memory_utilization <= 1:
        _fail(
            f"generation.gpu_memory_utilization={g.gpu_memory_utilization} must be in (0, 1] "
            "(the share of GPU memory the vLLM engine may take)"
        )
    if g.kv_cache_memory_bytes is not None:
        _positive("generation.kv_cache_memory_bytes", g.kv_cache_memory_bytes)
    if g.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        _fail(
            "generation.backend=vllm needs the vllm package, which is not installed: "
            "pip install -e '.[gpu]' on a GPU machine (scripts/setup_vllm_cpu.sh: a CPU build)"
        )
    if s.name not in ("sync", "async"):
        _fail(f"schedule.name={s.name} is unknown; choose one of ['async', 'sync']")
    from replay_exp.algo import ALGO_NAMES, TIS_LEVELS

    if a.name not in ALGO_NAMES:
        _fail(f"algo.name={a.name} is unknown; choose one of {sorted(ALGO_NAMES)}")
    aggs = ["seq_mean", "seq_sum_norm", "token_mean"]
    if a.loss_agg not in aggs:
        _fail(f"algo.loss_agg={a.loss_agg} is unknown; choose one of {aggs}")
    if cfg.model.arch not in ("llama", "qwen2"):
        _fail(f"model.arch={cfg.model.arch} is unknown; choose one of ['llama', 'qwen2']")
    if cfg.model.dtype not in ("float32", "bfloat16", "float16", "auto"):
        _fail(
            f"model.dtype={cfg.model.dtype} is unknown; choose float32, bfloat16, float16 or "
            "auto (bfloat16 on CUDA, float32 on CPU)"
        )
    if cfg.model.tie_word_embeddings is None and not cfg.model.pretrained:
        _fail("model.tie_word_embeddings=null (as saved) needs model.pretrained; set true or false")
    if cfg.device not in ("auto", "cpu", "cuda") and not str(cfg.device).startswith("cuda:"):
        _fail(f"device={cfg.device} is unknown; choose auto, cpu, cuda or cuda:N")
    from replay_exp.logging import LOGGERS, WANDB_MODES

    if cfg.logger.name not in LOGGERS:
        _fail(f"logger.name={cfg.logger.name} is unknown; choose one of {sorted(LOGGERS)}")
    if cfg.logger.wandb.mode is not None and cfg.logger.wandb.mode not in WANDB_MODES:
        _fail(
            f"logger.wandb.mode={cfg.logger.wandb.mode} is unknown; choose one of "
            f"{list(WANDB_MODES)} or null (wandb's own default)"
        )

    # Sizes.
    G, B = a.group_size, s.batch_size
    _positive("algo.group_size", G)
    if G < 2:
        _fail(
            f"algo.group_size={G}: a group of one is its own baseline, so every advantage is 0 "
            "(and AsymRE's coefficient a constant): nothing would train; use >= 2"
        )
    _positive("schedule.batch_size", B)
    _positive("schedule.sync_every", s.sync_every)
    _positive("eval.every", e.every)
    if e.unit not in EVAL_UNITS:
        _fail(f"eval.unit={e.unit} is unknown; choose one of {list(EVAL_UNITS)}")
    if e.unit in ("steps", "rollouts") and not float(e.every).is_integer():
        _fail(f"eval.every={e.every} must be a whole number of {e.unit} (eval.unit={e.unit})")
    _positive("eval.n_samples", e.n_samples)
    if e.sampled_problems is not None:
        _positive("eval.sampled_problems", e.sampled_problems)
    _positive("logger.log_every", cfg.logger.log_every)
    _positive("generation.chunk_size", g.chunk_size)
    _positive("model.warm_start.batch_size", cfg.model.warm_start.batch_size)
    if a.micro_batch_size is not None:
        _positive("algo.micro_batch_size", a.micro_batch_size)
    if g.behaviour_logp == "trainer" and (s.sync_every != 1 or s.sync_lag != 0):
        _fail(
            "generation.behaviour_logp=trainer recomputes behaviour log-probs with the "
            f"trainer's weights, which are the generator's only with schedule.sync_every=1 and "
            f"schedule.sync_lag=0 (given {s.sync_every} and {s.sync_lag})"
        )
    if cfg.model.warm_start.steps < 0:
        _fail(f"model.warm_start.steps={cfg.model.warm_start.steps} must be >= 0")
    for key in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
        _positive(f"model.{key}", cfg.model[key])
    if cfg.model.hidden_size % cfg.model.num_heads:
        _fail(
            f"model.hidden_size={cfg.model.hidden_size} is not a multiple of "
            f"model.num_heads={cfg.model.num_heads}"
        )
    if e.n_problems is not None:
        _positive("eval.n_problems", e.n_problems)
    if cfg.threads is not None:
        _positive("threads", cfg.threads)
    if cfg.checkpoint.every is not None and cfg.checkpoint.every < 0:
        _fail(f"checkpoint.every={cfg.checkpoint.every} must be >= 0 (0 or null = off)")
    _positive("checkpoint.keep", cfg.checkpoint.keep)

    # Clip, KL, optimizer.
    if not 0 <= a.eps_low < 1:
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
    if a.tis_level not in TIS_LEVELS:
        _fail(f"algo.tis_level={a.tis_level} is unknown; choose one of {sorted(TIS_LEVELS)}")
    if a.tis_cap is not None and not a.tis_cap > 0:
        _fail(f"algo.tis_cap={a.tis_cap} must be > 0 (or null for no truncated IS)")
    if a.name == "asymre":
        # AsymRE has no importance ratio; V_hat is recovered as reward - advantage, which is
        # exact only for unnormalised advantages. kl_coef > 0 is allowed (same k3 term as GRPO).
        if a.tis_cap is not None:
            _fail(f"algo.tis_cap={a.tis_cap} needs algo.name=grpo; asymre has no ratio")
        if a.adv_normalize_std:
            _fail("algo.name=asymre needs algo.adv_normalize_std=false (V_hat = r - advantage)")
        if not math.isfinite(a.asymre_dv):
            _fail(f"algo.asymre_dv={a.asymre_dv} must be finite")

    # Sampling parameters.
    for key, t, p in [
        ("generation", g.temperature, g.top_p),
        ("eval.sample", e.sample_temperature, e.sample_top_p),
    ]:
        tkey = "generation.temperature" if key == "generation" else "eval.sample_temperature"
        pkey = "generation.top_p" if key == "generation" else "eval.sample_top_p"
        _positive(tkey, t)
        if not 0 < p <= 1:
            _fail(f"{pkey}={p} must be in (0, 1]")
    if e.pass1_temperature < 0:
        _fail(f"eval.pass1_temperature={e.pass1_temperature} must be >= 0 (0 = greedy)")
    if not 0 < e.pass1_top_p <= 1:
        _fail(f"eval.pass1_top_p={e.pass1_top_p} must be in (0, 1]")
    bad_k = [k for k in e.pass_k if not 1 <= k <= e.n_samples]
    if bad_k:
        _fail(f"eval.pass_k={list(e.pass_k)} needs every k in [1, eval.n_samples={e.n_samples}]")

    # R and y: exactly one may be given; neither means R = B. The async emulation derives R.
    R, y = s.rollouts_per_step, s.reuse_ratio
    mu = cfg.compute.mu
    if mu < 0:
        _fail(f"compute.mu={mu} must be >= 0")
    if s.sync_lag < 0:
        _fail(f"schedule.sync_lag={s.sync_lag} must be >= 0")
    if s.name == "async":
        if R is not None or y is not None:
            _fail(
                f"schedule=async derives R from workers, trainers and compute.mu; set "
                f"schedule.rollouts_per_step={R} and schedule.reuse_ratio={y} to null"
            )
        _positive("schedule.trainers", s.trainers)
        if s.workers is None:
            if s.gpus is None:
                _fail("schedule.workers=null and schedule.gpus=null: set one of them")
            s.workers = s.gpus - s.trainers  # the paper's node: W + T = gpus
        elif s.gpus is not None and s.workers + s.trainers != s.gpus:
            _fail(
                f"schedule.workers={s.workers} + schedule.trainers={s.trainers} != "
                f"schedule.gpus={s.gpus}; set schedule.gpus=null to use another node size"
            )
        _positive("schedule.workers", s.workers)
        _positive("compute.mu", mu)
        R = B * s.workers / (mu * s.trainers)  # mean arrivals per step (a float)
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
    if s.name == "sync":
        _positive("schedule.rollouts_per_step", R)
        if R % G:
            _fail(f"schedule.rollouts_per_step={R} is not a multiple of algo.group_size={G}")
    # Most fresh rollouts one step can bring (the buffer must hold them).
    R_max = R if s.name == "sync" else G * max(1, math.ceil(R / G - 1e-9))

    # Buffer. The node alone first (names, ranges, keys a policy does not use), then sizes.
    from replay_exp.buffer import check_buffer_config
    from replay_exp.buffer.positive_bias import correct_slots

    problem = check_buffer_config(b)
    if problem:
        _fail(problem)
    N, T = b.capacity, b.shards
    fresh_name = "schedule.rollouts_per_step" if R_max == R else "the most rollouts a step brings"
    if b.name == "max_age":
        lag = s.sync_every - 1 + s.get("sync_lag", 0)
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

    # Model source, task (validates its own keys, loads its data) and lengths in tokens.
    pretrained = cfg.model.pretrained
    saved_model = pretrained_model_config(pretrained) if pretrained else None
    if TASKS[cfg.task.name].needs_pretrained and not pretrained:
        _fail(
            f"task.name={cfg.task.name} needs a pretrained model with its own tokenizer "
            "(model=qwen2_5_0_5b, model=<local dir>, or model.pretrained=...); the embedded "
            "tiny model's char tokenizer cannot read it"
        )
    if cfg.model.chat_template and not _has_chat_template(pretrained):
        _fail(
            f"model.chat_template=true, but the tokenizer of "
            f"{'model.pretrained=' + str(pretrained) if pretrained else 'the tiny model'} has no "
            "chat template; set model.chat_template=false"
        )
    task = make_task(cfg.task)
    max_prompt_len = task.max_prompt_tokens
    max_new = g.max_new_tokens if g.max_new_tokens is not None else task.max_new_tokens
    _positive("generation.max_new_tokens", max_new)
    if pretrained is None:
        max_positions, where = cfg.model.max_position_embeddings, "model.max_position_embeddings"
    else:
        max_positions = (saved_model or {}).get("max_position_embeddings")
        where = f"max_position_embeddings of model.pretrained={pretrained}"
    if max_positions is not None and max_prompt_len + max_new > max_positions:
        _fail(
            f"{where} = {max_positions} < prompt {max_prompt_len} + "
            f"generation.max_new_tokens={max_new} tokens"
        )

    # Budget: exactly one of steps, rollouts, compute.
    budgets = {k: s[k] for k in ("max_steps", "max_rollouts", "max_compute") if s[k] is not None}
    if len(budgets) != 1:
        given = ", ".join(f"schedule.{k}={v}" for k, v in budgets.items()) or "none"
        _fail(
            "exactly one budget of schedule.max_steps / max_rollouts / max_compute must be "
            f"set (given: {given}); set the others to null"
        )
    ((kind, value),) = budgets.items()
    _positive(f"schedule.{kind}", value)
    if s.name == "async":  # the paper's gamma: the whole node for one trainer step
        units_per_step = async_gamma(s.workers, s.trainers, mu)
    else:
        units_per_step = (B + mu * R) / (B * (1 + mu))
    if kind == "max_steps":
        steps = int(value)
    elif kind == "max_rollouts":
        steps = int(math.floor(value / R + 1e-9))
    else:
        steps = int(math.floor(value / units_per_step + 1e-9))
    if steps < 1:
        _fail(
            f"schedule.{kind}={value} buys no training step (one step costs "
            f"{R if kind == 'max_rollouts' else units_per_step:g})"
        )

    device = cfg.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = cfg.model.dtype
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    threads = cfg.threads or int(os.environ.get("SLURM_CPUS_PER_TASK", 0)) or os.cpu_count() or 1

    derived = Derived(
        rollouts_per_step=R,
        prompts_per_step=R / G,
        reuse_ratio=B / R,
        capacity=N,
        staleness_horizon=N / R,
        total_steps=steps,
        max_new_tokens=max_new,
        max_prompt_len=max_prompt_len,
        paper_units_per_step=units_per_step,
        device=device,
        threads=threads,
        dtype=dtype,
    )
    return cfg, derived


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


CONF_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")


def expand_model_shorthand(overrides: list[str]) -> list[str]:
    """``model=<local dir or hub org/name>`` -> ``model=pretrained model.pretrained=<it>
    model.name=<its last part>``; other arguments (and ``model=<config name>``) pass unchanged.

    Applied to the command line before Hydra parses it. A value that is neither a config under
    ``conf/model`` nor a directory nor a hub id fails with a one-line :class:`ConfigError`.
    Sweeps over several paths use the long form: ``model=pretrained model.pretrained=a,b``."""
    names = sorted(f[:-5] for f in os.listdir(os.path.join(CONF_DIR, "model")) if f[-5:] == ".yaml")
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
