"""generation.sampler=static: the same tokens as cached_loop from one seed (greedy and sampled,
on the embedded default and on random Qwen2 / Qwen3), the same EOS handling and padding, left
padding and chunking, bfloat16 autocast, the compiled step, the config and the entrypoint.

Log-prob tolerance. Both samplers compute the same logits in float32 with different attention
layouts (cached_loop: the cache's current length; static: L columns, the unwritten ones
masked), so the logits differ by float rounding: a few units of float32's eps (1.19e-7) times
the logits' magnitude. A log-prob, (logit - logsumexp) / T, moves by at most twice the largest
logit error over T: bound |d logp| <= K * eps * max|logit| / T. Measured (seeds 0-4, 128 rows,
temperatures 0, 0.7, 1, the three models here): |d logp| / (eps * max|logit| / T) <= 12. The
tests take K = 64, five times the measurement, which is still ~1e-5 for the embedded default's
logits (max |logit| ~ 11) and ~1e-6 for the random models'. Sampled tokens are drawn by
``torch.multinomial`` from the same generator state with probabilities that differ by ~1e-7: a
draw could flip only when its uniform lands within that of a bucket edge (odds ~1e-7 per
token), so the tokens are tested equal, not by a fraction.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.config.errors import ConfigError
from replay_exp.models import build_char_tokenizer, build_tiny_model, load_policy
from replay_exp.models.precision import compute_in
from replay_exp.models.shared_prefix import completion_logits
from replay_exp.rollout import HFGenerator, SamplingParams
from replay_exp.rollout.collect import tokenize_prompts
from replay_exp.rollout.sampler import sample_cached
from replay_exp.rollout.static import StaticSampler, sample_static
from replay_exp.runlog import read_metrics
from replay_exp.tasks import make_task

K = 64  # tolerance in float32 eps x max|logit| / T (module docstring)
EPS = torch.finfo(torch.float32).eps
SIZES = ["model.hidden_size=64", "model.num_layers=2", "model.intermediate_size=128"]


@pytest.fixture(scope="module")
def embedded():
    """The embedded default (shipped warm start: loaded, not trained) and its held-out prompts:
    16 distinct prompts of mixed lengths, each 4 times (a GRPO group)."""
    cfg = compose([])
    task = make_task(cfg.task)
    policy, tok, _ = load_policy(cfg.model, cfg.task, task)
    prompts = [p.prompt for p in task.eval_problems()[:16]]
    ids, mask = tokenize_prompts(tok, [p for p in prompts for _ in range(4)])
    return policy.eval(), tok, ids, mask


@pytest.fixture(scope="module", params=["embedded", "qwen2", "qwen3"])
def model(request, embedded):
    """(model, tokenizer, prompt ids, mask): the embedded default, or a random tiny Qwen2 /
    Qwen3 (q/k norms) on the same prompts."""
    policy, tok, ids, mask = embedded
    if request.param != "embedded":
        cfg = compose([f"model.arch={request.param}", *SIZES])
        policy = build_tiny_model(cfg.model, tok, seed=0).eval()
    return policy, tok, ids, mask


def _pair(model, ids, mask, params, seed, chunk_size=256):
    policy, tok = model[:2]
    gens = [HFGenerator(policy, tok.pad_token_id, tok.eos_token_id, chunk_size=chunk_size,
                        sampler=s) for s in ("cached_loop", "static")]  # fmt: skip
    return [g.generate(ids, mask, params, seed) for g in gens]


def _assert_same(a, b, policy, ids, mask, temperature):
    """Identical tokens, masks and finished flags; log-probs within the module's bound."""
    assert torch.equal(a.completion_ids_BxC, b.completion_ids_BxC)
    assert torch.equal(a.completion_mask_BxC, b.completion_mask_BxC)
    assert torch.equal(a.finished_B, b.finished_B)
    with torch.no_grad():
        logits = completion_logits(policy, ids, mask, a.completion_ids_BxC, a.completion_mask_BxC)
    tol = K * EPS * logits.abs().max().item() / (temperature or 1.0)
    diff = (a.behaviour_logp_BxC - b.behaviour_logp_BxC).abs().max().item()
    assert diff <= tol, f"|d logp| = {diff:.3g} > {tol:.3g}"


def test_greedy_equals_cached_loop(model):
    policy, tok, ids, mask = model
    a, b = _pair(model, ids, mask, SamplingParams(0.0, 1.0, 8), seed=0)
    _assert_same(a, b, policy, ids, mask, 0.0)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_same_seed_same_draws_as_cached_loop(model, temperature, top_p):
    policy, tok, ids, mask = model
    params = SamplingParams(temperature, top_p, 8)
    for seed in (3, 4):
        a, b = _pair(model, ids, mask, params, seed)
        _assert_same(a, b, policy, ids, mask, temperature)
    assert not torch.equal(
        a.completion_ids_BxC, _pair(model, ids, mask, params, 5)[1].completion_ids_BxC
    )


