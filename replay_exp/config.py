"""Config schemas (one dataclass per Hydra group) and ``resolve()``, which derives and validates.

Every YAML under ``conf/`` is backed by a dataclass registered in Hydra's ConfigStore, so a typo
or a wrong type fails at compose time. ``resolve()`` then computes every derived size once
(R, reuse ratio y = B/R, staleness horizon x = N/R, steps from the budget, ...) and rejects
impossible combinations with a one-line :class:`ConfigError` naming the keys and values, before
any model is built or any file is written.
"""

import math
import os
from dataclasses import dataclass, field
from typing import Any  # noqa: UP035  (OmegaConf needs typing.Optional)

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf


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
    cache_dir: str = "~/.cache/replay-exp/warm_start"


@dataclass
class ModelConfig:
    name: str = MISSING  # a label for logs and run names
    arch: str = "llama"  # llama | qwen2, for models built from a config
    pretrained: str | None = None  # local dir (or hub id) for from_pretrained
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    intermediate_size: int = 384
    max_position_embeddings: int = 64
    tie_word_embeddings: bool = True
    dtype: str = "float32"  # float32 | bfloat16 | float16
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
class BufferConfig:
    name: str = MISSING  # on_policy | fifo
    capacity: int | None = None  # N; on_policy: defaults to the batch size


@dataclass
class ScheduleConfig:
    name: str = "sync"
    batch_size: int = 64  # B
    rollouts_per_step: int | None = None  # R
    reuse_ratio: float | None = None  # y = B / R
    sync_every: int = 1  # k
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


@dataclass
class GenerationConfig:
    backend: str = "hf"
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int | None = None  # None: the task's longest answer + EOS
    chunk_size: int = 256  # prompts x samples per generate() call


@dataclass
class EvalConfig:
    every: int = 25
    at_start: bool = True
    n_problems: int | None = None  # None: the whole held-out split
    pass1_temperature: float = 0.0  # 0 = greedy
    pass1_top_p: float = 1.0
    pass_k: list[int] = field(default_factory=lambda: [1, 4, 8])
    n_samples: int = 8
    sample_temperature: float = 1.0
    sample_top_p: float = 1.0


@dataclass
class LoggerConfig:
    name: str = "jsonl"
    log_every: int = 1
    progress: bool = True


@dataclass
class ComputeConfig:
    mu: float = 1.0  # generation cost / training cost per rollout, for the paper's units


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
    seed: int = 0
    device: str = "auto"
    threads: int | None = None
    output_root: str = "runs"
    run_dir: str = MISSING
    save_final_model: bool = True


def register_configs() -> None:
    """Register every schema with Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(group="task", name="arithmetic_schema", node=ArithmeticTaskConfig)
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


def _job_suffix() -> str:
    """'' for a single run; '/<job num>_<overrides>' inside a Hydra multirun."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return ""
    hc = HydraConfig.get()
    if str(hc.mode) != "RunMode.MULTIRUN":
        return ""
    name = hc.job.override_dirname or "default"
    return f"/{hc.job.num}_{name}"


if not OmegaConf.has_resolver("job_suffix"):
    OmegaConf.register_new_resolver("job_suffix", _job_suffix)


# ---------------------------------------------------------------------------------------------
# resolve(): derive once, validate loudly.
# ---------------------------------------------------------------------------------------------


