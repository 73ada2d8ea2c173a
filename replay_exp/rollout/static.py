"""``generation.sampler=static``: the cached sampling loop over a KV cache of fixed shape, so
that one decode step can be compiled (and, on CUDA, captured as one CUDA graph) once.

Why: ``cached_loop`` (:mod:`replay_exp.rollout.sampler`) grows its KV cache by one column per
token (transformers' ``DynamicCache``: a ``torch.cat`` per layer) and concatenates its attention
mask every step, so every decode step has new shapes. On a GPU the step is then launch-bound: a
small model spends its time launching a kernel per op per token (tens of microseconds each,
hundreds of ops per step), and nothing can be captured because no two steps look alike.

How: the cache is transformers' ``StaticCache``, preallocated at ``[B, heads, L, head_dim]``
per layer with ``L = P + max_new_tokens`` rounded up to :data:`LENGTH_BUCKET` (P: the chunk's
padded prompt length). Each decode step then has the same shapes: the input token ``[B, 1]``,
its position id ``[B, 1]`` (each row's count of real tokens so far, as ``cached_loop`` and
``generate`` count them under left padding), and one attention mask ``[B, L]`` for the whole
chunk (the prompt's padding mask, then ones). In transformers 5.x a static cache layer keeps its
write position as a tensor (``cumulative_length``), which the step advances in place and the
causal mask reads as the query's offset, so there is no ``cache_position`` argument to pass:
columns not yet written are masked by causality, the prompt's padding by the mask.
``generation.compile=true`` wraps that step in ``torch.compile(dynamic=False)``, with
``mode="reduce-overhead"`` (CUDA graphs) on CUDA and inductor's default mode elsewhere.

The prefill is the shared-prefix one (:func:`replay_exp.models.shared_prefix.prefill`): each
distinct prompt runs once into a ``DynamicCache``, whose ``[B, heads, P, head_dim]`` keys and
values are then copied into the first P columns of the static cache (one copy of the prompt's
cache per chunk, against a decode that reads the whole cache at every token), so the G samples
of a group still share one prompt forward and the first token's logits are those of
``cached_loop`` to the bit.

Sampling is ``cached_loop``'s: the same :func:`replay_exp.rollout.sampler.next_token` on the
same logits (up to float rounding: attention runs over L masked columns instead of the cache's
current length), the same draws from the same generator in the same order, the same stop
(every row past EOS, or max_new_tokens), pad after EOS. With one seed both samplers therefore
draw the same tokens (tests/rollout/test_static_sampler.py).

Compute dtype: the static cache holds the keys in the dtype the prefill made them (RoPE's
output: float32 over float32 weights, even under autocast) and the values in the compute dtype
(v_proj's output under :func:`replay_exp.models.precision.compute_in`'s autocast). The
prefill's ``DynamicCache`` holds its values in the keys' dtype (``torch.cat`` onto its empty
first tensor promotes them), so copying them back down is exact.

Compilation (``generation.compile=true``): each :class:`StaticSampler` (one per generator)
compiles its step once per device type and compute dtype; torch compiles a new graph for each
new shape (another chunk size, another length bucket) and reuses it for every later call of
that shape. The compiled function has a code object of its own (torch counts graphs against
``recompile_limit`` per code object) and raises that limit for a shape it meets first, so a run's
few shapes each get a graph instead of falling back to eager past 8. While compiling, the static
cache is kept between calls and reused while its shape fits, so CUDA graphs find their buffers
at the same addresses; the cache's memory is then held between generations (without compile it
is freed after each chunk, as cached_loop's is). The eager step calls ``model(...)``, so the
autocast hooks of ``compute_in`` run; dynamo cannot trace them (a context manager entered in a
pre-hook and left in a post-hook fails with "'autocast' object has no attribute 'prev'"), so the
compiled step instead enters the same ``torch.autocast`` itself around ``model.forward``, and
refuses a policy that carries any other forward hook.

Only full-attention models are supported (every cache layer a plain ``StaticLayer``); a model
with sliding-window or other layer kinds is refused with a ValueError.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer

from replay_exp.models.precision import compute_dtype, param_dtype
from replay_exp.models.shared_prefix import prefill
from replay_exp.rollout.base import SamplingParams
from replay_exp.rollout.sampler import sample_loop

# The static cache's length is rounded up to a multiple of this, so that chunks whose padded
# prompts differ by a few tokens share one compiled step (the extra columns are masked).
LENGTH_BUCKET = 32


def decode_step(
    model: Callable,
    tok_Bx1: torch.Tensor,
    attn_BxL: torch.Tensor,
    pos_Bx1: torch.Tensor,
    cache: StaticCache,
) -> torch.Tensor:
    """One token for every row: writes its keys and values at the cache's write position
    (advancing it) and returns the next-token logits [B, V]. Fixed shapes for a given cache.
    ``model``: the policy module, whose forward hooks (the compute dtype's autocast) then run,
    or its ``forward`` (the compiled step, which enters that autocast itself)."""
    out = model(
        input_ids=tok_Bx1,
        attention_mask=attn_BxL,
        position_ids=pos_Bx1,
        past_key_values=cache,
        use_cache=True,
    )
    return out.logits[:, -1]


def compilable_step(model: torch.nn.Module, device_type: str) -> Callable:
    """:func:`decode_step` in the form ``torch.compile`` traces: the autocast that
    :func:`~replay_exp.models.precision.compute_in`'s hooks would enter is entered inside the
    function, around ``model.forward``. Dynamo cannot trace those hooks (a context manager
    entered in a pre-hook and left in a post-hook: "'autocast' object has no attribute
    'prev'"), and a policy with any other forward hook is refused rather than silently run
    without it."""
    amp = compute_dtype(model)
    autocast = amp != param_dtype(model)
    hooks = len(model._forward_pre_hooks) + len(model._forward_hooks)
    if hooks != (2 if autocast else 0):
        raise ValueError(
            "generation.compile=true: the policy has forward hooks other than the compute "
            "dtype's autocast, which the compiled decode step would skip; use compile=false"
        )

    def step(tok_Bx1, attn_BxL, pos_Bx1, cache):
        amp_ctx = torch.autocast(device_type, dtype=amp) if autocast else contextlib.nullcontext()
        with amp_ctx:  # model.forward: the same call without the hooks' autocast
            return decode_step(model.forward, tok_Bx1, attn_BxL, pos_Bx1, cache)

    # A code object of its own: torch keeps compiled graphs (and counts them against
    # recompile_limit) per code object, so samplers of one process do not share a budget.
    step.__code__ = step.__code__.replace()
    return step


class StaticSampler:
    """Samples from ``model`` over a static KV cache; holds the compiled decode steps and,
    when compiling, the cache (module docstring)."""

    def __init__(self, model: torch.nn.Module, compile: bool = False):
        self.model = model
        self.compile = compile
        self._steps: dict[tuple, Callable] = {}  # (device type, compute dtype) -> compiled step
        self._graphs: set[tuple] = set()  # the shapes (and dtypes) the steps were compiled for
        self._cache: StaticCache | None = None  # kept only when compiling

    def step_fn(self, device: torch.device) -> Callable:
        """The decode step: eager through ``model(...)``, or compiled, once per device type
        and compute dtype (torch compiles it again for each new shape)."""
        if not self.compile:
            return functools.partial(decode_step, self.model)
        key = (device.type, compute_dtype(self.model))
        if key not in self._steps:
            mode = "reduce-overhead" if device.type == "cuda" else None
            step = compilable_step(self.model, device.type)
            self._steps[key] = torch.compile(step, mode=mode, dynamic=False)
        return self._steps[key]

    def room_for_graph(self, device: torch.device, cache: StaticCache):
        """A context for a chunk's decode loop. torch keeps up to ``recompile_limit`` (8)
        graphs per compiled function and runs it eagerly past that; a run has a few shapes
        (chunk sizes x length buckets), so a shape this sampler has not compiled yet raises
        the limit to cover it while its first call compiles."""
        if not self.compile:
            return contextlib.nullcontext()
        layer = cache.layers[0]
        graph = (device.type, compute_dtype(self.model), layer.keys.shape, layer.keys.dtype,
                 layer.values.dtype)  # fmt: skip
        if graph in self._graphs:
            return contextlib.nullcontext()
        self._graphs.add(graph)
        limit = max(torch._dynamo.config.recompile_limit, len(self._graphs))
        return torch._dynamo.config.patch(recompile_limit=limit)

    def static_cache(self, dyn_cache, batch: int, length: int) -> StaticCache:
        """A static cache of ``length`` columns holding ``dyn_cache``'s prompt in its first
        columns, its write position after them."""
        src = dyn_cache.layers
        # Keys in the prompt's keys' dtype, values in the compute dtype (module docstring): the
        # static layer allocates both in the keys' dtype, and index_copy_ of a decode step's
        # bfloat16 values into float32 would fail.
        dtypes = (src[0].keys.dtype, compute_dtype(self.model))
        cache = self._cache
        if cache is not None and _shape(cache) == (batch, length, src[0].keys.device, *dtypes):
            cache.reset()
        else:
            cache = StaticCache(config=self.model.config, max_cache_len=length)
            if len(cache.layers) != len(src) or any(
                type(x) is not StaticLayer for x in cache.layers
            ):
                kinds = sorted({type(x).__name__ for x in cache.layers})
                raise ValueError(
                    f"generation.sampler=static supports full-attention models only; this "
                    f"model's static cache has layers {kinds}: use generation.sampler=cached_loop"
                )
            for dst, s in zip(cache.layers, src, strict=True):
                dst.lazy_initialization(s.keys[:, :, :0], s.values[:, :, :0])
                if dst.values.dtype != dtypes[1]:
                    dst.values = torch.zeros_like(dst.values, dtype=dtypes[1])
                    torch._dynamo.mark_static_address(dst.values)
        P = src[0].keys.shape[2]
        for dst, s in zip(cache.layers, src, strict=True):
            dst.keys[:, :, :P].copy_(s.keys)
            dst.values[:, :, :P].copy_(s.values)  # exact: they were values of this dtype
            dst.cumulative_length.fill_(P)
        self._cache = cache if self.compile else None
        return cache

    @torch.no_grad()
    def sample(
        self,
        prompt_ids_BxP: torch.Tensor,
        prompt_mask_BxP: torch.Tensor,
        params: SamplingParams,
        rng: torch.Generator | None,
        eos_id: int,
        pad_id: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Completions [B, <= max_new_tokens] (pad after EOS) and their behaviour log-probs,
        as :func:`replay_exp.rollout.sampler.sample_cached` returns them."""
        B, P = prompt_ids_BxP.shape
        device = prompt_ids_BxP.device
        logits_BxV, dyn_cache, pos_B = prefill(self.model, prompt_ids_BxP, prompt_mask_BxP)
        L = -(-(P + params.max_new_tokens) // LENGTH_BUCKET) * LENGTH_BUCKET
        cache = self.static_cache(dyn_cache, B, L)
        del dyn_cache
        attn_BxL = torch.ones(B, L, dtype=torch.long, device=device)
        attn_BxL[:, :P] = prompt_mask_BxP.long()
        step = self.step_fn(device)
        graphs = self.compile and device.type == "cuda"

        def advance(tok_B: torch.Tensor, t: int) -> torch.Tensor:
            if graphs:  # the last step's logits are consumed: its buffers may be reused
                torch.compiler.cudagraph_mark_step_begin()
            return step(tok_B[:, None], attn_BxL, (pos_B + t)[:, None], cache)

        with self.room_for_graph(device, cache):
            return sample_loop(logits_BxV, advance, params, rng, eos_id, pad_id)


def _shape(cache: StaticCache) -> tuple:
    """(batch, length, device, key dtype, value dtype) of an initialised static cache."""
    layer = cache.layers[0]
    return (layer.keys.shape[0], layer.max_cache_len, layer.keys.device, layer.keys.dtype,
            layer.values.dtype)  # fmt: skip


def sample_static(
    model: torch.nn.Module,
    prompt_ids_BxP: torch.Tensor,
    prompt_mask_BxP: torch.Tensor,
    params: SamplingParams,
    rng: torch.Generator | None,
    eos_id: int,
    pad_id: int,
    compile: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:meth:`StaticSampler.sample` with a sampler of its own (compiles at every call when
    ``compile``: hold a :class:`StaticSampler` instead, as ``HFGenerator`` does)."""
    sampler = StaticSampler(model, compile=compile)
    return sampler.sample(prompt_ids_BxP, prompt_mask_BxP, params, rng, eos_id, pad_id)
