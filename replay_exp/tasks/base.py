"""The task interface: problems with a prompt, a reference answer and a verifiable reward.

Adding a task = one module implementing :class:`Task` + one schema dataclass + one YAML under
``conf/task/``, and one line in ``replay_exp.tasks.TASKS``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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
    needs_pretrained: bool = False  # True: only a pretrained model's tokenizer can read it
    # Config keys that change neither the training problems nor the demonstrations: left out
    # of a warm start's recipe (replay_exp.models.warm_start.recipe).
    warm_start_ignores: tuple[str, ...] = ()

    @property
    def max_prompt_tokens(self) -> int:
        """Longest prompt in tokens (the buffer's prompt width). Default: one token per
        character plus BOS, exact for the char tokenizer of the embedded default."""
        return self.max_prompt_chars + 1

    @property
    def max_new_tokens(self) -> int:
        """Default response budget (``generation.max_new_tokens=null``): the longest answer
        plus EOS, in char tokens."""
        return self.max_answer_chars + 1

    @classmethod
    def from_config(cls, task_cfg: Any) -> Task:
        """Build from the task's config node (every key but ``name`` is a constructor arg)."""
        kwargs = {k: v for k, v in dict(task_cfg).items() if k != "name"}
        return cls(**kwargs)

    def fit_prompts(self, prompt_lengths: Callable[[list[str]], list[int]], max_len: int) -> int:
        """Drop problems whose prompt is longer than ``max_len`` tokens (as measured by
        ``prompt_lengths``, which applies the model's tokenizer and chat template); return how
        many were dropped. Tasks whose prompts always fit (checked in ``resolve``) keep all."""
        return 0

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


class BudgetedTask(Task):
    """A task whose prompt and response budgets are knobs in tokens (``task.max_prompt_tokens``,
    ``task.max_response_tokens``: a subword tokenizer's units, not characters), with its sizes
    read off its problem lists."""

    _max_prompt_tokens: int
    _max_new_tokens: int

    @property
    def max_prompt_tokens(self) -> int:
        return self._max_prompt_tokens

    @property
    def max_new_tokens(self) -> int:
        return self._max_new_tokens

    def _set_sizes(self, problems: list[Problem]) -> None:
        self.max_prompt_chars = max(len(p.prompt) for p in problems)
        self.max_answer_chars = max(len(p.answer) for p in problems)
