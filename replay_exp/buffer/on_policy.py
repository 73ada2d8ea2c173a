"""On-policy baseline (the paper's "no buffer"): a queue, newest first, each rollout used once.

Semantics:
- ``add`` appends the step's rollouts in generation order (ascending uid).
- ``sample(B, step)`` returns the newest B not-yet-used rollouts, in generation order, and
  removes them, so each rollout is trained on exactly once. With R == B rollouts added every
  step, it returns exactly the rollouts just added, same order, bit-identical after
  ``RolloutBatch.trimmed()``: training is the same as a loop with no buffer (age 0, lag 0).
- Fewer than B waiting (start of training, or R < B): it returns all of them, a batch smaller
  than B (the trainer normalises the loss by the tokens actually in the batch). Empty ->
  ``EmptyBufferError``.
- More than B waiting (R > B): the older leftovers stay queued and are evicted oldest first once
  more than ``capacity`` are waiting (counted in ``evicted_unused_total``).
- Consumes no random numbers.
"""

from __future__ import annotations

import torch

from replay_exp.buffer.base import EmptyBufferError, ReplayBuffer, RolloutStore
from replay_exp.types import RolloutBatch


class OnPolicyBuffer(ReplayBuffer):
    def __init__(self, capacity: int, max_prompt_len: int, max_completion_len: int, seed: int = 0):
        del seed  # uniform constructor for the registry; this policy draws no random numbers
        self.store = RolloutStore(capacity, max_prompt_len, max_completion_len)

    def add(self, rollouts: RolloutBatch, step: int) -> None:
        self.store.append(rollouts)

    def sample(self, batch_size: int, step: int) -> RolloutBatch:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        n = len(self.store)
        if n == 0:
            raise EmptyBufferError("sample() on an empty OnPolicyBuffer: add rollouts first")
        k = min(batch_size, n)
        batch = self.store.gather(torch.arange(n - k, n), step)
        self.store.drop_newest(k)
        return batch

    def __len__(self) -> int:
        return len(self.store)

    def stats(self) -> dict[str, float]:
        return self.store.stats()

    def state_dict(self) -> dict:
        return {"store": self.store.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.store.load_state_dict(state["store"])
