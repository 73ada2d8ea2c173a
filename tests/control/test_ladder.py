"""The ladder of designs a controller moves along (replay_exp/control/ladder.py)."""

from __future__ import annotations

from replay_exp.control.ladder import Knobs, Ladder


def test_on_policy_start_climbs_to_one_group_a_step():
    # B = R0 = N0 = 64, G = 8, g_r = 2, g_n = 4: rung l has R = 64 / 2^l (down to G = 8) and
    # N = 64 4^l; below rung 0 nothing changes (R is B, N is B), above rung 3 R stays 8 and N
    # would grow alone: 4096 * 4 = 16384 <= N_max, 65536 > N_max = 20000 -> capped at 20000.
    lad = Ladder(64, 64, B=64, G=8, R_min=8, N_max=20000, reuse_growth=2, capacity_growth=4)
    assert lad.rungs == [(64, 64), (32, 256), (16, 1024), (8, 4096), (8, 16384), (8, 20000)]
    assert lad.start == 0
    assert lad.knobs(2) == Knobs(16, 1024, 1.0)
    assert lad.clamp(-3) == 0 and lad.clamp(99) == 5


def test_start_in_the_middle_has_rungs_below():
    # Start (R, N) = (32, 512): below, R = 64 and N = 128, then R stays 64 (= B) and N = 64
    # (= B, the floor); above, (16, 2048), then (8, 8192), then N alone to N_max = 10000.
    lad = Ladder(32, 512, B=64, G=8, R_min=8, N_max=10000, reuse_growth=2, capacity_growth=4)
    assert lad.rungs == [(64, 64), (64, 128), (32, 512), (16, 2048), (8, 8192), (8, 10000)]
    assert lad.start == 2


def test_a_knob_it_does_not_own_stays():
    # Reuse only: N stays 256; R halves down to R_min = 16.
    lad = Ladder(64, 256, B=64, G=8, R_min=16, N_max=4096, reuse_growth=2, capacity_growth=4,
                 owns_capacity=False)  # fmt: skip
    assert lad.rungs == [(64, 256), (32, 256), (16, 256)]
    # Capacity only: R stays 16, N from 1024 up by 4 to N_max, down to B.
    lad = Ladder(16, 1024, B=64, G=8, R_min=8, N_max=4096, reuse_growth=2, capacity_growth=4,
                 owns_reuse=False)  # fmt: skip
    assert lad.rungs == [(16, 64), (16, 256), (16, 1024), (16, 4096)]
    assert lad.start == 2


def test_above_finds_the_next_design_up_from_anywhere():
    lad = Ladder(64, 64, B=64, G=8, R_min=8, N_max=4096, reuse_growth=2, capacity_growth=4)
    # rungs (64, 64), (32, 256), (16, 1024), (8, 4096)
    assert lad.above(Knobs(64, 64)) == 1
    # off the ladder, (24, 300): the first rung with R <= 24 and N >= 300 is (16, 1024)
    assert lad.above(Knobs(24, 300)) == 2
    assert lad.above(Knobs(8, 4096)) is None
