"""Mixed precision: the weights and Adam's state in ``model.param_dtype`` (float32, the master
weights), every forward in ``model.dtype`` (the compute dtype, e.g. bfloat16).

Why not cast the model: AdamW updates its parameters in their own dtype. At the learning
rates of RL post-training (1e-6 and below) an Adam step on a bfloat16 weight of size ~0.02 is
far below bfloat16's resolution there (2**-7 relative: a step must exceed ~8e-5 to change the
weight at all), so it rounds away and the policy barely moves
(``tests/models/test_precision.py`` measures it). With float32 master weights the same step is
kept, and only the forward's arithmetic is in bfloat16.

How: :func:`compute_in` registers two forward hooks on the policy module itself that enter and
leave ``torch.autocast(device, dtype)`` around its forward. Every caller then computes in the
compute dtype without being told (the update, the shared-prefix forward, hf generation, the
evaluation, the diagnostics, the frozen reference), the backward runs outside autocast (as
torch recommends: each op's backward in its forward's dtype), ``deepcopy`` keeps the hooks (a
generator's private copy, FSDP's evaluated copy), and the state dict is untouched: snapshots
hold the master weights and resume stays bitwise. Autocast runs matrix products and attention
in the compute dtype and keeps softmax, norms and reductions in float32 (torch's op lists);
the loss reads the logits in float32 (``models.forward``).

``runtime.wrapper=fsdp`` adds FSDP's own mixed-precision policy on top (``runtime.trainer.
wrap``): parameters gathered in the compute dtype, gradients reduced in float32 into the
float32 shards.

float16 compute needs a loss scale (its exponent range loses small gradients), which this
project does not implement: ``resolve()`` refuses float16 over float32 weights.
"""

from __future__ import annotations

import contextlib

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_ATTR = "_replay_exp_compute"  # the module's (dtype, hook handles); deepcopy copies it
_STACK = "_replay_exp_autocast_stack"  # open autocast contexts (a forward may re-enter)


def compute_in(model: torch.nn.Module, dtype: str) -> torch.nn.Module:
    """Make every forward of ``model`` compute in ``dtype`` (module docstring): autocast
    hooks when ``dtype`` is below its parameters' dtype, nothing otherwise (float32 runs are
    unchanged to the bit). Returns ``model``; calling it again replaces the earlier setting."""
    previous = model.__dict__.pop(_ATTR, None)
    if previous is not None:
        for handle in previous[1]:
            handle.remove()
    if DTYPES[dtype] == param_dtype(model):
        return model
    handles = (
        model.register_forward_pre_hook(_enter),
        model.register_forward_hook(_leave, always_call=True),
    )
    model.__dict__[_ATTR] = (DTYPES[dtype], handles)
    return model


def held_casts(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """A block over which ``model``'s compute-dtype copies of its weights are made once and
    kept: an outer ``torch.autocast`` around many forwards with unchanged weights (a whole
    generation: one forward per token), whose cast cache the hooks' inner autocast reuses
    (autocast clears it only when its outermost context exits). Without it each decode step
    casts every weight again (at 135 M parameters on a CPU that was a third of a bf16
    evaluation's time). A no-op for a model computing in its parameters' dtype (float32 runs
    are unchanged to the bit). Only for forwards that leave the weights as they are."""
    setting = model.__dict__.get(_ATTR)
    if setting is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=next(model.parameters()).device.type, dtype=setting[0])


def compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype ``model``'s forwards compute in (its parameters' unless :func:`compute_in`
    set a lower one)."""
    setting = model.__dict__.get(_ATTR)
    return setting[0] if setting is not None else param_dtype(model)


def param_dtype(model: torch.nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def _enter(module: torch.nn.Module, args) -> None:
    dtype = module.__dict__[_ATTR][0]
    device = next(module.parameters()).device.type
    ctx = torch.autocast(device_type=device, dtype=dtype)
    ctx.__enter__()
    module.__dict__.setdefault(_STACK, []).append(ctx)


def _leave(module: torch.nn.Module, args, output) -> None:
    stack = module.__dict__.get(_STACK)
    if stack:  # empty only if the pre-hook itself failed
        stack.pop().__exit__(None, None, None)
