"""``generation.sampler=cached_loop``: a plain KV-cached sampling loop for causal LMs.

It samples what ``transformers`` ``generate`` samples (temperature, then nucleus truncation;
greedy at temperature 0; stop at EOS, pad after it) with less machinery per token, and runs
each distinct prompt once (``replay_exp.models.shared_prefix``): the G samples of a group
share their prompt's prefill. The behaviour log-prob of a sampled token is read from the same
logits, under the temperature-scaled distribution before truncation, as the trainer recomputes
it. Randomness comes from one seeded ``torch.Generator``, so a seed fixes the samples.
"""

from __future__ import annotations

import torch

from replay_exp.models.shared_prefix import prefill
from replay_exp.rollout.base import SamplingParams


def next_token(
    logits_BxV: torch.Tensor, params: SamplingParams, rng: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sampled token [B], its log-prob [B]) from next-token logits."""
    if params.temperature == 0:  # greedy; log-prob at temperature 1, as generate reports it
        logp_BxV = torch.log_softmax(logits_BxV, dim=-1)
        tok_B = logp_BxV.argmax(dim=-1)
        return tok_B, logp_BxV.gather(1, tok_B[:, None]).squeeze(1)
    logp_BxV = torch.log_softmax(logits_BxV / params.temperature, dim=-1)
    probs_BxV = logp_BxV.exp()
    if params.top_p < 1.0:
        # Keep the most likely tokens until their mass reaches top_p (at least one token).
        sorted_p, order = probs_BxV.sort(dim=-1, descending=True)
        drop = sorted_p.cumsum(dim=-1) - sorted_p >= params.top_p
        probs_BxV = probs_BxV.scatter(1, order, sorted_p.masked_fill(drop, 0.0))
    tok_B = torch.multinomial(probs_BxV, 1, generator=rng).squeeze(1)
    return tok_B, logp_BxV.gather(1, tok_B[:, None]).squeeze(1)


def sample_loop(
    logits_BxV: torch.Tensor,
    advance,
    params: SamplingParams,
    rng: torch.Generator | None,
    eos_id: int,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The token loop of every KV-cached sampler: draw from ``logits_BxV``, then
    ``advance(tok_B, t)`` feeds the drawn tokens (step t) and returns the next logits, until
    every row is past EOS or ``max_new_tokens`` are drawn. Completions (pad after EOS) and
    their behaviour log-probs."""
    done_B = torch.zeros(logits_BxV.shape[0], dtype=torch.bool, device=logits_BxV.device)
    toks, logps = [], []
    for t in range(params.max_new_tokens):
        tok_B, logp_B = next_token(logits_BxV.float(), params, rng)
        toks.append(tok_B.masked_fill(done_B, pad_id))
        logps.append(logp_B.masked_fill(done_B, 0.0))
        done_B = done_B | (tok_B == eos_id)
        if t == params.max_new_tokens - 1 or bool(done_B.all()):
            break
        logits_BxV = advance(toks[-1], t)
    return torch.stack(toks, dim=1), torch.stack(logps, dim=1)


@torch.no_grad()
def sample_cached(
    model: torch.nn.Module,
    prompt_ids_BxP: torch.Tensor,
    prompt_mask_BxP: torch.Tensor,
    params: SamplingParams,
    rng: torch.Generator | None,
    eos_id: int,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Completions [B, <= max_new_tokens] (pad after EOS) and their behaviour log-probs."""
    logits_BxV, cache, pos_B = prefill(model, prompt_ids_BxP, prompt_mask_BxP)
    attn_BxT = prompt_mask_BxP.long()

    def advance(tok_B: torch.Tensor, t: int) -> torch.Tensor:
        nonlocal attn_BxT, cache  # the mask and the cache grow by one column a token
        attn_BxT = torch.cat([attn_BxT, torch.ones_like(attn_BxT[:, :1])], dim=1)
        out = model(
            input_ids=tok_B[:, None],
            attention_mask=attn_BxT,
            position_ids=(pos_B + t)[:, None],
            past_key_values=cache,
            use_cache=True,
        )
        cache = out.past_key_values
        return out.logits[:, -1]

    return sample_loop(logits_BxV, advance, params, rng, eos_id, pad_id)
