"""Building the policy side of a run, once, for every process that needs it.

:func:`build_policy` makes the task, the initial policy and its tokenizer, and fits the task's
prompts to the prompt budget; it is called by the trainer (``replay_exp.loop.build_parts``), by
each generator rank (``replay_exp.runtime.generator``), by the noise measurement
(``replay_exp.theory.measure``) and by the post-hoc evaluation of a run's final model
(``replay_exp.eval.final``). :func:`build_engine` makes the generation backend that samples a
policy's weights (in process, on a generator rank, in the measurement), and
:func:`build_evaluator` the hf backend held-out evaluations sample from (the run's own and the
post-hoc one).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from replay_exp.config.seeding import derive_seed
from replay_exp.models import load_policy, load_pretrained
from replay_exp.models.precision import compute_in
from replay_exp.rollout import HFGenerator, engine_model_dir, make_generator
from replay_exp.rollout.base import Generator
from replay_exp.rollout.collect import prompt_lengths
from replay_exp.tasks import Task, make_task


@dataclass
class BuiltPolicy:
    """A task with its prompts fitted, and the policy that answers it."""

    task: Task
    policy: PreTrainedModel  # unwrapped (what is sampled, evaluated, saved, pushed)
    tokenizer: PreTrainedTokenizerBase
    chat: bool  # prompts in the model's chat template (model.chat_template)
    origin: str  # where the weights came from: load_policy's source, or a final_model dir
    dropped: int  # problems dropped as longer than the prompt budget (task.fit_prompts)


def build_policy(
    cfg: Any, d: Any, *, loaded: tuple | None = None, weights_dir: str | Path | None = None
) -> BuiltPolicy:
    """The task of ``cfg.task`` and the initial policy of ``cfg.model`` on ``d.device``, its
    weights in ``d.param_dtype`` and its forwards in ``d.dtype`` (``d``: the derived sizes,
    ``Derived`` or a run's saved ``derived`` node), the task's problems cut to those whose
    prompt fits ``d.max_prompt_len`` tokens.

    ``loaded``: (policy, tokenizer, origin) already loaded by ``load_policy`` (a distributed
    run's rank 0 loads it once, building the warm-start cache before the other ranks).
    ``weights_dir``: load the policy from this ``save_pretrained`` directory instead (a finished
    run's ``final_model``)."""
    task = make_task(cfg.task)
    if loaded is not None:
        policy, tokenizer, origin = loaded
    elif weights_dir is not None:
        policy, tokenizer = load_pretrained(str(weights_dir), param_dtype(d))
        policy, origin = compute_in(policy.to(d.device), d.dtype), str(weights_dir)
    else:
        policy, tokenizer, origin = load_policy(
            cfg.model, cfg.task, task, d.device, param_dtype(d), d.dtype
        )
    chat = bool(cfg.model.chat_template)
    dropped = task.fit_prompts(partial(prompt_lengths, tokenizer, chat=chat), d.max_prompt_len)
    return BuiltPolicy(task, policy, tokenizer, chat, origin, dropped)


def param_dtype(d: Any) -> str:
    """The parameters' dtype of derived sizes ``d`` (a run saved before master weights
    existed trained in its compute dtype)."""
    return d.get("param_dtype", d.dtype) if hasattr(d, "get") else d.param_dtype


def build_engine(
    cfg: Any,
    d: Any,
    built: BuiltPolicy,
    *,
    share_weights: bool,
    copy_to: Path | None = None,
    remove_copy: bool = False,
    seed_tags: tuple = (),
) -> Generator:
    """The ``generation`` backend sampling ``built.policy`` (``share_weights``: its own module,
    no copy), seeded ``derive_seed(seed, "engine", *seed_tags)``. A vllm engine loads its
    architecture from the policy's origin, or from a save of the policy into ``copy_to`` when
    the origin would not do (``rollout.engine_model_dir``); ``remove_copy``: delete that save
    once the engine holds the weights."""
    p, tok = built.policy, built.tokenizer
    model_dir = None if copy_to is None else engine_model_dir(cfg, built.origin, p, tok, copy_to)
    generator = make_generator(
        cfg.generation, p, tok, share_weights=share_weights, model_dir=model_dir,
        max_model_len=d.max_prompt_len + d.max_new_tokens, dtype=d.dtype,
        seed=derive_seed(cfg.seed, "engine", *seed_tags), device=d.device,
    )  # fmt: skip
    if remove_copy and model_dir is not None and model_dir == str(copy_to):
        shutil.rmtree(model_dir)
    return generator


def build_evaluator(gcfg: Any, policy: PreTrainedModel, tokenizer) -> HFGenerator:
    """The hf backend held-out evaluations sample ``policy`` with, whatever generates the
    rollouts: ``generation``'s own settings under the hf backend, the hf defaults (chunks of
    512, the cached token-sampling loop) when the rollouts come from an engine (vllm)."""
    hf = gcfg.backend == "hf"
    return HFGenerator(
        policy, tokenizer.pad_token_id, tokenizer.eos_token_id,
        chunk_size=gcfg.chunk_size if hf else 512,
        sampler=gcfg.sampler if hf else "cached_loop",  # the token sampler, not the buffer's
        compile=gcfg.get("compile", False) if hf else False,
    )  # fmt: skip
