"""``task=reasoning_gym``: any procedural dataset of the reasoning-gym library as a task.

reasoning-gym (pinned, Apache-2.0) generates verifiable problems from a seed
(``chain_sum``, ``basic_arithmetic``, ``countdown``, ``gsm_symbolic``, ~100 more); each dataset
scores an answer with its own ``score_answer(answer, entry)`` (1.0 right, 0.0 wrong, partial
credit where the dataset defines it). ``task.dataset`` names the dataset, ``task.params`` its
config keys (``min_terms``, ``max_digits``, ...: the dataset's own config dataclass).

- **Split.** The held-out problems are items ``0 .. n_eval - 1`` of the dataset created with
  seed ``split_seed``; training problems are items of the dataset created with seed
  ``split_seed + n_eval`` (size ``n_train``), drawn uniformly with the run's RNG and generated
  on first use. Most datasets seed item ``i`` with ``Random(seed + i)``, so the two seed
  ranges never share a generator; a training item whose question is also held out (small
  problem spaces repeat questions) is redrawn, so the two never overlap.
- **Prompt.** ``task.template`` with ``{question}`` replaced by the dataset's question (the
  model's chat template, if on, wraps it at tokenisation).
- **Reward.** The completion's answer (``task.extract``) scored by ``task.reward``:

  - ``extract=completion``: the completion stripped, and only when it ended with EOS (a small
    model that answers and stops, like the embedded arithmetic task);
  - ``extract=answer_tag``: the last ``<answer>...</answer>`` (reasoning-gym's own format);
  - ``extract=final``: the last ``\\boxed{}``, else a ``####`` line, else the last number
    (``replay_exp.tasks.math_reward.extract_answer``; unfinished completions are scored too);

  ``reward=score_answer``: the dataset's ``score_answer``; ``reward=math_verify``: 1 iff
  math-verify finds the answer equivalent to the dataset's reference answer (numbers and
  expressions; not for datasets whose answers are not mathematical).
- **Binary by default.** Many scorers give partial credit: chain_sum's and the base class's
  give ``len(reference) / len(answer)`` to an answer that merely contains the reference
  (``-12`` for ``12``: 2/3, a wrong sign paid for), countdown 0.01 to a wrong expression. With
  ``partial_credit=false`` (the default) the reward is 1 iff the scorer gives full marks, else
  0, so pass@1 counts correct answers; ``partial_credit=true`` passes the score through.

A bad dataset name, an unknown or invalid param fails when the task is built (in ``resolve()``)
with one line naming the key and value.
"""

from __future__ import annotations

import difflib
import functools
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from replay_exp.config.errors import ConfigError
from replay_exp.tasks.base import BudgetedTask, Problem

EXTRACTS = ("completion", "answer_tag", "final")
REWARDS = ("score_answer", "math_verify")


class GymDataWarning(UserWarning):
    """Problems dropped as longer than the prompt budget."""


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _freeze(params: dict) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()))