@dataclass
class Derived:
    """Sizes computed from the config; saved with the run as ``derived``."""

    rollouts_per_step: int  # R
    prompts_per_step: int  # R / G
    reuse_ratio: float  # y = B / R
    capacity: int  # N
    staleness_horizon: float  # x = N / R
    total_steps: int
    max_new_tokens: int
    max_prompt_len: int  # tokens, incl. BOS
    paper_units_per_step: float  # (B + mu R) / (B (1 + mu)); the on-policy baseline is 1
    device: str
    threads: int


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
    from replay_exp.tasks import TASKS, make_task

    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    s, a, b, g, e = cfg.schedule, cfg.algo, cfg.buffer, cfg.generation, cfg.eval

    # Option names.
    if cfg.task.name not in TASKS:
        _fail(f"task.name={cfg.task.name} is unknown; choose one of {sorted(TASKS)}")
    if b.name not in BUFFERS:
        _fail(f"buffer.name={b.name} is unknown; choose one of {sorted(BUFFERS)}")
    if g.backend not in BACKENDS:
        _fail(f"generation.backend={g.backend} is unknown; choose one of {sorted(BACKENDS)}")
    if s.name != "sync":
        _fail(f"schedule.name={s.name} is unknown; choose one of ['sync']")
    if a.name != "grpo":
        _fail(f"algo.name={a.name} is unknown; choose one of ['grpo']")
    aggs = ["seq_mean", "seq_sum_norm", "token_mean"]
    if a.loss_agg not in aggs:
        _fail(f"algo.loss_agg={a.loss_agg} is unknown; choose one of {aggs}")
    if cfg.model.arch not in ("llama", "qwen2"):
        _fail(f"model.arch={cfg.model.arch} is unknown; choose one of ['llama', 'qwen2']")
    if cfg.model.dtype not in ("float32", "bfloat16", "float16"):
        _fail(f"model.dtype={cfg.model.dtype} is unknown; choose float32, bfloat16 or float16")
    if cfg.device not in ("auto", "cpu", "cuda") and not str(cfg.device).startswith("cuda:"):
        _fail(f"device={cfg.device} is unknown; choose auto, cpu, cuda or cuda:N")
    if cfg.logger.name != "jsonl":
        _fail(f"logger.name={cfg.logger.name} is unknown; choose one of ['jsonl']")

    # Sizes.
    G, B = a.group_size, s.batch_size
    _positive("algo.group_size", G)
    _positive("schedule.batch_size", B)
    _positive("schedule.sync_every", s.sync_every)
    _positive("eval.every", e.every)
    _positive("eval.n_samples", e.n_samples)
    _positive("logger.log_every", cfg.logger.log_every)
    _positive("generation.chunk_size", g.chunk_size)
    _positive("model.warm_start.batch_size", cfg.model.warm_start.batch_size)
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

    # R and y: exactly one may be given; neither means R = B.
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

    # Buffer.
    N = b.capacity
    if N is not None:
        _positive("buffer.capacity", N)
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
    else:
        if N is None:
            _fail(f"buffer.capacity=null: buffer={b.name} needs a capacity N")
        if N < B:
            _fail(f"buffer.capacity={N} is smaller than schedule.batch_size={B}")
        if N < R:
            _fail(f"buffer.capacity={N} is smaller than schedule.rollouts_per_step={R}")

    # Task (validates its own keys) and lengths.
    task = make_task(cfg.task)
    max_prompt_len = task.max_prompt_chars + 1  # + BOS
    max_new = g.max_new_tokens if g.max_new_tokens is not None else task.max_answer_chars + 1
    _positive("generation.max_new_tokens", max_new)
    if (
        cfg.model.pretrained is None
        and max_prompt_len + max_new > cfg.model.max_position_embeddings
    ):
        _fail(
            f"model.max_position_embeddings={cfg.model.max_position_embeddings} < prompt "
            f"{max_prompt_len} + generation.max_new_tokens={max_new}"
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
    mu = cfg.compute.mu
    if mu < 0:
        _fail(f"compute.mu={mu} must be >= 0")
    units_per_step = (B + mu * R) / (B * (1 + mu))
    if kind == "max_steps":
        steps = int(value)
    elif kind == "max_rollouts":
        steps = int(value) // R
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
    threads = cfg.threads or int(os.environ.get("SLURM_CPUS_PER_TASK", 0)) or os.cpu_count() or 1

    derived = Derived(
        rollouts_per_step=R,
        prompts_per_step=R // G,
        reuse_ratio=B / R,
        capacity=N,
        staleness_horizon=N / R,
        total_steps=steps,
        max_new_tokens=max_new,
        max_prompt_len=max_prompt_len,
        paper_units_per_step=units_per_step,
        device=device,
        threads=threads,
    )
    return cfg, derived


CONF_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")


def compose(overrides: list[str] | None = None) -> DictConfig:
    """Compose ``conf/train.yaml`` with command-line style ``overrides`` (no run is started).

    The same composition as ``python -m replay_exp.train``; handy in tests and notebooks."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra_compose("train", overrides=list(overrides or []), return_hydra_config=False)
