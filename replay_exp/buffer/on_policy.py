"""On-policy baseline (the paper's "no buffer"): a queue, newest first, each rollout used once.

Semantics:
- ``add`` appends the step's rollouts in generation order (ascending uid).
- ``sample(B, step)`` returns the newest B not-yet-used rollouts, in generation order, and
  removes them (consumed: counted in ``retired_total``, not as evictions), so each rollout is
  trained on exactly once. It draws no random numbers and ignores ``buffer.sampling`` (which
  must stay ``uniform``; ``buffer.max_reuse`` must stay null). With R == B rollouts added every
  step, it returns exactly the rollouts just added, same order, bit-identical after
  ``RolloutBatch.trimmed()``: training is the same as a loop with no buffer (age 0, lag 0).
- Fewer than B waiting (start of training, or R < B): it returns all of them, a batch smaller
  than B (the trainer normalises the loss by the tokens actually in the batch). Empty ->
  ``EmptyBufferError``.
- More than B waiting (R > B): the older leftovers stay queued and are evicted oldest first once
  more than ``capacity`` are waiting (counted in ``evicted_unused_total``).
"""

from __future__ import annotations

import numpy as np

from replay_exp.buffer.fifo import FIFO


class OnPolicy(FIFO):
    consumes = True

    def select(self, k: int, step: int) -> np.ndarray:
        return self.queue.pop_back(k)
