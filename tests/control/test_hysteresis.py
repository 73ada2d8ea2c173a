"""The model policy's hysteresis gate (replay_exp/control/hysteresis.py) on hand-made target
sequences that flap without it; the expected designs are derived in the comments."""

from __future__ import annotations

from replay_exp.control.hysteresis import HysteresisState, gate

A, B = (16384, 16), (65536, 24)  # the two designs the mu = 2 runs switched between


def run(targets, gains, min_gain, persist, start=A):
    """The designs in use after each decision, and the gate's state at the end."""
    state, current, used = HysteresisState(), start, []
    for target, gain in zip(targets, gains, strict=True):
        current, _ = gate(current, target, gain, state, min_gain, persist)
        used.append(current)
    return used, state


# The policy's targets alternate A, B as its alpha crosses the boundary, then B holds.
TARGETS = [A, B, A, B, B]
GAINS = [0.0, 0.05, 0.05, 0.05, 0.05]  # 1 - J(target) / J(current): 5 % each time


def test_without_hysteresis_every_change_of_target_is_a_move():
    # min_gain null, persist 1 (the defaults): B at decision 2, A at 3, B at 4, B stays.
    used, state = run(TARGETS, GAINS, None, 1)
    assert used == [A, B, A, B, B]
    assert state.held == 0


def test_persist_moves_only_on_a_target_named_twice_in_a_row():
    # persist 2: decision 2 names B (1 of 2: hold), 3 names A = current (count reset), 4 names
    # B (1 of 2: hold), 5 names B again (2 of 2): one move, at the 5th decision.
    used, state = run(TARGETS, GAINS, None, 2)
    assert used == [A, A, A, A, B]
    assert state.held == 2 and state.pending is None and state.count == 0


def test_min_gain_holds_a_move_that_is_better_by_a_hair():
    # min_gain 0.1 > 0.05: every move is held (3 held decisions: 2, 4, 5); 0.01 < 0.05: as
    # without hysteresis.
    used, state = run(TARGETS, GAINS, 0.1, 1)
    assert used == [A] * 5 and state.held == 3
    used, _ = run(TARGETS, GAINS, 0.01, 1)
    assert used == [A, B, A, B, B]


def test_another_target_restarts_the_count():
    # persist 3: B, B, then C (count restarts at 1), B (1), B (2), B (3): moves at the 6th.
    C = (4096, 8)
    used, _ = run([B, B, C, B, B, B], [0.5] * 6, None, 3)
    assert used == [A, A, A, A, A, B]


def test_the_state_round_trips_and_old_snapshots_load():
    state = HysteresisState((65536, 24), 2, 5)
    assert HysteresisState.from_state(state.state_dict()) == state
    assert HysteresisState.from_state(None) == HysteresisState()
