"""Embedded verifiable task: multi-digit integer arithmetic, e.g. ``123+456=`` -> ``579``.

- Difficulty knob: ``n_digits``; operands are uniform in [0, 10**n_digits).
- Operations: any subset of ``+``, ``-``, ``*`` (uniform over the chosen ones).
- Split: a problem belongs to the held-out split iff a seeded 64-bit hash of
  (split_seed, a, op, b) falls below ``eval_fraction`` of the hash range. Training draws
  reject held-out problems, so the two never overlap, whatever the RL seed. The held-out list
  is the first ``n_eval`` distinct held-out problems drawn by a generator seeded with
  ``split_seed``: the same list on every machine and run.
- Warm-start demonstrations: with probability ``demo_carry_drop`` a demonstration of an
  addition shows the answer computed without carries (each digit is (a_i + b_i) mod 10), a
  systematic misconception. The warm-started policy then knows both procedures and prefers the
  wrong one on problems with carries, which verifiable-reward RL can fix in minutes on a CPU.
  Only the warm start sees demonstrations; rewards always use the true result.
- Reward (binary correctness), exact parsing rules: the completion is the generated text
  before the first EOS. It scores 1.0 iff (1) EOS was emitted within the generation budget,
  (2) the text, with surrounding whitespace stripped, matches ``-?[0-9]+`` and (3) its integer
  value equals the true result (so leading zeros are accepted). Anything else scores 0.0.
"""

from __future__ import annotations

import re

import numpy as np

from replay_exp.config.errors import ConfigError
from replay_exp.tasks.base import Problem, Task

_OPS = {"+": np.add, "-": np.subtract, "*": np.multiply}
_ANSWER = re.compile(r"-?[0-9]+")


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a fast, platform-independent 64-bit hash of uint64 arrays."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _parse(prompt: str) -> tuple[int, str, int]:
    """'12+345=' -> (12, '+', 345)."""
    m = re.fullmatch(r"(\d+)([-+*])(\d+)=", prompt)
    if m is None:
        raise ValueError(f"not an arithmetic prompt: {prompt!r}")
    return int(m.group(1)), m.group(2), int(m.group(3))


def _add_without_carry(a: int, b: int) -> int:
    """Digit-wise sum mod 10: 478 + 256 -> 624 (the true sum is 734)."""
    out, place = 0, 1
    while a or b:
        out += (a % 10 + b % 10) % 10 * place
        a, b, place = a // 10, b // 10, place * 10
    return out


class ArithmeticTask(Task):
    name = "arithmetic"
    # The held-out list's length: the split itself is set by the eval fraction and split seed.
    warm_start_ignores = ("n_eval",)

    def __init__(
        self,
        n_digits: int = 3,
        operations: tuple[str, ...] = ("+",),
        n_eval: int = 256,
        eval_fraction: float = 0.01,
        split_seed: int = 0,
        demo_carry_drop: float = 0.0,
    ):
        ops = list(operations)
        if n_digits < 1 or n_digits > 9:
            raise ConfigError(f"task.n_digits={n_digits} must be in [1, 9]")
        bad = [o for o in ops if o not in _OPS]
        if not ops or bad:
            raise ConfigError(f"task.operations={ops} must be a non-empty subset of {list(_OPS)}")
        if not 0 < eval_fraction < 1:
            raise ConfigError(f"task.eval_fraction={eval_fraction} must be in (0, 1)")
        space = len(ops) * 10 ** (2 * n_digits)
        if n_eval < 1 or n_eval > 0.5 * eval_fraction * space:
            raise ConfigError(
                f"task.n_eval={n_eval} must be in [1, {int(0.5 * eval_fraction * space)}] "
                f"(half the held-out share of {space} problems at task.n_digits={n_digits}, "
                f"task.eval_fraction={eval_fraction})"
            )
        if not 0 <= demo_carry_drop <= 1:
            raise ConfigError(f"task.demo_carry_drop={demo_carry_drop} must be in [0, 1]")
        self.demo_carry_drop = demo_carry_drop
        self.n_digits, self.ops, self.n_eval = n_digits, ops, n_eval
        self.split_seed, self.eval_fraction = split_seed, eval_fraction
        self._threshold = np.uint64(int(eval_fraction * 2**64))
        self.max_prompt_chars = 2 * n_digits + 2  # "a" op "b" "="
        self.max_answer_chars = 2 * n_digits if "*" in ops else n_digits + 1
        self._eval = self._draw(np.random.default_rng(split_seed), n_eval, held_out=True)

    @classmethod
    def from_config(cls, task_cfg) -> ArithmeticTask:
        kwargs = {k: v for k, v in dict(task_cfg).items() if k != "name"}
        if "operations" in kwargs:
            kwargs["operations"] = tuple(kwargs["operations"])
        return cls(**kwargs)

    def _is_held_out(self, a: np.ndarray, op: np.ndarray, b: np.ndarray) -> np.ndarray:
        base = np.uint64(10**self.n_digits)
        key = (op.astype(np.uint64) * base + a.astype(np.uint64)) * base + b.astype(np.uint64)
        h = _mix64(key ^ _mix64(np.full_like(key, self.split_seed, dtype=np.uint64)))
        return h < self._threshold

    def _draw(self, rng: np.random.Generator, n: int, held_out: bool) -> list[Problem]:
        out: list[Problem] = []
        seen: set[str] = set()
        hi = 10**self.n_digits
        while len(out) < n:
            m = max(2 * n, 64) if not held_out else int(4 * n / self.eval_fraction) + 64
            a = rng.integers(0, hi, m)
            b = rng.integers(0, hi, m)
            op = rng.integers(0, len(self.ops), m)
            keep = self._is_held_out(a, op, b) == held_out
            for ai, oi, bi in zip(a[keep], op[keep], b[keep], strict=True):
                p = self._problem(int(ai), self.ops[oi], int(bi))
                if held_out and p.prompt in seen:
                    continue  # the held-out list has no duplicates; training draws may repeat
                seen.add(p.prompt)
                out.append(p)
                if len(out) == n:
                    break
        return out

    @staticmethod
    def _problem(a: int, op: str, b: int) -> Problem:
        return Problem(prompt=f"{a}{op}{b}=", answer=str(int(_OPS[op](a, b))))

    def sample_train(self, rng: np.random.Generator, n: int) -> list[Problem]:
        return self._draw(rng, n, held_out=False)

    def eval_problems(self) -> list[Problem]:
        return list(self._eval)

    def demonstration(self, problem: Problem, rng: np.random.Generator) -> str:
        a, op, b = _parse(problem.prompt)
        if op == "+" and self.demo_carry_drop > 0 and rng.random() < self.demo_carry_drop:
            return str(_add_without_carry(a, b))
        return problem.answer

    def reward(self, problem: Problem, completion: str, finished: bool) -> float:
        text = completion.strip()
        if not finished or not _ANSWER.fullmatch(text):
            return 0.0
        return float(int(text) == int(problem.answer))
