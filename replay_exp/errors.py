"""The package's error for bad input (a leaf module: anything may import it)."""


class ConfigError(ValueError):
    """An impossible configuration; the message is one line naming keys and values."""


class RunStopped(RuntimeError):
    """A run stopped before its budget for a reason outside the config (a generator rank of
    ``runtime=distributed`` died); a snapshot is on disk and a relaunch resumes from it."""
