"""Closed-loop replay control (``controller=adaptive``; ``docs/controller.md``): every K steps a
controller reads training-side signals (``signals``) and sets the reuse ratio, the buffer's
capacity and optionally a learning-rate scale (``ladder``) by one of its policies: ``guard``
(staleness guards, DGG / VCPO style) or ``model`` (the design model of
``replay_exp.theory.design`` re-run on online estimates). ``controller=fixed`` (the default)
builds none: every knob stays where the config put it.

Adding a policy: a module with a ``decide`` function of the window's summary (and whatever
state it keeps), its name in :data:`POLICIES`, its knobs in ``conf/controller/adaptive.yaml``
and the schema (``config.schemas``), and a branch in ``Controller.decide``.
"""

from __future__ import annotations

# The policies ``controller.policy`` may name (null: fixed, no controller).
POLICIES = ("guard", "model")
# The knobs ``controller.knobs`` may list.
KNOBS = ("reuse", "capacity", "lr")


def make_controller(cfg, d, buffer, optimizer):
    """The run's controller, or None under ``controller=fixed`` (``controller.policy``
    null)."""
    if cfg.controller.policy is None:
        return None
    from replay_exp.control.controller import Controller

    return Controller(cfg, d, buffer, optimizer)
