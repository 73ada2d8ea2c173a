"""``generation=vllm``: rollouts from a vLLM offline engine (``vllm.LLM``) colocated with the
trainer, whose weights are pushed into the running engine in place at every sync.

How it works (checked against the installed vLLM 0.32.0 source, CPU build ``vllm-cpu``):

1. **In process.** The engine is created with ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so the
   engine core, its executor (``UniProcExecutor``) and its one worker live in the trainer's
   process, taking ``gpu_memory_utilization`` of the GPU (on CPU, a fixed
   ``kv_cache_memory_bytes``: the CPU worker counts the whole process's RSS as used). The
   worker has no device argument: it takes ``cuda:<local rank>``, i.e. the first visible GPU,
   so ``resolve()`` refuses ``device=cuda:N`` for N > 0 (use ``CUDA_VISIBLE_DEVICES=N``).
   Read from source, not run on a GPU here.
   ``llm.collective_rpc`` then calls the worker directly: weights travel by reference, no
   serialisation, no second process.
2. **Token ids in, token ids out.** Prompts go in as ``{"prompt_token_ids": [...]}`` with each
   row's left padding stripped; the engine starts with ``skip_tokenizer_init=True`` (never
   re-tokenizes, never detokenizes). Our EOS is the only stop token, as in the hf backend:
   ``stop_token_ids=[eos]`` with ``ignore_eos=True`` (without it vLLM also stops at the
   checkpoint's own EOS ids); the EOS id is part of the returned ids. ``generation_config=
   "vllm"`` keeps a checkpoint's ``generation_config.json`` (top_k, repetition penalty, ...)
   out of the sampling.
3. **Behaviour log-probs.** vLLM's default ``logprobs_mode="raw_logprobs"`` returns
   ``log_softmax`` of the RAW logits (temperature 1, before any processing), which is not our
   convention when the temperature is not 1. We start the engine with
   ``logprobs_mode="processed_logprobs"``: ``log_softmax`` of the logits after temperature AND
   after top-k/top-p masking (``vllm/v1/sample/sampler.py`` and ``ops/topk_topp_sampler.py``).
   With ``top_p = 1`` (our default) that is exactly the temperature-scaled log-prob we store
   (measured on vllm-cpu: max |diff| to the trainer's recomputation below 1e-6 in float32, at
   temperatures 1.0 and 0.7). At temperature 0 (greedy) vLLM skips the temperature and returns
   the temperature-1 log-prob, as our other samplers do. With ``top_p < 1`` the value is
   renormalised over the nucleus (``logp - log(nucleus mass)``, i.e. truncation INCLUDED),
   which no vLLM mode avoids: use ``generation.behaviour_logp=trainer`` then (a warning says
   so once).
4. **Weight sync in place** (:meth:`VLLMGenerator.sync_weights`): the worker's
   ``reload_weights(weights_iterator=[(hf_name, tensor), ...], is_checkpoint_format=True)``
   (vLLM's layerwise in-place reload: it loads checkpoint-format tensors through the model's
   own ``load_weights``, which fuses q/k/v and gate/up, re-runs each layer's weight
   processing and copies the result into the ORIGINAL storage, so CUDA graphs stay valid).
   Tied embeddings: the trainer's ``lm_head.weight`` is left out (vLLM's Llama/Qwen2 loaders
   skip it and the head shares the embedding's storage); because vLLM's reload does not
   re-process a head that received no weights, every embedding/head layer is re-processed
   afterwards (a no-op on GPU; on CPU it rebuilds the packed GEMM the head computes with, which
   would otherwise keep the OLD weights). Then the prefix cache (KV of earlier prompts,
   computed with the old weights) is reset.
5. **Side effects contained.** Creating the engine in process reseeds the global RNGs and, on
   CPU, sets torch to one thread and replaces ``torch.set_num_threads``; the trainer's RNG
   state (torch, CUDA, numpy, random) is saved and restored around every engine call, and the
   thread setting is restored after start-up.
6. ``share_weights=True`` (weights synced after every update) keeps only the version in a
   snapshot and, on restore, pushes the trainer's module (restored before the generator);
   ``share_weights=False`` keeps a CPU copy of the last synced weights, which a snapshot holds
   and a restore pushes back, so a resumed run samples the same stale weights.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import logging
import os
import random
import time
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import torch

from replay_exp.rollout.base import Generation, Generator, SamplingParams, completion_mask

log = logging.getLogger(__name__)

MISSING_VLLM = (
    "generation.backend=vllm needs the vllm package: pip install -e '.[gpu]' on a GPU machine, "
    "or scripts/setup_vllm_cpu.sh for the CPU build"
)
DTYPES = ("float32", "bfloat16", "float16")
CPU_KV_CACHE_BYTES = 256 << 20  # KV cache of the CPU build when none is given


def strip_left_padding(ids_BxP: torch.Tensor, mask_BxP: torch.Tensor) -> list[list[int]]:
    """The real tokens of each prompt row (mask True), as plain lists of ids."""
    return [row[m].tolist() for row, m in zip(ids_BxP.cpu(), mask_BxP.cpu().bool(), strict=True)]


def row_seeds(seed: int, n: int) -> list[int]:
    """One sampling seed per row, a fixed function of (seed, row): rows that share a prompt
    (the G samples of a group) draw different samples, and the same seed repeats them."""
    out = []
    for i in range(n):
        digest = hashlib.blake2b(f"vllm:{seed}:{i}".encode(), digest_size=8).digest()
        out.append(int.from_bytes(digest, "little") >> 1)  # 63 bits
    return out


def assemble_generation(
    token_ids: Sequence[Sequence[int]],
    logprobs: Sequence[Sequence[float]],
    pad_id: int,
    eos_id: int,
    version: int,
) -> Generation:
    """Per-row completions and their log-probs -> one right-padded Generation: mask up to and
    including the first EOS, pad id and log-prob 0 after it."""
    if len(token_ids) != len(logprobs):
        raise ValueError(f"{len(token_ids)} completions but {len(logprobs)} log-prob rows")
    C = max([len(t) for t in token_ids] + [1])
    ids_BxC = torch.full((len(token_ids), C), pad_id, dtype=torch.long)
    logp_BxC = torch.zeros((len(token_ids), C), dtype=torch.float32)
    for i, (toks, lps) in enumerate(zip(token_ids, logprobs, strict=True)):
        if len(toks) != len(lps):
            raise ValueError(f"row {i}: {len(toks)} tokens but {len(lps)} log-probs")
        ids_BxC[i, : len(toks)] = torch.tensor(list(toks), dtype=torch.long)
        logp_BxC[i, : len(lps)] = torch.tensor(list(lps), dtype=torch.float32)
    mask_BxC, finished_B = completion_mask(ids_BxC, eos_id)
    if len(token_ids):
        real_BxC = torch.arange(C)[None, :] < torch.tensor([len(t) for t in token_ids])[:, None]
        mask_BxC = mask_BxC & real_BxC
    return Generation(
        completion_ids_BxC=ids_BxC.masked_fill(~mask_BxC, pad_id),
        completion_mask_BxC=mask_BxC,
        behaviour_logp_BxC=logp_BxC.masked_fill(~mask_BxC, 0.0),
        finished_B=finished_B,
        version=version,
    )


def hf_weight_items(
    weights: torch.nn.Module | Mapping[str, torch.Tensor], tie_word_embeddings: bool
) -> list[tuple[str, torch.Tensor]]:
    """(transformers name, detached tensor) pairs to load into the engine, from a module or a
    state dict: ``lm_head.weight`` left out when the embeddings are tied (the engine's head
    shares the embedding), rotary ``inv_freq`` buffers left out, a ``torch.compile`` wrapper's
    ``_orig_mod.`` prefix removed."""
    state = weights.state_dict() if isinstance(weights, torch.nn.Module) else weights
    items = []
    for name, tensor in state.items():
        name = name.replace("_orig_mod.", "")
        if name.endswith("rotary_emb.inv_freq"):
            continue
        if tie_word_embeddings and name == "lm_head.weight":
            continue
        items.append((name, tensor.detach()))
    return items


@contextlib.contextmanager
def _preserved_rng(cuda: bool) -> Iterator[None]:
    """Restore the global torch / CUDA / numpy / random states on exit (the engine reseeds and
    draws from them; the trainer's streams must not depend on the backend)."""
    py, np_state = random.getstate(), np.random.get_state()
    devices = [torch.cuda.current_device()] if cuda and torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(py)
            np.random.set_state(np_state)


class _DropBenign(logging.Filter):
    """Drops vLLM warnings that are expected here, and only those: the chat-template warm-up
    failing without a tokenizer (we skip it), and the in-place reload finding no weights for
    the rotary embedding and a tied output head (they have none of their own)."""

    def __init__(self, tied: bool):
        super().__init__()
        self.no_weights = {"RotaryEmbedding"} | ({"ParallelLMHead"} if tied else set())

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "Chat template warmup failed":
            return False
        if record.msg == "%s: Failed to load weights" and record.args:
            return record.args[0] not in self.no_weights
        return True


@contextlib.contextmanager
def _benign_vllm_warnings_dropped(tied: bool) -> Iterator[None]:
    names = ("vllm.renderers.base", "vllm.model_executor.model_loader.reload.layerwise")
    loggers, flt = [logging.getLogger(n) for n in names], _DropBenign(tied)
    for lg in loggers:
        lg.addFilter(flt)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(flt)


def _refresh_embedding_layers(worker) -> int:
    """Worker-side: re-run weight processing of every (unquantized) embedding / output-head
    layer, so a tied head computes with the reloaded embedding (CPU packs it; GPU: no-op)."""
    n = 0
    for module in worker.get_model().modules():
        method = getattr(module, "quant_method", None)
        if type(method).__name__ == "UnquantizedEmbeddingMethod":
            method.process_weights_after_loading(module)
            n += 1
    return n


class VLLMGenerator(Generator):
    """Samples with a colocated, in-process ``vllm.LLM`` that always holds the weights of
    ``version`` (those of ``policy`` at start-up, then each :meth:`sync_weights`).

    ``model_dir`` (a ``save_pretrained`` dir or hub id) gives the architecture and config; its
    weights are replaced by ``policy``'s at once. ``tokenizer`` is kept for reference only (the
    engine never tokenizes). ``kv_cache_memory_bytes`` fixes the KV cache size instead of
    ``gpu_memory_utilization`` (default on CPU: 256 MiB). ``chunk_size`` rows go to the engine
    per ``generate`` call (it batches inside a call)."""

    def __init__(
        self,
        policy: torch.nn.Module,
        tokenizer=None,
        model_dir: str | None = None,
        *,
        pad_id: int,
        eos_id: int,
        max_model_len: int,
        dtype: str = "bfloat16",
        seed: int = 0,
        gpu_memory_utilization: float = 0.35,
        enforce_eager: bool = False,
        chunk_size: int = 256,
        share_weights: bool = True,
        device: str = "cuda",
        kv_cache_memory_bytes: int | None = None,
    ):
        try:
            import vllm
        except ImportError as e:
            raise ImportError(MISSING_VLLM) from e
        if model_dir is None:
            raise ValueError("generation.backend=vllm needs model_dir (a save_pretrained dir)")
        if dtype not in DTYPES:
            raise ValueError(f"vllm dtype={dtype!r} is unknown; choose one of {DTYPES}")
        if chunk_size < 1:
            raise ValueError(f"generation.chunk_size={chunk_size} must be >= 1")
        self.policy, self.tokenizer, self.model_dir = policy, tokenizer, str(model_dir)
        self.pad_id, self.eos_id = int(pad_id), int(eos_id)
        self.max_model_len, self.chunk_size = int(max_model_len), int(chunk_size)
        self.share_weights, self.device = share_weights, device
        self.version = 0
        self.synced_weights: dict[str, torch.Tensor] | None = None  # share_weights=False
        self.last_sync_seconds = 0.0
        self._warned_top_p = False
        on_cpu = str(device).startswith("cpu")
        if on_cpu and kv_cache_memory_bytes is None:
            kv_cache_memory_bytes = CPU_KV_CACHE_BYTES
        # In-process engine core: the worker (and its model) live in this process.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        t0 = time.perf_counter()
        try:
            with _preserved_rng(cuda=not on_cpu), _benign_vllm_warnings_dropped(tied=False):
                self.llm = vllm.LLM(
                    model=self.model_dir,
                    dtype=dtype,
                    seed=seed,
                    max_model_len=self.max_model_len,
                    gpu_memory_utilization=gpu_memory_utilization,
                    kv_cache_memory_bytes=kv_cache_memory_bytes,
                    enforce_eager=enforce_eager,
                    skip_tokenizer_init=True,
                    logprobs_mode="processed_logprobs",
                    generation_config="vllm",
                    enable_prefix_caching=True,
                )
        finally:
            torch.set_num_threads = set_threads  # the CPU worker replaces it process-wide
            torch.set_num_threads(threads)
        self.start_seconds = time.perf_counter() - t0
        from vllm.v1.engine.core_client import InprocClient

        if not isinstance(self.llm.llm_engine.engine_core, InprocClient):
            self.close()
            raise RuntimeError(
                "vllm engine started in a separate process (VLLM_ENABLE_V1_MULTIPROCESSING was "
                "read before this generator set it to 0); in-place weight sync needs it in "
                "process: create the generator before any other vllm engine"
            )
        hf_config = self.llm.llm_engine.model_config.hf_config.get_text_config()
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        policy_tied = getattr(getattr(policy, "config", None), "tie_word_embeddings", None)
        if policy_tied is not None and bool(policy_tied) != self.tie_word_embeddings:
            self.close()
            raise ValueError(
                f"{self.model_dir} has tie_word_embeddings={self.tie_word_embeddings} but the "
                f"policy has {bool(policy_tied)}; save the policy there (save_pretrained) first"
            )
        log.info("vllm engine up in %.1f s (%s, %s)", self.start_seconds, self.model_dir, dtype)
        self.sync_weights(policy, 0)  # sample the trainer's weights, not model_dir's

    # -- weights --------------------------------------------------------------------------------

    def sync_weights(self, weights: torch.nn.Module | dict, version: int) -> None:
        """Push ``weights`` (a module or a transformers-named state dict) into the running
        engine in place, reset its prefix cache, and stamp later rollouts with ``version``."""
        t0 = time.perf_counter()
        items = hf_weight_items(weights, self.tie_word_embeddings)
        quiet = _benign_vllm_warnings_dropped(self.tie_word_embeddings)
        with torch.no_grad(), _preserved_rng(cuda=self._on_cuda), quiet:
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": items, "is_checkpoint_format": True}
            )
            self.llm.collective_rpc(_refresh_embedding_layers)
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vllm could not reset its prefix cache after a weight update")
        if not self.share_weights:
            self.synced_weights = {k: v.to("cpu", copy=True) for k, v in items}
        self.version = int(version)
        self.last_sync_seconds = time.perf_counter() - t0

    def private_weights(self) -> dict:
        return self.synced_weights

    def restore(self, weights: dict | None, version: int) -> None:
        # share_weights: the engine follows the trainer's module (restored before us).
        self.sync_weights(self.policy if weights is None else weights, version)

    # -- sampling -------------------------------------------------------------------------------

    @property
    def _on_cuda(self) -> bool:
        return not str(self.device).startswith("cpu")

    def sampling_params(self, params: SamplingParams, seeds: Sequence[int]) -> list:
        """One vLLM ``SamplingParams`` per row: n=1, the sampled token's log-prob only, our EOS
        as the only stop token (kept in the output; the checkpoint's EOS ids ignored)."""
        from vllm import SamplingParams as VSamplingParams

        greedy = params.temperature == 0
        return [
            VSamplingParams(
                n=1,
                temperature=0.0 if greedy else float(params.temperature),
                top_p=1.0 if greedy else float(params.top_p),
                top_k=0,
                max_tokens=int(params.max_new_tokens),
                logprobs=0,
                seed=s,
                stop_token_ids=[self.eos_id],
                ignore_eos=True,
                detokenize=False,
            )
            for s in seeds
        ]

    @torch.no_grad()
    def generate(
        self,
        prompt_ids_BxP: torch.Tensor,
        prompt_mask_BxP: torch.Tensor,
        params: SamplingParams,
        seed: int,
    ) -> Generation:
        if params.top_p < 1.0 and params.temperature > 0 and not self._warned_top_p:
            log.warning(
                "generation=vllm with top_p=%s < 1: vLLM's log-probs are renormalised over the "
                "nucleus, not the pre-truncation log-probs the trainer recomputes; use "
                "generation.behaviour_logp=trainer",
                params.top_p,
            )
            self._warned_top_p = True
        prompts = strip_left_padding(prompt_ids_BxP, prompt_mask_BxP)
        longest = max((len(p) for p in prompts), default=0)
        if longest + params.max_new_tokens > self.max_model_len:
            raise ValueError(
                f"prompt of {longest} tokens + max_new_tokens={params.max_new_tokens} exceeds "
                f"the engine's max_model_len={self.max_model_len}"
            )
        sps = self.sampling_params(params, row_seeds(seed, len(prompts)))
        token_ids: list[list[int]] = []
        logprobs: list[list[float]] = []
        with _preserved_rng(cuda=self._on_cuda):
            for i in range(0, len(prompts), self.chunk_size):
                outs = self.llm.generate(
                    [{"prompt_token_ids": p} for p in prompts[i : i + self.chunk_size]],
                    sps[i : i + self.chunk_size],
                    use_tqdm=False,
                )
                for out in outs:
                    comp = out.outputs[0]
                    toks = list(comp.token_ids)
                    token_ids.append(toks)
                    lps = zip(comp.logprobs, toks, strict=True)
                    logprobs.append([lp[t].logprob for lp, t in lps])
        return assemble_generation(token_ids, logprobs, self.pad_id, self.eos_id, self.version)

    def close(self) -> None:
        """Shut the engine down and free its memory (the object is unusable afterwards)."""
        llm = self.__dict__.pop("llm", None)
        if llm is None:
            return
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        if self._on_cuda and torch.cuda.is_available():
            torch.cuda.empty_cache()
