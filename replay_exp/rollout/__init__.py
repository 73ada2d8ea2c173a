"""Generation backends behind one interface; ``generation.backend`` picks one."""

from __future__ import annotations

from replay_exp.rollout.base import Generation, Generator, SamplingParams, completion_mask
from replay_exp.rollout.hf import HFGenerator

BACKENDS: dict[str, type[Generator]] = {"hf": HFGenerator}

__all__ = [
    "BACKENDS",
    "Generation",
    "Generator",
    "HFGenerator",
    "SamplingParams",
    "completion_mask",
]
