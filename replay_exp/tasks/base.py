"""The task interface: problems with a prompt, a reference answer and a verifiable reward.

Adding a task = one module implementing :class:`Task` + one schema dataclass + one YAML under
``conf/task/``, and one line in ``replay_exp.tasks.TASKS``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Problem:
    prompt: str  # text the model is conditioned on (the tokenizer adds BOS)
    answer: str  # reference answer text (supervised warm start target; EOS added by caller)


class Task(ABC):
    """A family of verifiable problems with a deterministic train / held-out split."""

    name: str
    max_prompt_chars: int  # longest prompt, in characters
    max_answer_chars: int  # longest reference answer, in characters

    @abstractmethod
    def sample_train(self, rng: np.random.Generator, n: int) -> list[Problem]:
        """``n`` training problems (never from the held-out split), drawn with ``rng``."""

    @abstractmethod
    def eval_problems(self) -> list[Problem]:
        """The held-out split, always the same list for the same task config."""

    def demonstration(self, problem: Problem, rng: np.random.Generator) -> str:
        """The answer text the supervised warm start imitates (by default the true answer)."""
        return problem.answer

    @abstractmethod
    def reward(self, problem: Problem, completion: str, finished: bool) -> float:
        """Verifiable reward of ``completion`` (text before EOS); ``finished`` = EOS emitted."""