def test_eos_stop_and_padding_identical(embedded):
    """The raw loops (before HFGenerator's masking): pad and log-prob 0 after EOS, the same stop
    step when every row has ended (fewer columns than max_new_tokens), or max_new_tokens."""
    policy, tok, ids, mask = embedded
    eos, pad = tok.eos_token_id, tok.pad_token_id
    for max_new in (3, 12):  # rows cut by max_new_tokens; every row ends before it
        for temperature in (0.0, 1.0):
            params = SamplingParams(temperature, 1.0, max_new)
            a_ids, a_lp = sample_cached(policy, ids, mask, params,
                                        torch.Generator().manual_seed(7), eos, pad)  # fmt: skip
            b_ids, b_lp = sample_static(policy, ids, mask, params,
                                        torch.Generator().manual_seed(7), eos, pad)  # fmt: skip
            assert torch.equal(a_ids, b_ids)
            assert torch.equal(a_lp == 0, b_lp == 0)
            ended = (a_ids == eos).cumsum(1) - (a_ids == eos).long() > 0  # after the first EOS
            assert (b_ids[ended] == pad).all() and (b_lp[ended] == 0).all()
            if max_new == 3:
                assert a_ids.shape[1] == 3 and not (a_ids == eos).any(1).all()
            else:
                assert (a_ids == eos).any(1).all() and a_ids.shape[1] < max_new


def test_left_padding_each_row_as_if_alone(embedded):
    """Mixed prompt lengths in one batch (left padding): every row's greedy completion is the
    one it gets alone, unpadded."""
    policy, tok, ids, mask = embedded
    assert mask.sum(1).min() < mask.shape[1]  # some rows are padded
    params = SamplingParams(0.0, 1.0, 8)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    batch, _ = sample_static(policy, ids, mask, params, None, eos, pad)
    for i in range(0, ids.shape[0], 4):
        row_ids, row_mask = ids[i : i + 1, mask[i]], mask[i : i + 1, mask[i]]
        alone, _ = sample_static(policy, row_ids, row_mask, params, None, eos, pad)
        n = alone.shape[1]
        assert torch.equal(batch[i, :n], alone[0]), i
        assert (batch[i, n:] == pad).all()


def test_chunks_continue_the_generator_stream(model):
    """chunk_size splits the batch; the draws continue one generator across chunks, exactly as
    cached_loop's, and greedy does not depend on the split."""
    policy, tok, ids, mask = model
    a, b = _pair(model, ids, mask, SamplingParams(1.0, 1.0, 6), seed=2, chunk_size=24)
    _assert_same(a, b, policy, ids, mask, 1.0)
    greedy = SamplingParams(0.0, 1.0, 6)
    _, whole = _pair(model, ids, mask, greedy, seed=0)
    _, split = _pair(model, ids, mask, greedy, seed=0, chunk_size=24)
    assert torch.equal(whole.completion_ids_BxC, split.completion_ids_BxC)


def test_bfloat16_autocast(embedded):
    """Under the compute dtype's autocast hooks: the prompt's tokens at float32 keys (RoPE's
    output) and bfloat16 values in the static cache, and the draws of cached_loop (bfloat16
    rounding is ~4e-3 relative: log-probs are compared at that scale)."""
    policy, tok, ids, mask = embedded
    policy = compute_in(build_tiny_model(compose(SIZES).model, tok, seed=1), "bfloat16").eval()
    sampler = StaticSampler(policy)
    params = SamplingParams(1.0, 1.0, 6)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    a_ids, a_lp = sample_cached(
        policy, ids, mask, params, torch.Generator().manual_seed(1), eos, pad
    )
    b_ids, b_lp = sampler.sample(ids, mask, params, torch.Generator().manual_seed(1), eos, pad)
    assert torch.equal(a_ids, b_ids)
    assert (a_lp - b_lp).abs().max() < 0.05
    cache = StaticSampler(policy, compile=True).static_cache(*_prefill_cache(policy, ids, mask))
    layer = cache.layers[0]
    assert (layer.keys.dtype, layer.values.dtype) == (torch.float32, torch.bfloat16)


def _prefill_cache(policy, ids, mask):
    from replay_exp.models.shared_prefix import prefill

    with torch.no_grad():
        _, cache, _ = prefill(policy, ids, mask)
    return cache, ids.shape[0], ids.shape[1] + 32


