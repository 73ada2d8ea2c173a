"""Compute ledger arithmetic, metrics.jsonl robustness, named cadences."""

from __future__ import annotations

import pytest
import torch

from replay_exp.compute.ledger import Ledger, forward_flops
from replay_exp.config.seeding import derive_seed
from replay_exp.runlog import MetricsWriter, read_metrics
from replay_exp.runtime.schedule import Every


def test_paper_units_baseline_step_costs_one_and_replay_step_costs_less():
    # On-policy at B = 60, mu = 5: one step = (60 + 5 * 60) / (60 * 6) = 1 unit.
    led = Ledger(mu=5.0, batch_size=60, n_params=10, n_layers=1, hidden=4)
    led.add_generation(torch.full((60,), 10), gen_tokens=300, seconds=1.0)
    led.add_training(torch.full((60,), 10), loss_tokens=300, seconds=0.5)
    assert led.paper_units == pytest.approx(1.0)
    # Replay with R = 15 (y = 4): (60 + 5 * 15) / 360 = 135 / 360 = 0.375 more.
    led.add_generation(torch.full((15,), 10), gen_tokens=75, seconds=0.25)
    led.add_training(torch.full((60,), 10), loss_tokens=300, seconds=0.5)
    assert led.paper_units == pytest.approx(1.375)
    assert led.rollouts == 75 and led.samples_trained == 120
    # Measured mu: (1.25 s / 75 rollouts) / (1.0 s / 120 samples) = 2.0.
    assert led.measured_mu() == pytest.approx(2.0)


def test_forward_flops_formula():
    # 2 N T + 2 L d T^2 with N=100, L=2, d=8: T=3 -> 600 + 288 = 888; T=1 -> 200 + 32 = 232.
    assert forward_flops(100, 2, 8, torch.tensor([3, 1])) == 888 + 232


def test_metrics_file_survives_a_truncated_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    w = MetricsWriter(path)
    w.write({"step": 1, "x": 0.5})
    w.write({"step": 2, "x": float("nan")})
    w.close()
    with open(path, "a") as f:
        f.write('{"step": 3, "x": 0.')  # killed mid-line
    with pytest.warns(UserWarning, match="truncated"):
        rows = read_metrics(path)
    assert rows == [{"step": 1, "x": 0.5}, {"step": 2, "x": None}]


def test_every_and_derived_seeds():
    assert [s for s in range(7) if Every(3)(s)] == [0, 3, 6]
    assert derive_seed(0, "gen", 1) == derive_seed(0, "gen", 1)
    assert len({derive_seed(0, "gen", i) for i in range(100)} | {derive_seed(1, "gen", 0)}) == 101


def test_unbiased_pass_at_k():
    from replay_exp.eval.evaluate import pass_at_k

    # n=4 samples, c=1 correct: pass@1 = 1/4; pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5.
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # c=0 -> 0; n - c < k -> 1 (every k-subset holds a correct sample).
    assert pass_at_k(8, 0, 4) == 0.0 and pass_at_k(8, 6, 4) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)
