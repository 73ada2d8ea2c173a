"""The controller's lr rules (replay_exp/control/lr.py): expected scales derived by hand."""

from __future__ import annotations

import math

import pytest

from replay_exp.control.lr import lr_scale


def test_the_ess_rule_is_the_clamped_ess():
    # clamp(ess, 0.25, 1): 0.6 -> 0.6, 0.1 -> 0.25, 1.0 -> 1.0, NaN -> 1.0 (the lag is ignored)
    assert lr_scale("ess", 0.6, 5000.0, 0.25, 256) == pytest.approx(0.6)
    assert lr_scale("ess", 0.1, 0.0, 0.25, 256) == 0.25
    assert lr_scale("ess", 1.0, 0.0, 0.25, 256) == 1.0
    assert lr_scale("ess", math.nan, 0.0, 0.25, 256) == 1.0


def test_the_lag_rule_falls_as_one_over_the_root_of_the_lag():
    # (1 + S / S_half)^-1/2: S = 0 -> 1 (on-policy keeps algo.lr); S = 768, S_half = 256 ->
    # 4^-1/2 = 0.5; S = 256 -> 2^-1/2 = 0.7071; S = 256 x 99 -> 100^-1/2 = 0.1, clamped to
    # 0.25; no rows (NaN) -> 1. The ESS is ignored.
    assert lr_scale("lag", 0.1, 0.0, 0.25, 256) == 1.0
    assert lr_scale("lag", 0.1, 768.0, 0.25, 256) == pytest.approx(0.5)
    assert lr_scale("lag", 1.0, 256.0, 0.25, 256) == pytest.approx(1 / math.sqrt(2))
    assert lr_scale("lag", 1.0, 256.0 * 99, 0.25, 256) == 0.25
    assert lr_scale("lag", 1.0, 256.0 * 99, 0.05, 256) == pytest.approx(0.1)
    assert lr_scale("lag", 1.0, math.nan, 0.25, 256) == 1.0


def test_an_unknown_rule_is_an_error():
    with pytest.raises(ValueError, match="unknown lr rule 'kl'"):
        lr_scale("kl", 1.0, 0.0, 0.25, 256)
