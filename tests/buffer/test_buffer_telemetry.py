"""Per-use telemetry: histograms and batch statistics against a hand-computed tiny stream."""

from __future__ import annotations

import math

import pytest


def hist(**bins: int) -> list[int]:
    """A 65-bin histogram with counts at the named bins: hist(b0=4, b64=1)."""
    out = [0] * 65
    for k, v in bins.items():
        out[int(k[1:])] = v
    return out


def test_histograms_on_a_tiny_stream(build, tiny):
    buf = build(3, name="fifo")
    # step 0: uids 0, 1 (version 0); the batch is both (k = stored = 2): first uses, age 0
    buf.add(tiny([0, 1], 0), 0)
    assert sorted(buf.sample(2, 0).uid_B.tolist()) == [0, 1]
    # step 1: uids 2, 3 arrive; capacity 3 evicts uid 0 (used once). Batch {1, 2, 3}:
    # uid 1: lag/age 1, 1 previous use, last used 1 step ago; 2 and 3: fresh, first uses
    buf.add(tiny([2, 3], 1), 1)
    assert sorted(buf.sample(3, 1).uid_B.tolist()) == [1, 2, 3]
    # step 3 (no add): uid 1: lag 3, 2 previous uses, 2 steps since; 2, 3: lag 2, 1 use, 2
    assert sorted(buf.sample(3, 3).uid_B.tolist()) == [1, 2, 3]
    t = buf.telemetry()
    assert t["off_policiness"] == hist(b0=4, b1=1, b2=2, b3=1)
    assert t["age"] == t["off_policiness"]  # version == created step here
    assert t["prev_uses"] == hist(b0=4, b1=3, b2=1)
    assert t["steps_since_last_use"] == hist(b1=1, b2=3)  # the 4 first uses are not in it
    assert t["replay_count"] == hist(b1=1)  # uid 0 left after one use
    assert t["replay_count_live"] == hist(b2=2, b3=1)  # uid 1: 3 uses; 2 and 3: 2 each

    s = buf.stats()
    # last batch: lags 3, 2, 2
    assert s["batch_version_lag_mean"] == pytest.approx(7 / 3)
    assert (s["batch_version_lag_max"], s["batch_version_lag_p50"]) == (3, 2)
    assert s["batch_version_lag_p90"] == 3
    assert s["batch_prev_uses_mean"] == pytest.approx(4 / 3) and s["batch_prev_uses_max"] == 2
    assert s["batch_since_last_use_mean"] == 2 and s["batch_since_last_use_p90"] == 2
    assert s["batch_frac_first_use"] == 0 and s["batch_frac_fresh"] == 0
    # whole run: 8 uses, lags 0+0 + 1+0+0 + 3+2+2 = 8; previous uses 0+0 + 1+0+0 + 2+1+1 = 5;
    # first uses 4; fresh uses 4
    assert s["run_version_lag_mean"] == 1 and s["run_frac_first_use"] == 0.5
    assert s["run_frac_fresh"] == 0.5 and s["run_prev_uses_mean"] == pytest.approx(5 / 8)
    assert s["run_since_last_use_mean"] == pytest.approx((1 + 2 + 2 + 2) / 4)
    assert s["run_replay_count_mean"] == 1
    assert s["size"] == 3 and s["uses_mean"] == pytest.approx(7 / 3) and s["uses_max"] == 3


def test_overflow_bin_negative_values_and_first_batch(build, tiny):
    buf = build(4, name="fifo")
    s = buf.stats()
    assert math.isnan(s["batch_age_mean"]) and math.isnan(s["run_age_mean"])
    buf.add(tiny([0], 0, version=2), 0)  # a version "from the future" (impossible): bin 0
    buf.sample(1, 0)
    assert buf.telemetry()["off_policiness"] == hist(b0=1)
    assert buf.stats()["batch_version_lag_max"] == -2  # stats keep exact values
    buf.sample(1, 100)  # lag 98, age 100, 100 steps since the last use: overflow bin
    t = buf.telemetry()
    assert t["off_policiness"] == hist(b0=1, b64=1) and t["age"] == hist(b0=1, b64=1)
    assert t["steps_since_last_use"] == hist(b64=1)
    assert buf.stats()["batch_since_last_use_max"] == 100


def test_on_policy_is_all_first_uses(build, tiny):
    buf = build(8, name="on_policy")
    for step in range(3):
        buf.add(tiny(list(range(4 * step, 4 * step + 4)), step), step)
        buf.sample(4, step)
    t, s = buf.telemetry(), buf.stats()
    assert t["off_policiness"] == hist(b0=12) and t["replay_count"] == hist(b1=12)
    assert sum(t["steps_since_last_use"]) == 0 and s["run_frac_first_use"] == 1
    assert math.isnan(s["batch_since_last_use_mean"]) and s["retired_total"] == 12
