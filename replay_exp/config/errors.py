"""The package's errors for bad input (a leaf module: anything may import it)."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """An impossible configuration; the message is one line naming keys and values."""


class RunStopped(RuntimeError):
    """A run stopped before its budget for a reason outside the config (a generator rank of
    ``runtime=distributed`` died); a snapshot is on disk and a relaunch resumes from it."""


def fail(msg: str) -> None:
    """Raise a :class:`ConfigError` with the one-line ``msg``."""
    raise ConfigError(msg)


def positive(name: str, value: Any) -> None:
    """``name=value`` must be a number > 0."""
    if value is None or value <= 0:
        fail(f"{name}={value} must be > 0")
