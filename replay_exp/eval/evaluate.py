"""Held-out evaluation: pass@1 (greedy or low temperature), pass@k, policy entropy.

``pass_at_k`` and the ``eval_details.jsonl`` codec (``encode_details`` / ``decode_details``)
live in :mod:`replay_exp.eval.estimators` (numpy only) and are re-exported here."""

from __future__ import annotations

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from replay_exp.algo import masked_mean
from replay_exp.eval.estimators import decode_details, encode_details, pass_at_k
from replay_exp.models.forward import policy_logprobs
from replay_exp.rollout import Generator, SamplingParams
from replay_exp.rollout.collect import score, tokenize_prompts
from replay_exp.tasks import Problem, Task
from replay_exp.types import RolloutBatch


@torch.no_grad()
def evaluate(
    generator: Generator,
    policy: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    problems: list[Problem],
    ecfg,
    max_new_tokens: int,
    seed: int,
    chat: bool = False,
    micro_batch_size: int | None = None,
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Metrics of the current policy on ``problems`` (keys without the ``eval/`` prefix), and
    the per-problem results behind them.

    - ``pass@1``: one sample per problem at ``pass1_temperature`` (0 = greedy), on every problem.
    - ``pass@k_sampled``: unbiased estimator from ``n_samples`` samples at
      ``sample_temperature``, on the first ``sampled_problems`` problems (None: all).
    - ``sample_reward`` (mean reward of those samples), ``response_len``, ``entropy`` (mean
      per-token entropy of the policy, temperature 1, on those samples).

    Per problem (numpy, in ``problems`` order): ``pass1`` (bool [n], the pass@1 sample correct)
    and ``n_correct`` (int [m], correct samples out of ``n_samples`` for the first m problems),
    with ``n_samples``: what paired comparisons between runs bootstrap over
    (``replay_exp.analysis.stats``).
    """
    out: dict[str, float] = {}
    ids, mask = tokenize_prompts(tokenizer, [p.prompt for p in problems], chat)
    p1 = SamplingParams(ecfg.pass1_temperature, ecfg.pass1_top_p, max_new_tokens)
    gen = generator.generate(ids, mask, p1, seed)
    reward = score(tokenizer, task, problems, gen)
    out["pass@1"] = float(reward.mean())
    pass1 = reward.numpy() > 0

    m = ecfg.get("sampled_problems") or len(problems)
    problems, ids, mask = problems[:m], ids[:m], mask[:m]
    n = ecfg.n_samples
    rep = [p for p in problems for _ in range(n)]
    ids_r, mask_r = ids.repeat_interleave(n, dim=0), mask.repeat_interleave(n, dim=0)
    pk = SamplingParams(ecfg.sample_temperature, ecfg.sample_top_p, max_new_tokens)
    gen = generator.generate(ids_r, mask_r, pk, seed + 1)
    correct = score(tokenizer, task, rep, gen).view(len(problems), n).sum(dim=1)
    for k in ecfg.pass_k:
        out[f"pass@{k}_sampled"] = sum(pass_at_k(n, int(c), k) for c in correct) / len(problems)
    out["sample_reward"] = float(correct.sum()) / (n * len(problems))
    out["response_len"] = float(gen.completion_mask_BxC.sum(dim=1).float().mean())

    zeros = torch.zeros(len(rep))
    batch = RolloutBatch(
        prompt_ids_BxP=ids_r,
        prompt_mask_BxP=mask_r,
        completion_ids_BxC=gen.completion_ids_BxC,
        completion_mask_BxC=gen.completion_mask_BxC,
        behaviour_logp_BxC=gen.behaviour_logp_BxC,
        reward_B=zeros,
        advantage_B=zeros,
        version_B=zeros.long(),
        created_step_B=zeros.long(),
        group_id_B=zeros.long(),
        uid_B=zeros.long(),
        group_reward_B=zeros,
        engine_gap_BxC=torch.zeros(gen.completion_mask_BxC.shape),
    )
    was_training = policy.training
    policy.eval()
    _, entropy_BxC = policy_logprobs(policy, batch, micro_batch_size=micro_batch_size)
    policy.train(was_training)
    out["entropy"] = float(masked_mean(entropy_BxC, gen.completion_mask_BxC.to(entropy_BxC.device)))
    details = {"pass1": pass1, "n_correct": correct.numpy().astype(np.int64), "n_samples": n}
    return out, details


__all__ = ["decode_details", "encode_details", "evaluate", "pass_at_k"]
