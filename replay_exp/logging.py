"""Run-directory logging: ``metrics.jsonl`` is the source of truth.

Each row is written with one ``os.write`` on a file opened with O_APPEND, so a run killed
mid-write leaves at most one truncated last line; :func:`read_metrics` skips such a line with a
warning instead of failing.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Any


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN/inf; null keeps the file readable everywhere
    return v


class MetricsWriter:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, row: dict[str, Any]) -> None:
        line = json.dumps({k: _clean(v) for k, v in row.items()}, sort_keys=False) + "\n"
        os.write(self._fd, line.encode())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All complete rows of a metrics.jsonl; a truncated or corrupt line is skipped with a
    warning."""
    rows = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                warnings.warn(f"{path}:{i}: skipping a truncated or corrupt line", stacklevel=2)
    return rows
