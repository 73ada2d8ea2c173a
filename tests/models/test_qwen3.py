"""A tiny random Qwen3 through the whole loop: the architecture the paper trains (Qwen3-0.6B,
untied head), in miniature (``replay_exp.models.tiny_hub.TINY_QWEN3``), saved like a hub
checkpoint and loaded with ``model=<dir>``. The shared-prompt forward on Qwen3 is checked in
``test_shared_prefix.py``; Qwen3-0.6B's real width in ``bench/qwen3_width.py``."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.models import count_params, load_policy
from replay_exp.models.tiny import ARCHS, load_pretrained
from replay_exp.models.tiny_hub import QWEN3_0_6B, TINY_QWEN3, main
from replay_exp.runlog import read_metrics
from replay_exp.tasks import make_task
from replay_exp.train import run


def test_cli_writes_the_tiny_qwen3_deterministically(tiny_qwen3_hub_dir, tmp_path):
    main([str(tmp_path / "again"), "--arch", "qwen3"])
    for name in ("config.json", "tokenizer.json"):
        assert (tmp_path / "again" / name).read_text() == (tiny_qwen3_hub_dir / name).read_text()
    saved = json.loads((tiny_qwen3_hub_dir / "config.json").read_text())
    assert saved["architectures"] == ["Qwen3ForCausalLM"]
    assert {k: saved[k] for k in TINY_QWEN3} == TINY_QWEN3  # head_dim, untied, rope as given


def test_qwen3_0_6b_config_has_the_published_size():
    config_cls, model_cls = ARCHS["qwen3"]
    with torch.device("meta"):  # shapes only, no memory
        model = model_cls(config_cls(**QWEN3_0_6B))
    # Per layer: q 1024x2048 + k, v 1024x1024 + o 2048x1024 + MLP 3 x 1024x3072 + norms 2x128
    # + 2x1024 = 15,730,944; x 28 + final norm 1,024 = 440,467,456 (the published 0.44 B
    # non-embedding). Embedding and untied head are 151,936 x 1,024 = 155,582,464 each: without
    # the input embedding 596,049,920 (the published 0.6 B, tied), 751,632,384 in all.
    assert count_params(model, non_embedding=True) == 596_049_920
    assert count_params(model) == 751_632_384


def test_model_dir_loads_as_qwen3_with_qk_norms_and_untied_head(tiny_qwen3_hub_dir):
    cfg = compose([f"model={tiny_qwen3_hub_dir}"])
    assert cfg.model.name == "tiny-qwen3" and cfg.model.tie_word_embeddings is None  # as saved
    model, tok, source = load_policy(cfg.model, cfg.task, make_task(cfg.task), dtype="float32")
    assert source == str(tiny_qwen3_hub_dir) and type(model).__name__ == "Qwen3ForCausalLM"
    c = model.config
    # Qwen3-0.6B's shape: 16 query heads x head_dim 128 = 2 x width, 8 key/value heads (here
    # 4 x 32 = 2 x 64, and 2).
    assert (c.num_attention_heads * c.head_dim, c.num_key_value_heads) == (2 * c.hidden_size, 2)
    attn = model.model.layers[0].self_attn
    assert attn.q_norm.weight.shape == attn.k_norm.weight.shape == (c.head_dim,)
    assert attn.k_proj.out_features == c.num_key_value_heads * c.head_dim
    head, embed = model.lm_head.weight, model.model.embed_tokens.weight
    assert c.tie_word_embeddings is False and head is not embed and not torch.equal(head, embed)
    assert head.shape == (c.vocab_size, c.hidden_size) and c.vocab_size > len(tok)  # padded
    assert tok.chat_template and tok.eos_token == "<|im_end|>"


def _train(model_dir, tmp_path, math_small, *overrides: str):
    """Three steps, batches of 32 rollouts (groups of 4), at seed 1: there a few of the random
    policy's rollouts of step 2 earn a reward (the last number of random text matches a GSM8K
    answer), so that update has a gradient. Returns the metrics rows and the final model."""
    cfg, d = resolve(compose([
        f"model={model_dir}", *math_small, "model.chat_template=true", "schedule.max_steps=3",
        "schedule.batch_size=32", "generation.max_new_tokens=16", "eval.every=3", "seed=1",
        "algo.lr=1e-3", *overrides, f"run_dir={tmp_path / 'run'}",
    ]))  # fmt: skip
    assert run(cfg, d, tmp_path / "run")["status"] == "finished"
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss/loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(math.isfinite(r["loss/loss"]) and math.isfinite(r["loss/grad_norm"]) for r in rows)
    assert rows[1]["train/reward"] > 0 and rows[1]["loss/grad_norm"] > 0, "no learning signal"
    final, _ = load_pretrained(tmp_path / "run" / "final_model")
    assert type(final).__name__ == "Qwen3ForCausalLM"
    return rows, final


@pytest.mark.slow
def test_on_policy_micro_batched_steps_have_ratio_one_and_train_the_head_apart(
    tiny_qwen3_hub_dir, math_small, tmp_path
):
    rows, final = _train(
        tiny_qwen3_hub_dir, tmp_path, math_small,
        "buffer=on_policy", "buffer.capacity=32", "algo.micro_batch_size=12",  # 12 + 12 + 8
    )  # fmt: skip
    for r in rows:  # sampler and trainer log-probs of the same weights: rounding only
        assert r["loss/batch_size"] == 32 and r["buffer/batch_frac_fresh"] == 1
        assert abs(r["loss/ratio_min"] - 1) < 1e-5 and abs(r["loss/ratio_max"] - 1) < 1e-5, r
        assert r["loss/clip_frac"] == 0
    # The untied head is trained as its own matrix: both it and the embedding moved, apart.
    init, _ = load_pretrained(tiny_qwen3_hub_dir)
    d_head = final.lm_head.weight - init.lm_head.weight
    d_embed = final.model.embed_tokens.weight - init.model.embed_tokens.weight
    assert final.config.tie_word_embeddings is False
    assert final.lm_head.weight.data_ptr() != final.model.embed_tokens.weight.data_ptr()
    assert d_head.abs().max() > 0 and d_embed.abs().max() > 0
    assert not torch.allclose(d_head, d_embed)
    # The head moves in every row (a softmax over the vocabulary), the embedding only in rows
    # of tokens fed in at the step with a gradient (Adam leaves rows with no gradient alone).
    assert (d_head != 0).any(dim=1).all()
    assert not (d_embed != 0).any(dim=1).all()


@pytest.mark.slow
def test_fifo_replay_steps_reuse_rollouts_with_ratios_off_one(
    tiny_qwen3_hub_dir, math_small, tmp_path
):
    rows, _ = _train(
        tiny_qwen3_hub_dir, tmp_path, math_small,
        "buffer=fifo", "buffer.capacity=64", "schedule.reuse_ratio=2",  # R = 16, B = 32
    )  # fmt: skip
    assert [r["train/fresh_rollouts"] for r in rows] == [16, 16, 16]
    assert [r["buffer/size"] for r in rows] == [16, 32, 48]
    assert [r["loss/batch_size"] for r in rows] == [16, 32, 32]  # at most what it holds
    assert [r["buffer/batch_version_lag_max"] for r in rows] == [0, 1, 2]
    # Before any update every stored rollout is on-policy; after the step-2 update the replayed
    # ones are stale, and their importance ratios leave 1.
    assert abs(rows[1]["loss/ratio_max"] - 1) < 1e-5
    assert rows[2]["loss/ratio_max"] - rows[2]["loss/ratio_min"] > 1e-2


@pytest.mark.slow
def test_bench_qwen3_width_smoke(tiny_qwen3_hub_dir, tmp_path):
    """bench/qwen3_width.py at the tiny width, so that the full-width run cannot rot."""
    bench = Path(__file__).resolve().parents[2] / "bench" / "qwen3_width.py"
    out = subprocess.run(
        [sys.executable, str(bench), "--smoke", "--threads", "1", "--json", tmp_path / "r.json"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["config"] == TINY_QWEN3
    assert r["params"] == count_params(load_pretrained(tiny_qwen3_hub_dir)[0]) == 164_288
    assert "algo.micro_batch_size=2" in r["command"] and r["finite_loss"]
    assert [s["step"] for s in r["steps"]] == [1, 2]
    assert all(s["seconds_gen"] > 0 and s["seconds_train"] > 0 for s in r["steps"])
    assert r["peak_rss_gib"] > 0.1 and r["seconds_gen_per_step"] > 0
