"""The controller's learning-rate knob (``controller.knobs`` with ``lr``): ``algo.lr`` times a
scale in [``controller.lr_min_scale``, 1], set at each decision from the window's signals by
``controller.lr_rule`` (docs/controller.md, "What it sets"):

- ``ess``: the window's sequence-level ESS fraction, as VCPO (arXiv 2602.17616) scales its
  step by the effective sample size;
- ``lag``: the window's mean lag S of the trained rows (versions since each was generated)::

      scale = (1 + S / lr_lag_scale) ** -1/2

  From a bound on stale-gradient SGD of the form D / (eta T) + eta (sigma^2 + c S): the first
  term is the optimisation error after T steps, the second the noise and the bias that a lag
  of S steps adds at step size eta (the bias of stale rollouts is O(S eta), the form arXiv
  2607.01083 states; we did not read that paper's own rule and do not claim it). The bound is
  least at eta* = sqrt(D / (T (sigma^2 + c S))), so eta*(S) / eta*(0) = (1 + S / S_half)^-1/2
  with S_half = sigma^2 / c, the lag at which the bias term equals the noise term: that is
  ``lr_lag_scale``, the rule's one constant. eta*(0) is the on-policy optimum, ``algo.lr``.
  The rule is a shape, not a derivation of S_half: a study chooses it
  (sweeps/controller_lr_select_tiny.yaml).

Hand-checked: S = 768, S_half = 256 -> (1 + 3)^-1/2 = 0.5; ess 0.6 -> 0.6; either below
``lr_min_scale`` -> ``lr_min_scale``; no signal (NaN) -> 1.
"""

from __future__ import annotations

import math

# The rules ``controller.lr_rule`` may name.
LR_RULES = ("ess", "lag")


def lr_scale(rule: str, ess: float, lag_mean: float, min_scale: float, lag_scale: float) -> float:
    """``algo.lr``'s factor: the rule's raw scale (module docstring) clamped to
    [``min_scale``, 1]; 1 when the rule's signal is missing (NaN)."""
    if rule == "ess":
        raw = ess
    elif rule == "lag":
        raw = (1.0 + lag_mean / lag_scale) ** -0.5 if math.isfinite(lag_mean) else math.nan
    else:
        raise ValueError(f"unknown lr rule {rule!r}; valid rules are {LR_RULES}")
    if not math.isfinite(raw):
        return 1.0
    return min(1.0, max(min_scale, raw))
