"""The paper's compute model, one function per formula (a leaf module).

Compute is counted in forward-backward sample units: training on one rollout costs 1, generating
one costs mu (``compute.mu``). The paper's plots charge one on-policy step at batch B, which
trains on B rollouts and generates B, ``B (1 + mu)`` units = 1 paper unit.

The asynchronous cluster: a node of ``gpus`` GPUs is split into W inference workers and T
trainers. A training step on B samples takes B/T of a trainer's time, during which the
workers generate ``(W / mu) (B / T)`` rollouts; the step costs the whole node for that time,
``B (1 + W/T)`` units, i.e. gamma = (1 + W/T) / (1 + mu) paper units, and the first-order reuse
ratio is B / R = mu T / W.
"""

from __future__ import annotations


def sample_units(trained: float, generated: float, mu: float) -> float:
    """Forward-backward sample units of training on ``trained`` rollouts and generating
    ``generated``: ``trained + mu generated``."""
    return trained + mu * generated


def paper_units(units: float, mu: float, batch_size: int) -> float:
    """Sample units in the paper's units: ``units / (B (1 + mu))``, so that an on-policy step
    (training on B, generating B) is 1."""
    return units / (batch_size * (1 + mu))


def workers_of(gpus: int, trainers: int) -> int:
    """W = gpus - T: the inference workers of a node whose other GPUs train."""
    return gpus - trainers


def async_rollouts_per_step(batch_size: int, workers: int, trainers: int, mu: float) -> float:
    """R = B W / (mu T): the mean fresh rollouts per trainer step of the async cluster."""
    return batch_size * workers / (mu * trainers)


def async_gamma(workers: int, trainers: int, mu: float) -> float:
    """gamma = (1 + W/T) / (1 + mu): paper units of one async trainer step (the whole node)."""
    return (1 + workers / trainers) / (1 + mu)


def first_order_reuse(workers: int, trainers: int, mu: float) -> float:
    """y = mu T / W: the async cluster's reuse ratio B / R to first order."""
    return mu * trainers / workers
