r"""``task=gsm8k | math | openr1_math``: real math datasets with a math-verify reward.

Data come from :mod:`replay_exp.tasks.math_data` (the hub, or a local file in the dataset's own
format), the reward from :func:`replay_exp.tasks.math_reward.math_reward` (1 iff the last
``\boxed{}`` / ``####`` / last number of the completion is equivalent to the reference; the
completion is scored whether or not it ended with EOS).

Held-out problems, in this order of precedence:

1. ``task.eval_path``: a local file (format ``task.eval_dataset``, default: the task's own);
2. ``task.eval_split`` on the hub (``task.eval_hub_id`` / ``task.eval_config``), only when the
   training data come from the hub too (``task.path=null``), e.g. GSM8K's ``test`` split or
   MATH-500;
3. otherwise ``task.n_eval`` distinct prompts held out of the training data by a seeded hash
   (``task.split_seed``; independent of the row order).

Training problems whose prompt also appears in the held-out set are dropped. Prompts are the
question rendered with ``task.template`` (``math_data.PROMPT_TEMPLATES`` or a string with
``{question}``); the model's chat template, if enabled (``model.chat_template``), is applied at
tokenisation. Prompts longer than ``task.max_prompt_tokens`` tokens after that are dropped
once the tokenizer is known (:meth:`MathTask.fit_prompts`, a warning gives the count).

Loading happens when the task is built, so a missing file, a file in the wrong format or an
unreachable hub fails in ``resolve()``, before any model is loaded or any file is written.
Loads are cached per process: ``resolve()`` and the training run share one.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from replay_exp.config.errors import ConfigError
from replay_exp.tasks.base import BudgetedTask, Problem

# The dataset formats of math_data (imported lazily: datasets + math-verify take ~1.3 s).
MATH_TASKS = ("gsm8k", "math", "openr1_math")


@functools.lru_cache(maxsize=8)
def _load(
    dataset: str,
    path: str | None,
    hub_id: str | None,
    config: str | None,
    split: str,
    limit: int | None,
    cache_dir: str | None,
) -> tuple[Problem, ...]:
    from replay_exp.tasks.math_data import load_math_problems

    return tuple(load_math_problems(dataset, path, hub_id, split, config, limit, cache_dir))


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


class MathTask(BudgetedTask):
    """A math dataset as a task: fixed train / held-out lists, math-verify reward."""

    needs_pretrained = True

    def __init__(
        self,
        name: str,
        path: str | None = None,
        hub_id: str | None = None,
        config: str | None = None,
        split: str = "train",
        limit: int | None = None,
        eval_dataset: str | None = None,
        eval_path: str | None = None,
        eval_hub_id: str | None = None,
        eval_config: str | None = None,
        eval_split: str | None = None,
        n_eval: int = 500,
        split_seed: int = 0,
        template: str = "default",
        max_prompt_tokens: int = 512,
        max_response_tokens: int = 1024,
        cache_dir: str | None = None,
    ):
        from replay_exp.tasks.math_data import DEFAULT_HUB, render_prompt, split_problems

        if name not in MATH_TASKS:
            raise ConfigError(f"task.name={name} is not a math task; choose one of {MATH_TASKS}")
        eval_dataset = eval_dataset or name
        if eval_dataset not in MATH_TASKS:
            raise ConfigError(f"task.eval_dataset={eval_dataset} is unknown; choose {MATH_TASKS}")
        for key, value in [
            ("max_prompt_tokens", max_prompt_tokens),
            ("max_response_tokens", max_response_tokens),
        ]:
            if value is None or value < 1:
                raise ConfigError(f"task.{key}={value} must be >= 1")
        if limit is not None and limit < 1:
            raise ConfigError(f"task.limit={limit} must be >= 1 (or null for every row)")
        try:
            render_prompt("", template)
        except ValueError as e:
            raise ConfigError(f"task.template: {_one_line(e)}") from None
        for key, p in [("path", path), ("eval_path", eval_path)]:
            if p is not None and not Path(p).expanduser().exists():
                raise ConfigError(f"task.{key}={p} does not exist (a .jsonl/.json/.parquet file)")
        cache = str(Path(cache_dir).expanduser()) if cache_dir else None
        self.name = name
        self.template = template
        self._max_prompt_tokens = int(max_prompt_tokens)
        self._max_new_tokens = int(max_response_tokens)

        def load(key: str, dataset: str, **kw: Any) -> list[Problem]:
            where = kw.get("path") or kw.get("hub_id") or DEFAULT_HUB[dataset]
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("default")  # the skipped-rows count stays visible
                    rows = _load(dataset, kw.get("path"), kw.get("hub_id"), kw.get("config"),
                                 kw.get("split", "train"), kw.get("limit"), cache)  # fmt: skip
            except (OSError, ValueError, RuntimeError) as e:  # RuntimeError: the hub failed
                raise ConfigError(f"task.{key}={where}: {_one_line(e)}") from None
            return [Problem(render_prompt(p.prompt, template), p.answer) for p in rows]

        src = dict(path=path and str(Path(path).expanduser()), hub_id=hub_id, config=config)
        problems = load("path" if path else "hub_id", name, split=split, limit=limit, **src)
        if eval_path is not None:
            held = load("eval_path", eval_dataset, path=str(Path(eval_path).expanduser()))
            self.eval_source = str(eval_path)
        elif eval_split is not None and path is None:
            same = eval_dataset == name
            eval_hub = eval_hub_id or (hub_id if same else None)
            eval_cfg = eval_config if eval_config is not None else (config if same else None)
            held = load("eval_hub_id", eval_dataset, hub_id=eval_hub, config=eval_cfg,
                        split=eval_split)  # fmt: skip
            self.eval_source = f"{eval_hub or DEFAULT_HUB[eval_dataset]} ({eval_split})"
        else:
            try:
                problems, held = split_problems(problems, n_eval, split_seed)
            except ValueError as e:
                raise ConfigError(f"task.n_eval={n_eval}: {_one_line(e)}") from None
            self.eval_source = f"{n_eval} held out of the training data (seed {split_seed})"
        held_prompts = {p.prompt for p in held}
        self._train = [p for p in problems if p.prompt not in held_prompts]
        self._eval = list(held)
        if not self._train or not self._eval:
            raise ConfigError(
                f"task={name}: {len(self._train)} training and {len(self._eval)} held-out "
                "problems left; both must be non-empty"
            )
        self._set_sizes(self._train + self._eval)

    @classmethod
    def from_config(cls, task_cfg: Any) -> MathTask:
        return cls(**dict(task_cfg))

    @property
    def n_train(self) -> int:
        return len(self._train)

    def sample_train(self, rng: np.random.Generator, n: int) -> list[Problem]:
        """``n`` distinct training problems (with repeats only if the set has fewer)."""
        idx = rng.choice(len(self._train), size=n, replace=n > len(self._train))
        return [self._train[i] for i in idx]

    def eval_problems(self) -> list[Problem]:
        return list(self._eval)

    def reward(self, problem: Problem, completion: str, finished: bool) -> float:
        from replay_exp.tasks.math_reward import math_reward

        return math_reward(completion, problem.answer)

    def fit_prompts(self, prompt_lengths: Callable[[list[str]], list[int]], max_len: int) -> int:
        def keep(problems: list[Problem]) -> list[Problem]:
            lengths: list[int] = []
            for i in range(0, len(problems), 1024):
                lengths += prompt_lengths([p.prompt for p in problems[i : i + 1024]])
            return [p for p, n in zip(problems, lengths, strict=True) if n <= max_len]

        train, held = keep(self._train), keep(self._eval)
        dropped = len(self._train) - len(train) + len(self._eval) - len(held)
        if not train or not held:
            raise ValueError(
                f"task={self.name}: no {'training' if not train else 'held-out'} prompt fits "
                f"task.max_prompt_tokens={max_len} tokens; raise it"
            )
        if dropped:
            from replay_exp.tasks.math_data import MathDataWarning

            warnings.warn(
                f"task={self.name}: dropped {len(self._train) - len(train)} training and "
                f"{len(self._eval) - len(held)} held-out problems longer than "
                f"task.max_prompt_tokens={max_len} tokens",
                MathDataWarning,
                stacklevel=2,
            )
        self._train, self._eval = train, held
        self._set_sizes(self._train + self._eval)
        return dropped
