"""The paper's compute model, one function per formula (a leaf module).

Compute is counted in forward-backward sample units: training on one rollout costs 1, generating
one costs mu (``compute.mu``). The paper's plots charge one on-policy step at batch B, which
trains on B rollouts and generates B, ``B (1 + mu)`` units = 1 paper unit.

The asynchronous cluster: a node of ``gpus`` GPUs is split into W inference workers and T
trainers. A training step on B samples takes B/T of a trainer's time, during which the
workers generate ``(W / mu) (B / T)`` rollouts; the step costs the whole node for that time,
``B (1 + W/T)`` units, i.e. gamma = (1 + W/T) / (1 + mu) paper units, and the first-order reuse
ratio is B / R = mu T / W.

A generation cost that changes during a run (``compute.mu_schedule``: from ``u`` paper units
on, a rollout costs ``mu'``) keeps one currency: paper units stay normalised by the reference
``compute.mu`` (an on-policy step at the first cost is 1), and each step is charged what its
generation costs at the mu in force when it starts (:func:`mu_in_force`), so an on-policy step
after a change to mu' costs (1 + mu') / (1 + mu).
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


def as_schedule(schedule) -> tuple[tuple[float, float], ...] | None:
    """``compute.mu_schedule`` (a list of [from units, mu] pairs, or null) as a tuple of float
    pairs (None when there is none), what the ledger and the controller hold."""
    if not schedule:
        return None
    return tuple((float(u), float(m)) for u, m in schedule)


def mu_in_force(mu: float, schedule, units: float) -> float:
    """The generation cost of a step that starts ``units`` paper units into the run: ``mu``
    (``compute.mu``) before the first pair of ``schedule`` (``compute.mu_schedule``: (from
    units, mu) pairs, increasing; None or empty: ``mu`` throughout), then the latest pair's
    whose units are reached (to 1e-9)."""
    for start, m in schedule or ():
        if units < start - 1e-9:
            break
        mu = m
    return float(mu)


def scheduled_step_units(batch_size: int, rollouts: float, mu: float, schedule,
                         units: float) -> float:  # fmt: skip
    """Paper units of a synchronous step that trains on B and generates ``rollouts`` when it
    starts ``units`` into the run: (B + mu_t R) / (B (1 + mu)), mu_t = :func:`mu_in_force`."""
    mu_t = mu_in_force(mu, schedule, units)
    return paper_units(sample_units(batch_size, rollouts, mu_t), mu, batch_size)


def scheduled_steps(batch_size: int, rollouts: float, mu: float, schedule,
                    budget: float) -> int:  # fmt: skip
    """Synchronous steps of ``rollouts`` fresh rollouts each that ``budget`` paper units buy
    when the generation cost follows ``schedule``: each step charged
    :func:`scheduled_step_units` at the units spent before it, counted step by step as the
    ledger and the controller count them.

    Hand-checked: B = 64, R = 16, mu = 2, schedule [[3, 17.6]], budget 6: the steps cost
    (64 + 2 x 16) / 192 = 0.5 while under 3 units (6 steps reach 3.0), then
    (64 + 17.6 x 16) / 192 = 1.8; 3 + 1.8 = 4.8 <= 6 and 6.6 > 6: 7 steps."""
    spent, steps = 0.0, 0
    while True:
        cost = scheduled_step_units(batch_size, rollouts, mu, schedule, spent)
        if spent + cost > budget * (1 + 1e-9):
            return steps
        spent += cost
        steps += 1


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
