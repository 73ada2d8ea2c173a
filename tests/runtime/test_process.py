"""The process set-up (replay_exp/runtime/process.py): ``deterministic=true`` switches torch to
deterministic kernels, and on CPU, whose kernels here are deterministic already, a run trains
exactly as without it (on CUDA the GPU check runs determinism and resume with it on)."""

from __future__ import annotations

import os

import torch

from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.rollout.synthetic import without_wall_clock
from replay_exp.runlog import read_metrics
from replay_exp.runtime.process import CUBLAS_WORKSPACE, set_up_process
from replay_exp.train import run


def test_switch_sets_and_clears_torch_flags(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    threads = torch.get_num_threads()
    try:
        set_up_process(1, deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
        assert torch.get_num_threads() == 1
        set_up_process(1, deterministic=False)
        assert not torch.are_deterministic_algorithms_enabled()
        assert not torch.backends.cudnn.deterministic
    finally:
        set_up_process(threads, deterministic=False)


def test_deterministic_run_on_cpu_equals_the_default(fast, tmp_path):
    rows = {}
    try:
        for flag in ("false", "true"):
            run_dir = tmp_path / flag
            cfg, d = resolve(compose([*fast, "schedule.max_steps=3", f"deterministic={flag}",
                                      "threads=1", f"run_dir={run_dir}"]))  # fmt: skip
            run(cfg, d, run_dir)
            rows[flag] = without_wall_clock(read_metrics(run_dir / "metrics.jsonl"))
        assert torch.are_deterministic_algorithms_enabled()  # the second run's setting
    finally:
        torch.use_deterministic_algorithms(False)
    assert len(rows["true"]) == 4 and rows["true"] == rows["false"]
