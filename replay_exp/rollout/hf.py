"""``generation=hf``: sampling from the trainer's transformers model (left padding, KV cache),
with our KV-cached loop (``generation.sampler=cached_loop``, :mod:`replay_exp.rollout.sampler`),
the same loop over a fixed-shape cache whose decode step can be compiled
(``generation.sampler=static``, ``generation.compile``, :mod:`replay_exp.rollout.static`) or
transformers ``generate`` (``generation.sampler=generate``)."""

from __future__ import annotations

import copy

import torch
from transformers import PreTrainedModel

from replay_exp.models.precision import held_casts
from replay_exp.rollout.base import Generation, Generator, SamplingParams, completion_mask
from replay_exp.rollout.sampler import sample_cached
from replay_exp.rollout.static import StaticSampler

SAMPLERS = ("cached_loop", "generate", "static")


class HFGenerator(Generator):
    """Samples with our KV-cached loop (``sampler="cached_loop"``), that loop over a static
    cache (``sampler="static"``; ``compile=True`` compiles its decode step once per shape) or
    ``model.generate``.

    ``share_weights=True`` samples from the trainer's own module (no copy; only valid when
    weights are synced after every update); otherwise the generator keeps a private copy that
    ``sync_weights`` refreshes, so rollouts may come from stale weights."""

    def __init__(
        self,
        policy: PreTrainedModel,
        pad_id: int,
        eos_id: int,
        share_weights: bool = True,
        chunk_size: int = 256,
        sampler: str = "cached_loop",
        compile: bool = False,
    ):
        if sampler not in SAMPLERS:
            raise ValueError(f"generation.sampler={sampler!r} is unknown; choose one of {SAMPLERS}")
        if compile and sampler != "static":
            raise ValueError(
                f"generation.compile=true compiles the static sampler's decode step; "
                f"generation.sampler={sampler} has none (use generation.sampler=static)"
            )
        self.sampler, self.compile = sampler, compile
        self.model = policy if share_weights else copy.deepcopy(policy)
        # The static sampler keeps its compiled step (and, compiling, its cache) across calls.
        self._static = StaticSampler(self.model, compile) if sampler == "static" else None
        self.share_weights = share_weights
        self.pad_id, self.eos_id, self.chunk_size = pad_id, eos_id, chunk_size
        self.version = 0

    def sync_weights(self, weights: torch.nn.Module | dict, version: int) -> None:
        if not self.share_weights:
            state = weights if isinstance(weights, dict) else weights.state_dict()
            self.model.load_state_dict(state)
        self.version = version

    def private_weights(self) -> dict:
        return self.model.state_dict()

    def restore(self, weights: dict | None, version: int) -> None:
        if weights is not None:
            self.model.load_state_dict(weights)
        self.version = version

    @torch.no_grad()
    def generate(
        self,
        prompt_ids_BxP: torch.Tensor,
        prompt_mask_BxP: torch.Tensor,
        params: SamplingParams,
        seed: int,
    ) -> Generation:
        was_training = self.model.training
        self.model.eval()
        device = next(self.model.parameters()).device
        sample = {"cached_loop": self._sample_cached, "generate": self._sample_generate,
                  "static": self._sample_static}[self.sampler]  # fmt: skip
        rng = torch.Generator(device=device).manual_seed(seed)
        torch.manual_seed(seed)  # generate() draws from the global generator
        ids, logps = [], []
        with held_casts(self.model):  # bf16 compute: the weights cast once, not once a token
            for i in range(0, prompt_ids_BxP.shape[0], self.chunk_size):
                p_ids = prompt_ids_BxP[i : i + self.chunk_size].to(device)
                p_mask = prompt_mask_BxP[i : i + self.chunk_size].to(device)
                comp, logp = sample(p_ids, p_mask, params, rng)
                ids.append(comp.cpu())
                logps.append(logp.cpu())
        self.model.train(was_training)
        return self._generation(ids, logps)

    def _sample_cached(self, p_ids, p_mask, params, rng):
        return sample_cached(self.model, p_ids, p_mask, params, rng, self.eos_id, self.pad_id)

    def _sample_static(self, p_ids, p_mask, params, rng):
        return self._static.sample(p_ids, p_mask, params, rng, self.eos_id, self.pad_id)

    def _sample_generate(self, p_ids, p_mask, params, rng):
        greedy = params.temperature == 0
        kwargs = dict(
            max_new_tokens=params.max_new_tokens,
            do_sample=not greedy,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        if not greedy:
            kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=0)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        out = self.model.generate(input_ids=p_ids, attention_mask=p_mask.long(), **kwargs)
        comp = out.sequences[:, p_ids.shape[1] :]
        logits_BxCxV = torch.stack(out.logits, dim=1).float() / (
            1.0 if greedy else params.temperature
        )
        logp = torch.log_softmax(logits_BxCxV, dim=-1).gather(-1, comp.unsqueeze(-1))
        return comp, logp.squeeze(-1)

    def _generation(self, ids: list[torch.Tensor], logps: list[torch.Tensor]) -> Generation:
        """Chunks of completions and log-probs -> one right-padded, EOS-masked Generation."""
        C = max(x.shape[1] for x in ids)
        comp_ids = torch.cat([_pad_right(x, C, self.pad_id) for x in ids])
        logp_BxC = torch.cat([_pad_right(x, C, 0.0) for x in logps])
        mask, finished = completion_mask(comp_ids, self.eos_id)
        comp_ids = comp_ids.masked_fill(~mask, self.pad_id)
        return Generation(
            completion_ids_BxC=comp_ids,
            completion_mask_BxC=mask,
            behaviour_logp_BxC=logp_BxC.masked_fill(~mask, 0.0),
            finished_B=finished,
            version=self.version,
        )


def _pad_right(x: torch.Tensor, width: int, value) -> torch.Tensor:
    if x.shape[1] == width:
        return x
    return torch.cat([x, x.new_full((x.shape[0], width - x.shape[1]), value)], dim=1)
