"""Small typed containers passed between generation, buffer and trainer.

Shape suffixes: B = rollouts, P = prompt tokens, C = completion tokens.
Prompts are LEFT-padded, completions RIGHT-padded, so ``cat([prompt, completion], dim=1)`` is a
contiguous sequence per row and the first completion token always sits at column P.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class RolloutBatch:
    """B rollouts, everything the trainer and the buffer need, frozen at generation time."""

    prompt_ids_BxP: torch.Tensor  # int64, left-padded with the tokenizer's pad id
    prompt_mask_BxP: torch.Tensor  # bool, True on real prompt tokens
    completion_ids_BxC: torch.Tensor  # int64, right-padded; includes the EOS token if emitted
    completion_mask_BxC: torch.Tensor  # bool, True on generated tokens (up to and incl. EOS)
    behaviour_logp_BxC: torch.Tensor  # float32, log pi_behaviour(token) at generation; 0 on pad
    reward_B: torch.Tensor  # float32, verifiable reward (binary correctness by default)
    advantage_B: torch.Tensor  # float32, group-normalised advantage, frozen at generation time
    version_B: torch.Tensor  # int64, policy version (optimizer steps) of the generating weights
    created_step_B: torch.Tensor  # int64, training step at which the rollout was generated
    group_id_B: torch.Tensor  # int64, id of the prompt group (G rollouts share one)
    uid_B: torch.Tensor  # int64, unique rollout id over the whole run
    # float32, mean reward of the rollout's prompt group at generation (its pass rate for a
    # binary reward): how hard the problem was for the generating policy
    group_reward_B: torch.Tensor
    # float32, log pi_trainer(token) at the generating weights - log mu_engine(token): the
    # engine mismatch part of the ratio; 0 on pad, and 0 where it is not measured (the hf
    # engine is the trainer's model; generation.trainer_logp=false)
    engine_gap_BxC: torch.Tensor

    def __len__(self) -> int:
        return self.reward_B.shape[0]

    def index(self, idx: torch.Tensor | slice) -> RolloutBatch:
        """Rows ``idx`` of every field (a view for slices, a copy for index tensors)."""
        return RolloutBatch(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})

    @staticmethod
    def cat(batches: list[RolloutBatch]) -> RolloutBatch:
        """Concatenate along B, re-padding prompts (left) and completions (right) as needed."""
        if len(batches) == 1:
            return batches[0]
        P = max(b.prompt_ids_BxP.shape[1] for b in batches)
        C = max(b.completion_ids_BxC.shape[1] for b in batches)
        padded = [b.pad_to(P, C) for b in batches]
        return RolloutBatch(
            **{
                f.name: torch.cat([getattr(b, f.name) for b in padded])
                for f in fields(RolloutBatch)
            }
        )

    def pad_to(self, P: int, C: int, pad_id: int | None = None) -> RolloutBatch:
        """Widen to P prompt and C completion columns (prompts on the left, completions right).

        Padded id values are never read (masks are False there); they are ``pad_id`` (0 if
        not given).
        """
        p, c = self.prompt_ids_BxP.shape[1], self.completion_ids_BxC.shape[1]
        if p > P or c > C:
            raise ValueError(f"cannot shrink rollouts of width ({p}, {c}) to ({P}, {C})")
        if p == P and c == C:
            return self
        fill = 0 if pad_id is None else pad_id
        B = len(self)

        def left(x: torch.Tensor, width: int, value) -> torch.Tensor:
            pad = x.new_full((B, width - x.shape[1]), value)
            return torch.cat([pad, x], dim=1)

        def right(x: torch.Tensor, width: int, value) -> torch.Tensor:
            pad = x.new_full((B, width - x.shape[1]), value)
            return torch.cat([x, pad], dim=1)

        return RolloutBatch(
            prompt_ids_BxP=left(self.prompt_ids_BxP, P, fill),
            prompt_mask_BxP=left(self.prompt_mask_BxP, P, False),
            completion_ids_BxC=right(self.completion_ids_BxC, C, fill),
            completion_mask_BxC=right(self.completion_mask_BxC, C, False),
            behaviour_logp_BxC=right(self.behaviour_logp_BxC, C, 0.0),
            reward_B=self.reward_B,
            advantage_B=self.advantage_B,
            version_B=self.version_B,
            created_step_B=self.created_step_B,
            group_id_B=self.group_id_B,
            uid_B=self.uid_B,
            group_reward_B=self.group_reward_B,
            engine_gap_BxC=right(self.engine_gap_BxC, C, 0.0),
        )

    def trimmed(self) -> RolloutBatch:
        """Drop prompt columns that are padding in every row (left) and completion columns
        that are padding in every row (right), so no compute is spent on them."""
        p_keep = self.prompt_mask_BxP.any(dim=0).nonzero()
        c_keep = self.completion_mask_BxC.any(dim=0).nonzero()
        p0 = int(p_keep[0]) if len(p_keep) else self.prompt_mask_BxP.shape[1]
        c1 = int(c_keep[-1]) + 1 if len(c_keep) else 0
        out = RolloutBatch(**{f.name: getattr(self, f.name) for f in fields(self)})
        out.prompt_ids_BxP = self.prompt_ids_BxP[:, p0:]
        out.prompt_mask_BxP = self.prompt_mask_BxP[:, p0:]
        out.completion_ids_BxC = self.completion_ids_BxC[:, :c1]
        out.completion_mask_BxC = self.completion_mask_BxC[:, :c1]
        out.behaviour_logp_BxC = self.behaviour_logp_BxC[:, :c1]
        out.engine_gap_BxC = self.engine_gap_BxC[:, :c1]
        return out
