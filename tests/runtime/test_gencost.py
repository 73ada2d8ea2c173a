"""runtime.generation_cost=modelled (replay_exp/compute/gencost.py): a generator's calls last
what a GPU node would spend on them, and the ledger charges that. The cost model's numbers are
checked against closed forms; the mechanism in a real W = 1, T = 1 run against the model
recomputed from the same seeds. How close the realised ratio gets to compute.mu with the
trainers' running measurement is a timing, printed by bench/generation_cost.py, not tested."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from replay_exp.compute.gencost import ModelledCost
from replay_exp.compute.lengthmodel import BLOCK, expected_max, longest, quantile_level
from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.config.errors import ConfigError


def test_expected_max_of_two_lengths_is_the_closed_form():
    """For iid log-normal X1, X2 with mean 1, E max = 1 + E|X1 - X2| / 2 = 1 + G, with the Gini
    coefficient G = 2 Phi(sigma / sqrt 2) - 1: E max = 2 Phi(sigma / sqrt 2). sigma = 0.5:
    Phi(0.353553) = 0.638163, so 1.276326."""
    assert expected_max(2, 0.5) == pytest.approx(1.276326, rel=5e-3)
    assert expected_max(1, 0.5) == pytest.approx(1.0, rel=5e-3)  # the mean itself
    assert expected_max(16, 0.0) == 1.0


def test_longest_is_the_quantile_of_the_max():
    """n = 1: the quantile at 1/2 is the log-normal's median exp(-sigma^2 / 2) (sigma = 0.5:
    exp(-0.125) = 0.882497). n = 2: P[M <= m] = F(m)^2, so the quantile at 1/4 is F^-1(1/2),
    the same median. sigma = 0: every length is 1."""
    assert longest(0.5, 1, 0.5) == pytest.approx(0.882497, rel=1e-6)
    assert longest(0.25, 2, 0.5) == pytest.approx(0.882497, rel=1e-6)
    assert longest(0.9, 64, 0.0) == 1.0
    assert longest(0.2, 64, 0.5) < longest(0.8, 64, 0.5)


def test_quantile_levels_take_every_slice_once_a_block():
    """Calls 0-7 of a generator take the 8 slices [k/8, (k+1)/8) once each (a permutation),
    calls 8-15 again; the same (seed, w, j) gives the same u (a relaunch redraws it)."""
    for w in (0, 1):
        for block in (0, 1):
            slices = sorted(int(quantile_level(3, w, 8 * block + k) * BLOCK) for k in range(8))
            assert slices == list(range(8))
    assert quantile_level(3, 0, 5) == quantile_level(3, 0, 5)
    assert quantile_level(3, 0, 5) != quantile_level(3, 1, 5)


def test_next_call_revalues_the_earlier_calls_at_the_newest_t():
    """sigma = 0, n = 16, mu = 6.84: a call is n mu = 109.44 trained samples' time.
    t = 0.01: 1.0944 s. t = 0.02 next: both calls at 0.02 are 4.3776 s, 1.0944 already
    spent, so this one lasts 3.2832 (own share 2.1888). t = 0.015 next: 3 x 1.6416 =
    4.9248 - 4.3776 = 0.5472 (own share 1.6416). Real generation well under each."""
    cost = ModelledCost(6.84, 0.0)
    expected = [(1.0944, 1.0944), (3.2832, 2.1888), (0.5472, 1.6416)]
    for t, (seconds, own) in zip((0.01, 0.02, 0.015), expected, strict=True):
        assert cost.next_call(16, 0.5, t, elapsed=0.01) == pytest.approx((seconds, own))


def test_what_a_call_cannot_give_back_the_next_one_does():
    """sigma = 0, n = 16, mu = 6.84 (109.44 samples' time a call). t = 0.02: 2.1888 s. t
    falls to 0.01: both calls are now worth 2.1888, all spent, so the second would last 0 but
    its real generation took 0.1 s: it lasts 0.1 (spent 2.2888). Third at t = 0.01: 3.2832 -
    2.2888 = 0.9944, the 0.1 given back; in all 3.2832 = the units at the last t."""
    cost = ModelledCost(6.84, 0.0)
    got = [cost.next_call(16, 0.5, t, elapsed=0.1)[0] for t in (0.02, 0.01, 0.01)]
    assert got == pytest.approx([2.1888, 0.1, 0.9944])
    assert sum(got) == pytest.approx(cost.units * 0.01)


def test_calls_average_mu_per_rollout_and_spread_with_the_tail():
    """sigma > 0: over 2000 calls (250 blocks) at a fixed t the mean call is n mu t (the
    longest is normalised by its expectation), and the spread grows with sigma. The top
    eighth's tail is what is left of the noise: at sigma = 1 seeds 0-4 give 0.989-1.024 of
    n mu, so the tolerance is 4 % there and 1 % at sigma = 0.3."""
    n, spreads = 16, []
    for sigma, tolerance in ((0.3, 0.01), (1.0, 0.04)):
        cost = ModelledCost(6.84, sigma)
        units = np.array([cost.call_units(n, quantile_level(1, 0, j)) for j in range(2000)])
        assert units.mean() == pytest.approx(n * 6.84, rel=tolerance)
        spreads.append(units.std() / units.mean())
    assert spreads[0] < spreads[1]


def _modelled_run(fast, tmp_path, *extra) -> dict:
    """A 6-step W = 1, T = 1 run at mu = 6.84 with modelled generation cost; its summary."""
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "replay_exp.train", *fast, f"run_dir={run_dir}", "seed=0",
        "runtime=distributed", "schedule=async", "schedule.gpus=null", "schedule.workers=1",
        "schedule.trainers=1", "schedule.max_steps=6", "eval.every=6", "compute.mu=6.84",
        "runtime.generation_cost=modelled", *extra,
    ]  # fmt: skip
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.slow
def test_a_modelled_run_charges_the_model_for_every_call(fast, tmp_path):
    """W = 1, T = 1, fixed reference 0.02 s per trained sample, mu = 6.84, sigma = 0.5: each
    call of 16 rollouts lasts 16 x 6.84 x 0.02 x max L / E max (~2.2 s, far above the real
    generation), so the ledger's generation seconds are exactly the model's, call by call, for
    the calls that arrived (quantile levels quantile_level(0, 0, j); a fixed t revalues
    nothing)."""
    summary = _modelled_run(
        fast, tmp_path, "runtime.cost_model.reference_s_per_sample=0.02",
        "runtime.cost_model.length_sigma=0.5",
    )  # fmt: skip
    assert summary["runtime"]["balanced"] is True
    rollouts, n = summary["compute"]["rollouts"], 16  # B / (G T) = 4 groups of 4 per call
    assert rollouts % n == 0 and rollouts >= n
    cost = ModelledCost(6.84, 0.5)
    expected = 0.02 * sum(cost.call_units(n, quantile_level(0, 0, j)) for j in range(rollouts // n))
    # Equal: no call overran its model (an overrun would charge its longer real time).
    assert summary["compute"]["seconds_gen"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.slow
@pytest.mark.quiet
def test_a_modelled_weight_load_pauses_the_generator(fast, tmp_path):
    """load_cost = 5 trained samples at a fixed 0.02 s each: every take of weights (the
    newest of the pushes waiting, loaded once) lasts 5 x 0.02 = 0.1 s in all (the real load,
    ~1 ms here, included), so weight_load_seconds are 0.1 s per take, plus sleep's overshoot
    (bounded at 50 ms a take, for a busy machine)."""
    summary = _modelled_run(
        fast, tmp_path, "runtime.cost_model.reference_s_per_sample=0.02",
        "runtime.cost_model.load_cost=5",
    )  # fmt: skip
    (gen,) = summary["runtime"]["generators"]
    loads = gen["weight_loads"]
    assert 1 <= loads <= gen["weight_updates"]
    assert 0.1 * loads <= gen["weight_load_seconds"] <= 0.15 * loads


BAD_SETTINGS = [
    ("runtime.generation_cost=gpu", "runtime.generation_cost=gpu is unknown"),
    ("runtime.cost_model.length_sigma=-1", "runtime.cost_model.length_sigma=-1"),
    ("runtime.cost_model.reference_s_per_sample=0", "reference_s_per_sample"),
    ("runtime.cost_model.load_cost=-1", "runtime.cost_model.load_cost=-1 must be >= 0"),
    ("runtime.cost_model.load_cost=8", "needs runtime.generation_cost=modelled"),
]
NODE = [
    "runtime=distributed", "schedule=async", "schedule.gpus=null", "schedule.workers=1",
    "schedule.trainers=1",
]  # fmt: skip


@pytest.mark.parametrize(("override", "message"), BAD_SETTINGS)
def test_bad_cost_model_settings_fail_at_resolve(fast, override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve(compose([*fast, *NODE, override]))


@pytest.mark.slow
def test_a_bad_cost_model_setting_stops_the_command_before_it_writes(fast, tmp_path):
    """The command line gives the same one line and writes nothing (the other settings are
    refused by the same resolve(), above, in process)."""
    override, message = BAD_SETTINGS[-1]
    cmd = [sys.executable, "-m", "replay_exp.train", *fast, f"run_dir={tmp_path / 'run'}", *NODE,
           override]  # fmt: skip
    run = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert message in run.stderr
    assert not (tmp_path / "run").exists()  # nothing written before the error


@pytest.mark.slow
@pytest.mark.quiet
def test_a_modelled_run_on_the_trainers_measured_cost_charges_the_units_at_the_last_t(
    fast, tmp_path
):
    """reference_s_per_sample=null: the first call is timed by the generator's own forward and
    backward, the rest by trainer rank 0's published running mean, and every call revalues the
    earlier ones at the newest t. So the generator's charged seconds are its modelled units
    times the last t it used (up to sleep's overshoot, a few ms a call, and any call whose
    real generation outlasted its share), whatever t did before. Unmodelled, a rollout costs
    well under one trained sample here (measured ratio 0.3-0.5); modelled at mu = 6.84 the
    realised ratio must be above 1 (how close it lands to mu on a quiet machine is
    bench/generation_cost.py's to show, not a test's)."""
    summary = _modelled_run(fast, tmp_path)
    assert summary["runtime"]["balanced"] is True
    (gen,) = summary["runtime"]["generators"]
    model = gen["modelled_units"] * gen["modelled_per_sample"]
    assert model > 0
    assert gen["gen_seconds"] == pytest.approx(model, rel=0.05)
    assert summary["compute"]["measured_mu"] > 1.0
