"""Task registry: ``task.name`` -> Task class, built from the task's config node."""

from __future__ import annotations

from typing import Any

from replay_exp.tasks.arithmetic import ArithmeticTask
from replay_exp.tasks.base import Problem, Task
from replay_exp.tasks.gym_task import ReasoningGymTask
from replay_exp.tasks.math_task import MATH_TASKS, MathTask

TASKS: dict[str, type[Task]] = {
    "arithmetic": ArithmeticTask,
    **dict.fromkeys(MATH_TASKS, MathTask),
    "reasoning_gym": ReasoningGymTask,
}

__all__ = ["TASKS", "Problem", "Task", "make_task"]


def make_task(task_cfg: Any) -> Task:
    """Build the task named by ``task_cfg.name`` from its config node."""
    return TASKS[task_cfg.name].from_config(task_cfg)
