"""Config schemas: one typed dataclass per Hydra group option, registered in ConfigStore.

The YAML files under ``conf/`` hold every default and its documentation; these dataclasses hold
only names and types (every field is ``MISSING``), so a typo or a wrong type fails at compose
time and there is no second default to disagree with the YAML (``tests/test_config.py``
checks). Options with knobs of their own have their own schema, a subclass of the group's base:
a key that an option does not use is not in its schema, so setting it fails at compose time
(``buffer.delta`` on ``buffer=fifo``, ``algo.tis_cap`` on ``algo=asymre``, ...).

``OPTION_SCHEMAS`` maps, per group, the value of the option's name key to its schema; it is
what :func:`register_configs` stores and what ``resolve()`` checks a renamed node against.
This module imports no other module of the package (the layering: ``errors`` and ``schemas``
are leaves; ``config.derive`` sits above every registry it validates against).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cache
from typing import Any

import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from replay_exp import PROJECT

CONF_DIR = PROJECT / "conf"

# Values of eval.unit (the x-axis the evaluation grid is laid on, every eval.every of it) and
# the cumulative ledger quantity (replay_exp.compute.ledger.Ledger) behind each.
EVAL_UNITS = {"steps": "steps", "compute": "paper_units", "rollouts": "rollouts"}

# --- model ------------------------------------------------------------------------------------


@dataclass
class WarmStartConfig:
    steps: int = MISSING  # supervised steps on the task's train split; 0 = none
    batch_size: int = MISSING
    lr: float = MISSING
    seed: int = MISSING  # independent of the RL seed: all RL seeds share one warm start
    shipped: bool = MISSING  # use the package's copy when this recipe is shipped
    cache_dir: str = MISSING


@dataclass
class ModelConfig:
    """Any policy: ``model=pretrained`` and the hub models (``from_pretrained``)."""

    name: str = MISSING  # a label for logs and run names
    pretrained: str | None = MISSING  # local dir or hub id for from_pretrained; null = tiny
    tie_word_embeddings: bool | None = MISSING  # null = as saved, false = untie
    dtype: str = MISSING  # compute dtype: float32 | bfloat16 | float16 | auto
    param_dtype: str = MISSING  # trained weights and Adam state: float32 | same as dtype (pure)
    save_dtype: str | None = MISSING  # final_model's dtype; null: param_dtype
    chat_template: bool = MISSING
    gradient_checkpointing: bool = MISSING


@dataclass
class TinyModelConfig(ModelConfig):
    """``model=tiny | tiny_qwen2``: built from a config, warm-started."""

    arch: str = MISSING  # llama | qwen2 | qwen3
    tokenizer: str = MISSING  # char | a subword tokenizer shipped in models/tokenizers/
    hidden_size: int = MISSING
    num_layers: int = MISSING
    num_heads: int = MISSING
    intermediate_size: int = MISSING
    max_position_embeddings: int = MISSING
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)


# --- task -------------------------------------------------------------------------------------


@dataclass
class ArithmeticTaskConfig:
    name: str = MISSING
    n_digits: int = MISSING  # difficulty: operands uniform in [0, 10**n_digits)
    operations: list[str] = MISSING
    n_eval: int = MISSING  # held-out problems
    eval_fraction: float = MISSING  # share of the problem space reserved for held-out
    split_seed: int = MISSING
    demo_carry_drop: float = MISSING  # warm-start demonstrations only


@dataclass
class MathTaskConfig:
    name: str = MISSING  # gsm8k | math | openr1_math (the dataset's format)
    path: str | None = MISSING  # local .jsonl / .json / .parquet file or folder; null = hub
    hub_id: str | None = MISSING
    config: str | None = MISSING
    split: str = MISSING
    limit: int | None = MISSING
    eval_dataset: str | None = MISSING
    eval_path: str | None = MISSING
    eval_hub_id: str | None = MISSING
    eval_config: str | None = MISSING
    eval_split: str | None = MISSING
    n_eval: int = MISSING
    split_seed: int = MISSING
    template: str = MISSING
    max_prompt_tokens: int = MISSING
    max_response_tokens: int = MISSING
    cache_dir: str | None = MISSING


@dataclass
class ReasoningGymTaskConfig:
    name: str = MISSING  # reasoning_gym
    dataset: str = MISSING  # a reasoning-gym dataset name (chain_sum, countdown, ...)
    params: Any = MISSING  # the dataset's config keys (a dict; null = its defaults)
    n_eval: int = MISSING
    n_train: int = MISSING  # size of the training dataset items are drawn from
    split_seed: int = MISSING  # held-out: this seed; training: split_seed + n_eval
    template: str = MISSING  # contains {question}
    extract: str = MISSING  # completion | answer_tag | final
    reward: str = MISSING  # score_answer | math_verify
    partial_credit: bool = MISSING  # false: 1 iff the scorer gives full marks
    max_prompt_tokens: int = MISSING
    max_response_tokens: int = MISSING


# --- buffer -----------------------------------------------------------------------------------


@dataclass
class BufferConfig:
    """Every eviction policy: ``buffer=fifo | on_policy | priority``. The sampling knobs
    (``recency_tau``, ``priority``, ``priority_alpha``) are orthogonal to eviction."""

    name: str = MISSING  # eviction: on_policy | fifo | max_age | positive_bias | priority
    capacity: int | None = MISSING  # N
    sampling: str = MISSING
    max_reuse: int | None = MISSING  # K: a rollout leaves after K uses; null = unlimited
    shards: int = MISSING  # T independent buffers of N/T each
    priority: str = MISSING  # abs_advantage | group_reward_var
    priority_alpha: float = MISSING  # sampling=prioritized: weight = priority ** alpha
    recency_tau: float | None = MISSING  # sampling=recency: weight = exp(-age / tau)
    max_staleness: int | None = MISSING  # admission: refuse rollouts > k versions old
    staleness_policy: str = MISSING  # drop | wait (distributed: trainers wait for fresh data)


@dataclass
class MaxAgeBufferConfig(BufferConfig):
    max_age: int = MISSING  # A: evict when step - version > A


@dataclass
class PositiveBiasBufferConfig(BufferConfig):
    delta: float = MISSING  # share of N kept for older correct rollouts


# --- schedule ---------------------------------------------------------------------------------


@dataclass
class ScheduleConfig:
    name: str = MISSING  # sync | async
    batch_size: int = MISSING  # B
    sync_every: int = MISSING  # k
    sync_lag: int = MISSING  # generator weights are this many versions old at a sync
    max_steps: int | None = MISSING
    max_rollouts: int | None = MISSING
    max_compute: float | None = MISSING


@dataclass
class SyncScheduleConfig(ScheduleConfig):
    rollouts_per_step: int | None = MISSING  # R
    reuse_ratio: float | None = MISSING  # y = B / R


@dataclass
class AsyncScheduleConfig(ScheduleConfig):
    workers: int | None = MISSING  # W; null = gpus - trainers
    trainers: int = MISSING  # T
    gpus: int | None = MISSING  # W + T; null = W and T as given


# --- runtime ----------------------------------------------------------------------------------


@dataclass
class RuntimeConfig:
    """``runtime=inprocess``: the single-process loop (``schedule=async`` emulates the node)."""

    name: str = MISSING  # inprocess | distributed


@dataclass
class CostModelConfig:
    """``runtime.cost_model``: the GPU-node timing of ``generation_cost=modelled``."""

    length_sigma: float = MISSING  # log-sd of the relative response lengths (the tail)
    reference_s_per_sample: float | None = MISSING  # fixed trainer s/sample; null: measured
    load_cost: float = MISSING  # a weight load pauses a generator this many trained samples' time


@dataclass
class DistributedRuntimeConfig(RuntimeConfig):
    """``runtime=distributed``: W generator + T trainer processes (replay_exp.runtime)."""

    backend: str = MISSING  # auto | gloo | nccl: the trainers' gradient collectives
    wrapper: str = MISSING  # ddp | fsdp
    groups_per_batch: int | None = MISSING  # prompt groups per generation call; null: B/(G T)
    max_in_flight: int = MISSING  # rollout messages a generator may have unreceived per trainer
    lockstep: bool = MISSING  # each step's own rollouts, at its own weights (reproducible)
    heartbeat_timeout_s: float = MISSING  # a silent generator is declared dead after this
    rendezvous_timeout_s: float = MISSING  # ranks wait this long for each other at start
    check_replicas: bool = MISSING  # compare the trainers' weights (ddp), knobs each step
    generation_cost: str = MISSING  # measured | modelled (a GPU node's timing)
    cost_model: CostModelConfig = field(default_factory=CostModelConfig)


# --- algo -------------------------------------------------------------------------------------
# One schema per loss: the loss registers itself with it (replay_exp.algo.registry,
# register_loss(name, schema=...)) and its YAML is conf/algo/<name>.yaml; OPTION_SCHEMAS["algo"]
# below lists it under the same name (register_loss checks).


@dataclass
class AlgoConfig:
    """The keys every loss shares (``conf/algo/_base.yaml``)."""

    name: str = MISSING  # the loss: a name registered in replay_exp.algo (LOSSES)
    group_size: int = MISSING  # G
    eps_low: float = MISSING
    eps_high: float = MISSING
    kl_coef: float = MISSING
    loss_agg: str = MISSING
    adv_normalize_std: bool = MISSING
    adv_std: str = MISSING  # population (ddof 0) | sample (ddof 1: verl, TRL)
    adv_eps: float = MISSING  # A = (r - mean) / (std + adv_eps)
    lr: float = MISSING
    betas: list[float] = MISSING
    weight_decay: float = MISSING
    grad_clip: float | None = MISSING
    micro_batch_size: int | None = MISSING


@dataclass
class MaskedAlgoConfig(AlgoConfig):
    """The losses a stale-data mask applies to (replay_exp/algo/masks.py; ``conf/algo/_mask.yaml``):
    a loss whose schema subclasses this one gets ``algo.mask`` from the update."""

    mask: str = MISSING  # none | icepop | seq_mis | geometric | opsm
    mask_low: float = MISSING  # icepop / seq_mis: keep r (or W) >= mask_low
    mask_high: float = MISSING  # icepop / seq_mis: keep r (or W) <= mask_high
    mask_geo_delta: float = MISSING  # geometric: keep exp(mean log r) in [1 - d, 1 + d]
    mask_opsm_delta: float = MISSING  # opsm: drop A < 0 rows with mean log(mu / pi) > delta


@dataclass
class DualClipAlgoConfig(MaskedAlgoConfig):
    """The losses with a PPO clip, which take dual-clip PPO (``conf/algo/_dual_clip.yaml``)."""

    clip_ratio_c: float | None = MISSING  # A < 0: the loss is capped at c |A|; null = off


@dataclass
class GrpoConfig(DualClipAlgoConfig):
    """``algo=grpo`` (replay_exp/algo/grpo.py): truncated IS and decoupled PPO (a loss whose
    schema subclasses this one gets ``algo.proximal``'s proximal log-probs from the update)."""

    tis_cap: float | None = MISSING  # truncated IS weight cap c; null = off
    tis_level: str = MISSING  # token | sequence | geometric
    tis_form: str = MISSING  # truncated_is (the peers') | ratio_reweight (the ratio twice)
    proximal: str = MISSING  # decoupled PPO's proximal policy: none | recompute | loglinear


@dataclass
class CispoConfig(MaskedAlgoConfig):
    """``algo=cispo`` (replay_exp/algo/corrections.py)."""


@dataclass
class GspoConfig(DualClipAlgoConfig):
    """``algo=gspo`` (replay_exp/algo/corrections.py)."""


@dataclass
class M2poConfig(AlgoConfig):
    """``algo=m2po`` (replay_exp/algo/corrections.py)."""

    m2_threshold: float = MISSING  # the budget on the kept tokens' mean (log r)^2


@dataclass
class ToprConfig(AlgoConfig):
    """``algo=topr`` (replay_exp/algo/corrections.py)."""

    topr_baseline: float = MISSING  # b in the coefficient R - b of the stored reward


@dataclass
class AsymreConfig(AlgoConfig):
    """``algo=asymre`` (replay_exp/algo/asymre.py)."""

    asymre_dv: float = MISSING  # baseline shift dV in (r - (V_hat + dV)) * log pi


@dataclass
class SapoConfig(MaskedAlgoConfig):
    """``algo=sapo`` (replay_exp/algo/sapo.py)."""

    sapo_tau_pos: float = MISSING  # gate temperature of the tokens with A > 0
    sapo_tau_neg: float = MISSING  # gate temperature of the tokens with A <= 0


@dataclass
class GmpoConfig(DualClipAlgoConfig):
    """``algo=gmpo`` (replay_exp/algo/gmpo.py): eps_low / eps_high clip log r (log space)."""


@dataclass
class DppoConfig(MaskedAlgoConfig):
    """``algo=dppo`` (replay_exp/algo/dppo.py)."""

    dppo_delta_low: float = MISSING  # A < 0: drop a token whose pi - mu < -delta_low
    dppo_delta_high: float = MISSING  # A > 0: drop a token whose pi - mu > delta_high
    dppo_kl_tau: float = MISSING  # weight of the (log r)^2 term (prime-rl's kl_tau)


# --- generation -------------------------------------------------------------------------------


@dataclass
class GenerationConfig:
    backend: str = MISSING  # hf | vllm
    temperature: float = MISSING
    top_p: float = MISSING
    max_new_tokens: int | None = MISSING  # null: the task's longest answer + EOS
    chunk_size: int = MISSING
    behaviour_logp: str = MISSING  # engine | trainer
    store_trainer_logp: bool = MISSING  # the engine mismatch stored beside the engine's logp


@dataclass
class HFGenerationConfig(GenerationConfig):
    sampler: str = MISSING  # cached_loop | generate | static
    compile: bool = MISSING  # sampler=static: torch.compile the decode step (CUDA graphs on GPU)


@dataclass
class VLLMGenerationConfig(GenerationConfig):
    gpu_memory_utilization: float = MISSING
    enforce_eager: bool = MISSING
    kv_cache_memory_bytes: int | None = MISSING


# --- eval, logger, top level ------------------------------------------------------------------


@dataclass
class EvalConfig:
    every: float = MISSING  # on the grid of eval.unit
    unit: str = MISSING  # steps | compute | rollouts
    at_start: bool = MISSING
    n_problems: int | None = MISSING
    sampled_problems: int | None = MISSING
    pass1_temperature: float = MISSING
    pass1_top_p: float = MISSING
    pass_k: list[int] = MISSING
    n_samples: int = MISSING
    sample_temperature: float = MISSING
    sample_top_p: float = MISSING


@dataclass
class LoggerConfig:
    """``logger=jsonl``: metrics.jsonl only."""

    name: str = MISSING  # jsonl | wandb
    log_every: int = MISSING
    progress: bool = MISSING
    diagnostics: bool = MISSING


@dataclass
class WandbConfig:
    project: str = MISSING
    entity: str | None = MISSING
    group: str | None = MISSING
    tags: list[str] = MISSING
    mode: str | None = MISSING  # online | offline | disabled; null = $WANDB_MODE
    name: str | None = MISSING


@dataclass
class WandbLoggerConfig(LoggerConfig):
    wandb: WandbConfig = field(default_factory=WandbConfig)


# --- controller -------------------------------------------------------------------------------


@dataclass
class ControllerConfig:
    """``controller=fixed``: no controller, every knob where the config puts it."""

    policy: str | None = MISSING  # null: fixed; guard | model: controller=adaptive


@dataclass
class GuardConfig:
    kl_max: float = MISSING  # KL(behaviour || current) limit of the trained tokens
    clip_max: float = MISSING  # clipped-token share limit
    ess_min: float = MISSING  # sequence-level ESS fraction floor
    surge_max: float = MISSING  # gradient norm over its earlier mean, limit
    calm: float = MISSING  # a window is calm inside this fraction of every limit
    patience: int = MISSING  # calm windows in a row before a rung up


@dataclass
class ModelPolicyConfig:
    model: str = MISSING  # paper_gap | exact (theory.design)
    noise: str = MISSING  # a theory.measure output with rho(delta)
    min_aged_rows: int = MISSING  # rows of age >= 1 a window needs to estimate alpha
    bootstrap: int = MISSING  # resamples of alpha's interval
    min_gain: float | None = MISSING  # hysteresis: a move's least predicted gain; null: none
    persist: int = MISSING  # hysteresis: decisions in a row a target must be named


@dataclass
class AdaptiveControllerConfig(ControllerConfig):
    """``controller=adaptive``: a closed-loop controller (``replay_exp.control``)."""

    every: int = MISSING  # K: a decision every K steps
    knobs: list[str] = MISSING  # what it sets: reuse, capacity, lr
    min_rollouts_per_step: int | None = MISSING  # R's floor; null: G
    max_capacity: int | None = MISSING  # N's ceiling; null: every rollout the budget makes
    reuse_growth: float = MISSING  # a rung divides R by this ...
    capacity_growth: float = MISSING  # ... and multiplies N by this
    lr_rule: str = MISSING  # the lr knob's rule: ess | lag (control.lr)
    lr_lag_scale: float = MISSING  # lr_rule=lag: S_half, the lag that halves the lr's square
    lr_min_scale: float = MISSING  # the lr knob: lr x clamp(rule's scale, lr_min_scale, 1)
    guard: GuardConfig = field(default_factory=GuardConfig)
    model: ModelPolicyConfig = field(default_factory=ModelPolicyConfig)


@dataclass
class ComputeConfig:
    mu: float = MISSING
    mu_schedule: Any = MISSING  # [[from paper units, mu], ...] or null


@dataclass
class CheckpointConfig:
    every: int | None = MISSING
    keep: int = MISSING


@dataclass
class TrainConfig:
    model: Any = MISSING  # each group's node is typed by its option's schema
    task: Any = MISSING
    buffer: Any = MISSING
    schedule: Any = MISSING
    algo: Any = MISSING
    generation: Any = MISSING
    eval: Any = MISSING
    logger: Any = MISSING
    runtime: Any = MISSING
    controller: Any = MISSING
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    seed: int = MISSING
    device: str = MISSING
    deterministic: bool = MISSING  # deterministic kernels (CUDA; docs/real-models.md)
    threads: int | None = MISSING
    output_root: str = MISSING
    sweep_name: str | None = MISSING
    run_dir: str = MISSING
    save_final_model: bool = MISSING


# group -> option name (the node's name key: buffer.name, algo.name, ...) -> schema. The
# ConfigStore name of each schema is "<key>_schema" (e.g. buffer/max_age_schema).
OPTION_SCHEMAS: dict[str, dict[str, type]] = {
    "model": {"pretrained": ModelConfig, "tiny": TinyModelConfig},
    "task": {
        "arithmetic": ArithmeticTaskConfig,
        "gsm8k": MathTaskConfig,
        "math": MathTaskConfig,
        "openr1_math": MathTaskConfig,
        "reasoning_gym": ReasoningGymTaskConfig,
    },
    "buffer": {
        "fifo": BufferConfig,
        "on_policy": BufferConfig,
        "priority": BufferConfig,
        "max_age": MaxAgeBufferConfig,
        "positive_bias": PositiveBiasBufferConfig,
    },
    "schedule": {"sync": SyncScheduleConfig, "async": AsyncScheduleConfig},
    "algo": {
        "grpo": GrpoConfig,
        "cispo": CispoConfig,
        "gspo": GspoConfig,
        "m2po": M2poConfig,
        "topr": ToprConfig,
        "asymre": AsymreConfig,
        "sapo": SapoConfig,
        "gmpo": GmpoConfig,
        "dppo": DppoConfig,
    },
    "generation": {"hf": HFGenerationConfig, "vllm": VLLMGenerationConfig},
    "eval": {"default": EvalConfig},
    "logger": {"jsonl": LoggerConfig, "wandb": WandbLoggerConfig},
    "runtime": {"inprocess": RuntimeConfig, "distributed": DistributedRuntimeConfig},
    # No name key: controller=fixed leaves controller.policy null, so the runs written before
    # the group existed compare equal (checkpoint.config_differences); checks.check_controller.
    "controller": {"fixed": ControllerConfig, "adaptive": AdaptiveControllerConfig},
}
# The key of each group's node that names its option (model and eval have none: their
# schema is chosen by the YAML alone).
NAME_KEYS = {"task": "name", "buffer": "name", "schedule": "name", "algo": "name",
             "generation": "backend", "logger": "name", "runtime": "name"}  # fmt: skip


def register_configs() -> None:
    """Register every schema with Hydra's ConfigStore (idempotent): ``train_schema`` and, per
    group, ``<option>_schema`` for each schema in ``OPTION_SCHEMAS``."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    for group, options in OPTION_SCHEMAS.items():
        for option, node in options.items():
            cs.store(group=group, name=f"{option}_schema", node=node)


@cache
def option_defaults(group: str, option: str) -> dict[str, Any]:
    """The values ``conf/<group>/<option>.yaml`` gives its keys, with what its defaults list
    pulls in (``_base`` and sibling options; ``*_schema`` entries carry no values), read without
    Hydra: the YAML defaults for code that builds a part directly (``make_buffer({"name":
    "fifo", "capacity": 64})``), so there is no second copy of them in Python."""
    text = yaml.safe_load((CONF_DIR / group / f"{option}.yaml").read_text()) or {}
    own = {k: v for k, v in text.items() if k != "defaults"}
    out: dict[str, Any] = {}
    for entry in text.get("defaults", ["_self_"]):
        if entry == "_self_":
            _merge(out, own)
        elif isinstance(entry, str) and not entry.endswith("_schema"):
            _merge(out, option_defaults(group, entry))
    if "_self_" not in text.get("defaults", ["_self_"]):
        _merge(out, own)
    return out


def _merge(into: dict, new: dict) -> None:
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def build_node(group: str, option: str, **values: Any):
    """The option's schema instance with its YAML defaults (:func:`option_defaults`) and
    ``values`` on top. Raises ValueError naming the keys the option does not have."""
    schema = OPTION_SCHEMAS[group][option]
    names = {f.name for f in fields(schema)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(
            f"{group}={option} has no key {', '.join(f'{group}.{k}' for k in unknown)}; "
            f"its keys: {sorted(names)}"
        )
    return schema(**{**option_defaults(group, option), **values})
