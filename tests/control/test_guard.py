"""The guard policy's decisions on hand-made signal sequences (replay_exp/control/guard.py).
Limits: the defaults of conf/controller/adaptive.yaml (kl_max 0.05, clip_max 0.2, ess_min 0.5,
surge_max 3, calm 0.5, patience 2)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from replay_exp.config.schemas import option_defaults
from replay_exp.control import guard
from replay_exp.control.guard import GuardState

G = SimpleNamespace(**option_defaults("controller", "adaptive")["guard"])


def window(kl=0.0, clip=0.0, ess=1.0, grad=1.0):
    return {"kl": kl, "clip_frac": clip, "ess": ess, "grad_norm": grad}


def test_the_yaml_defaults_are_the_ones_these_tests_derive_with():
    assert (G.kl_max, G.clip_max, G.ess_min, G.surge_max, G.calm, G.patience) == (
        0.05, 0.2, 0.5, 3.0, 0.5, 2)  # fmt: skip


def test_surge_is_the_window_norm_over_the_earlier_mean():
    # earlier windows 2.0 and 4.0 (mean 3.0); this one 9.0: 9 / 3 = 3.0
    state = GuardState(grad_sum=6.0, grad_windows=2)
    assert guard.surge(9.0, state) == pytest.approx(3.0)
    assert math.isnan(guard.surge(9.0, GuardState()))  # no earlier window


def test_a_calm_sequence_climbs_one_rung_every_patience_windows():
    # On-policy: kl = clip = 0, ess = 1, constant grad norm (surge 1): calm every window. With
    # patience 2 the moves are 0, +1, 0, +1.
    state = GuardState()
    moves = [guard.decide(window(), state, G)[0] for _ in range(4)]
    assert moves == [0, 1, 0, 1]


def test_each_limit_breached_steps_down():
    # kl 0.06 > 0.05; clip 0.25 > 0.2; ess 0.4 < 0.5; a surge: earlier window 1.0, this 3.5
    # (3.5 > 3).
    for w in (window(kl=0.06), window(clip=0.25), window(ess=0.4)):
        move, reason, inputs = guard.decide(w, GuardState(), G)
        assert move == -1 and reason.startswith("breach")
    state = GuardState(grad_sum=1.0, grad_windows=1)
    move, reason, inputs = guard.decide(window(grad=3.5), state, G)
    assert (move, reason, inputs["breach/surge"]) == (-1, "breach: surge", 1.0)
    assert inputs["in/grad_surge"] == pytest.approx(3.5)
    # the window's norm joins the earlier ones: mean (1 + 3.5) / 2
    assert (state.grad_sum, state.grad_windows) == (4.5, 2)


def test_inside_the_limits_but_not_calm_holds_and_resets_the_streak():
    # kl 0.03: under 0.05, over calm 0.5 x 0.05 = 0.025. A calm window first (streak 1), then
    # this one: hold, streak 0; then two calm windows are needed again.
    state = GuardState()
    seq = [window(), window(kl=0.03), window(), window()]
    moves = [guard.decide(w, state, G)[0] for w in seq]
    assert moves == [0, 0, 0, 1]
    # ess 0.8: calm needs ess >= 1 - 0.5 (1 - 0.5) = 0.75: calm. ess 0.7: not calm, not breached.
    assert guard.checks(window(ess=0.8), 1.0, G)["ess"] == (False, True)
    assert guard.checks(window(ess=0.7), 1.0, G)["ess"] == (False, False)


def test_nan_signals_are_not_checked():
    # A loss without a clip (NaN clip_frac) and the first window (NaN surge): calm on the rest.
    w = window(clip=math.nan)
    assert guard.checks(w, math.nan, G) == {
        "kl": (False, True), "clip_frac": (False, True), "ess": (False, True),
        "surge": (False, True),
    }  # fmt: skip