def test_refusals():
    tok = build_char_tokenizer()
    policy = build_tiny_model(compose(SIZES).model, tok, seed=0)
    with pytest.raises(ValueError, match="generation.compile=true compiles the static"):
        HFGenerator(policy, tok.pad_token_id, tok.eos_token_id, compile=True)
    # A sliding-window layer would need its own prefix copy: refused, not mis-sampled.
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, use_sliding_window=True,
        sliding_window=4, max_window_layers=0,
    )  # fmt: skip
    qwen = Qwen2ForCausalLM(config).eval()
    ids, mask = tokenize_prompts(tok, ["12+345=", "7+8="])
    with pytest.raises(ValueError, match="supports full-attention models only"):
        sample_static(qwen, ids, mask, SamplingParams(0.0, 1.0, 4), None, 2, 0)


def test_resolve_refuses_static_on_a_sliding_window_checkpoint(tmp_path):
    """A saved model with a sliding-window layer is refused by resolve() in one line, before
    any compute (not at the first generation)."""
    tok = build_char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, use_sliding_window=True,
        sliding_window=4, max_window_layers=0, max_position_embeddings=64,
    )  # fmt: skip
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    overrides = ["model=pretrained", f"model.pretrained={tmp_path / 'm'}", "model.dtype=float32"]
    resolve(compose(overrides))  # cached_loop: fine
    with pytest.raises(ConfigError, match="generation.sampler=static needs full attention"):
        resolve(compose([*overrides, "generation.sampler=static"]))


def test_resolve_accepts_static_and_refuses_an_unknown_sampler():
    cfg, _ = resolve(compose(["generation.sampler=static", "generation.compile=true"]))
    assert cfg.generation.sampler == "static" and cfg.generation.compile is True
    with pytest.raises(ConfigError) as err:
        resolve(compose(["generation.sampler=bogus"]))
    msg = str(err.value)
    assert msg.startswith("generation.sampler=bogus is unknown") and "'static'" in msg
    assert "\n" not in msg


@pytest.mark.slow
def test_compiled_step_greedy_equals_cached_loop(embedded):
    """generation.compile=true on CPU (inductor, gcc): greedy tokens of cached_loop, compiled
    once per shape (a second call and a second chunk of the same shape compile nothing), and
    under bfloat16 autocast (the compiled step enters the autocast the hooks would)."""
    from torch._dynamo.utils import counters

    policy, tok, ids, mask = embedded
    params = SamplingParams(0.0, 1.0, 8)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    ref = HFGenerator(policy, tok.pad_token_id, eos).generate(ids, mask, params, seed=0)
    gen = HFGenerator(policy, tok.pad_token_id, eos, chunk_size=32, sampler="static", compile=True)
    try:
        out = gen.generate(ids, mask, params, seed=0)
    except Exception as e:  # noqa: BLE001 - only a missing toolchain may skip
        if "InductorError" in type(e).__name__ or "CppCompileError" in repr(e):
            pytest.skip(f"inductor cannot compile on this machine: {str(e)[:200]}")
        raise
    graphs = counters["stats"]["unique_graphs"]
    again = gen.generate(ids, mask, params, seed=0)
    assert counters["stats"]["unique_graphs"] == graphs  # 2 chunks x 2 calls, one shape
    assert len(gen._static._graphs) == 1
    for g in (out, again):
        _assert_same(ref, g, policy, ids, mask, 0.0)
    low = compute_in(build_tiny_model(compose(SIZES).model, tok, seed=1), "bfloat16").eval()
    a_ids, _ = sample_cached(low, ids, mask, params, None, eos, pad)
    b_ids, _ = StaticSampler(low, compile=True).sample(ids, mask, params, None, eos, pad)
    assert (a_ids == b_ids).float().mean() > 0.95  # bfloat16 rounding may flip a near tie


def _train(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "WANDB_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, "-m", "replay_exp.train", *args],
        cwd=cwd, capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip


ENTRY = ["debug=smoke", "schedule.max_steps=1", "eval.every=1", "eval.n_problems=8",
         "eval.n_samples=2", "eval.pass_k=[1,2]", "logger.progress=false", "threads=1",
         "device=cpu", "checkpoint.every=null"]  # fmt: skip


def test_entrypoint_runs_with_the_static_sampler(tmp_path):
    """``python -m replay_exp.train generation.sampler=static``: one step of the embedded
    default finishes and logs what cached_loop logs at step 0 (the same evaluation draws)."""
    metrics = {}
    for sampler in ("static", "cached_loop"):
        run_dir = tmp_path / sampler
        proc = _train([*ENTRY, f"generation.sampler={sampler}", f"run_dir={run_dir}"], tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert '"status": "finished"' in (run_dir / "summary.json").read_text()
        metrics[sampler] = read_metrics(run_dir / "metrics.jsonl")
    step0 = [{k: v for k, v in m[0].items() if k.startswith("eval/")} for m in metrics.values()]
    assert step0[0] == step0[1] and step0[0]
    assert metrics["static"][1]["train/reward"] == metrics["cached_loop"][1]["train/reward"]