@functools.lru_cache(maxsize=16)
def _dataset(name: str, params: tuple, seed: int, size: int):
    """The reasoning-gym dataset ``name`` (one per process per arguments: resolve() and the
    run share it). Raises ConfigError in one line on a bad name or params."""
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        close = difflib.get_close_matches(name, DATASETS, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(
            f"task.dataset={name} is not a reasoning-gym dataset{hint}; "
            f"{len(DATASETS)} are registered (reasoning_gym.factory.DATASETS)"
        )
    kwargs = {k: list(v) if isinstance(v, tuple) else v for k, v in params}
    try:
        return reasoning_gym.create_dataset(name, seed=seed, size=size, **kwargs)
    except TypeError as e:  # an unknown key of the dataset's config dataclass
        fields = sorted(DATASETS[name][1].__dataclass_fields__)
        known = [f for f in fields if f not in ("seed", "size")]
        raise ConfigError(
            f"task.params={dict(kwargs)} of task.dataset={name}: {_one_line(e)}; its keys: {known}"
        ) from None
    except (AssertionError, ValueError) as e:  # the dataset's own validate()
        raise ConfigError(
            f"task.params={dict(kwargs)} of task.dataset={name} is invalid: {_one_line(e)}"
        ) from None


class ReasoningGymTask(BudgetedTask):
    """A reasoning-gym dataset: held-out items of one seed, training items of another."""

    name = "reasoning_gym"
    needs_pretrained = True  # its questions use characters the embedded char vocab lacks
    # What scores and budgets a completion, not what the warm start trains on (n_eval stays in
    # its recipe: held-out questions are redrawn from the training stream).
    warm_start_ignores = ("extract", "reward", "partial_credit", "max_prompt_tokens",
                          "max_response_tokens")  # fmt: skip

    def __init__(
        self,
        dataset: str,
        params: dict | None = None,
        n_eval: int = 2048,
        n_train: int = 100_000,
        split_seed: int = 0,
        template: str = "{question}",
        extract: str = "completion",
        reward: str = "score_answer",
        partial_credit: bool = False,
        max_prompt_tokens: int = 128,
        max_response_tokens: int = 16,
        name: str = "reasoning_gym",
    ):
        for key, value, allowed in [("extract", extract, EXTRACTS), ("reward", reward, REWARDS)]:
            if value not in allowed:
                raise ConfigError(f"task.{key}={value} is unknown; choose one of {list(allowed)}")
        for key, value in [
            ("n_eval", n_eval),
            ("n_train", n_train),
            ("max_prompt_tokens", max_prompt_tokens),
            ("max_response_tokens", max_response_tokens),
        ]:
            if value is None or value < 1:
                raise ConfigError(f"task.{key}={value} must be >= 1")
        if "{question}" not in template:
            raise ConfigError(f"task.template={template!r} must contain {{question}}")
        self.dataset, self.params = dataset, dict(params or {})
        self.template, self.extract, self.reward_kind = template, extract, reward
        self.partial_credit = bool(partial_credit)
        self._max_prompt_tokens = int(max_prompt_tokens)
        self._max_new_tokens = int(max_response_tokens)
        frozen = _freeze(self.params)
        self._held_ds = _dataset(dataset, frozen, split_seed, n_eval)
        self._train_ds = _dataset(dataset, frozen, split_seed + n_eval, n_train)
        self.n_train = n_train
        self._entries: dict[str, dict] = {}  # rendered prompt -> the dataset's entry
        self._eval = [self._problem(self._held_ds[i]) for i in range(n_eval)]
        self._held_prompts = {p.prompt for p in self._eval}
        self._fits: Callable[[str], bool] = lambda prompt: True
        self.dropped_train = 0  # training draws redrawn as longer than the prompt budget
        self._set_sizes(self._eval)

    @classmethod
    def from_config(cls, task_cfg: Any) -> ReasoningGymTask:
        kwargs = dict(task_cfg)
        kwargs["params"] = dict(kwargs.get("params") or {})
        return cls(**kwargs)

    def _problem(self, entry: dict) -> Problem:
        prompt = self.template.replace("{question}", entry["question"])
        self._entries.setdefault(prompt, entry)
        return Problem(prompt=prompt, answer=str(entry["answer"]))

    def sample_train(self, rng: np.random.Generator, n: int) -> list[Problem]:
        """``n`` training problems, each item index uniform in ``[0, n_train)``; a held-out
        question, or one longer than the prompt budget, is redrawn (with the same ``rng``)."""
        out: list[Problem] = []
        tries = 0
        while len(out) < n:
            tries += 1
            if tries > 100 * n + 1000:
                raise RuntimeError(
                    f"task.dataset={self.dataset}: no usable training problem in {tries} draws "
                    "(all held out or longer than task.max_prompt_tokens)"
                )
            p = self._problem(self._train_ds[int(rng.integers(self.n_train))])
            if p.prompt in self._held_prompts:
                continue
            if not self._fits(p.prompt):
                self.dropped_train += 1
                continue
            out.append(p)
        return out

    def eval_problems(self) -> list[Problem]:
        return list(self._eval)

    def fit_prompts(self, prompt_lengths: Callable[[list[str]], list[int]], max_len: int) -> int:
        """Drop held-out problems longer than ``max_len`` tokens now (warned, counted) and
        redraw such training problems from then on."""
        lengths = prompt_lengths([p.prompt for p in self._eval])
        held = [p for p, n in zip(self._eval, lengths, strict=True) if n <= max_len]
        if not held:
            raise ValueError(
                f"task.dataset={self.dataset}: no held-out prompt fits "
                f"task.max_prompt_tokens={max_len} tokens (longest: {max(lengths)}); raise it"
            )
        dropped = len(self._eval) - len(held)
        if dropped:
            warnings.warn(
                f"task.dataset={self.dataset}: dropped {dropped} of {len(self._eval)} held-out "
                f"problems longer than task.max_prompt_tokens={max_len} tokens (longest "
                f"{max(lengths)}); training problems that long are redrawn",
                GymDataWarning,
                stacklevel=2,
            )
        self._fits = lambda prompt: prompt_lengths([prompt])[0] <= max_len
        self._eval = held
        self._held_prompts = {p.prompt for p in held}
        self._set_sizes(held)
        return dropped

    def answer_of(self, completion: str, finished: bool) -> str | None:
        """The answer ``task.extract`` reads off a completion (None: no answer)."""
        if self.extract == "completion":
            return completion.strip() if finished else None
        if self.extract == "answer_tag":
            from reasoning_gym.utils import extract_answer

            return extract_answer(completion)
        from replay_exp.tasks.math_reward import extract_answer

        return extract_answer(completion)

    def reward(self, problem: Problem, completion: str, finished: bool) -> float:
        answer = self.answer_of(completion, finished)
        if not answer:
            return 0.0
        if self.reward_kind == "math_verify":
            from replay_exp.tasks.math_reward import math_reward

            return math_reward(answer, problem.answer)
        entry = self._entries.get(problem.prompt)
        if entry is None:
            raise KeyError(f"task.dataset={self.dataset}: a problem this task did not generate")
        try:
            score = float(self._held_ds.score_answer(answer, entry))
        except Exception:  # a dataset's scorer failing on odd text scores it 0
            return 0.0
        if self.partial_credit:
            return score
        return 1.0 if score >= 1.0 - 1e-9 else 0.0
