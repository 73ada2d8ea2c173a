"""The package's error for bad input (a leaf module: anything may import it)."""


class ConfigError(ValueError):
    """An impossible configuration; the message is one line naming keys and values."""
