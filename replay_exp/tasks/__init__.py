"""Task registry: ``task.name`` -> Task class, built from the task's config node."""

from __future__ import annotations

from typing import Any

from replay_exp.tasks.arithmetic import ArithmeticTask
from replay_exp.tasks.base import Problem, Task

TASKS: dict[str, type[Task]] = {"arithmetic": ArithmeticTask}

__all__ = ["TASKS", "Problem", "Task", "make_task"]


def make_task(task_cfg: Any) -> Task:
    """Build the task named by ``task_cfg.name`` from the remaining keys of ``task_cfg``."""
    kwargs = {k: v for k, v in dict(task_cfg).items() if k != "name"}
    if "operations" in kwargs:
        kwargs["operations"] = tuple(kwargs["operations"])
    return TASKS[task_cfg.name](**kwargs)
