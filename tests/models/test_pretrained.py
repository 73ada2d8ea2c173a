"""Hub-style models from a local directory: the tiny hub fixture, from_pretrained loading,
untying, dtype, gradient checkpointing, the `model=<dir>` shorthand and its errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from replay_exp.config.composition import compose, expand_model_shorthand
from replay_exp.config.errors import ConfigError
from replay_exp.config.schemas import CONF_DIR
from replay_exp.models import load_policy
from replay_exp.models.tiny import ModelLoadError, load_pretrained
from replay_exp.models.tiny_hub import save_tiny_hub_model
from replay_exp.tasks import make_task


def test_tiny_hub_model_is_deterministic_and_reads_any_text(tiny_hub_dir, tmp_path):
    again = save_tiny_hub_model(tmp_path / "again")
    for name in ("tokenizer.json", "config.json"):
        assert (again / name).read_text() == (tiny_hub_dir / name).read_text()
    a, tok = load_pretrained(tiny_hub_dir)
    b, _ = load_pretrained(again)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    text = "Ünïcode ≥ 5: what is \\frac{1}{2} + $3? \\boxed{3.5}"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert (tok.pad_token, tok.eos_token, tok.bos_token) == ("<|endoftext|>", "<|im_end|>", None)
    assert tok.chat_template


def _mcfg(tiny_hub_dir, **kw):
    cfg = compose([f"model={tiny_hub_dir}", *[f"model.{k}={v}" for k, v in kw.items()]])
    return cfg.model, cfg.task


def test_load_policy_as_saved_untied_dtype_and_checkpointing(tiny_hub_dir):
    mcfg, tcfg = _mcfg(tiny_hub_dir)
    assert mcfg.tie_word_embeddings is None  # model=pretrained: as saved
    task = make_task(tcfg)
    model, tok, source = load_policy(mcfg, tcfg, task, dtype="float32")
    assert source == str(tiny_hub_dir)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as saved
    assert not model.is_gradient_checkpointing

    mcfg, _ = _mcfg(tiny_hub_dir, tie_word_embeddings="false", gradient_checkpointing="true")
    untied, _, _ = load_policy(mcfg, tcfg, task, dtype="bfloat16")
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight
    assert torch.equal(untied.lm_head.weight, untied.model.embed_tokens.weight)  # a copy
    assert untied.config.tie_word_embeddings is False and untied.is_gradient_checkpointing
    assert untied.lm_head.weight.dtype == torch.bfloat16
    n_tied = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for p in untied.parameters()) == n_tied + untied.lm_head.weight.numel()


def test_load_errors_are_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with pytest.raises(ModelLoadError) as err:
        load_pretrained(tmp_path)
    assert str(err.value).startswith(f"model.pretrained={tmp_path} could not be loaded: ")
    assert "\n" not in str(err.value)


def test_model_shorthand(tiny_hub_dir):
    assert expand_model_shorthand(["model=tiny", "seed=1"]) == ["model=tiny", "seed=1"]
    assert expand_model_shorthand([f"model={tiny_hub_dir}"]) == [
        "model=pretrained", f"model.pretrained='{tiny_hub_dir}'", "model.name=tiny-qwen2",
    ]  # fmt: skip
    assert expand_model_shorthand(["model=Qwen/Qwen3-0.6B"])[1:] == [
        "model.pretrained='Qwen/Qwen3-0.6B'", "model.name=Qwen3-0.6B",
    ]  # fmt: skip
    assert expand_model_shorthand(["model=tiny,tiny_qwen2"]) == ["model=tiny,tiny_qwen2"]
    names = sorted(p[:-5] for p in os.listdir(f"{CONF_DIR}/model"))
    with pytest.raises(ConfigError) as err:
        expand_model_shorthand(["model=qwen3_06b"])
    assert str(err.value) == (
        f"model=qwen3_06b is neither a model config (one of {names}) nor a local model "
        "directory nor a hub id (org/name)"
    )
    cfg = compose([f"model={tiny_hub_dir}"])
    assert OmegaConf.select(cfg, "model.pretrained") == str(tiny_hub_dir)


def test_cli_unknown_model_is_one_line_and_writes_nothing(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "replay_exp.train", "model=./no/such/model",
         f"output_root={tmp_path / 'runs'}"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "config error: model=./no/such/model is neither a model config (one of "
        f"{sorted(p[:-5] for p in os.listdir(f'{CONF_DIR}/model'))}) nor a local "
        "model directory nor a hub id (org/name)"
    ]
    assert list(tmp_path.iterdir()) == []


def test_an_untied_head_learns_apart_from_the_embedding(tiny_hub_dir):
    from replay_exp.rollout import HFGenerator, SamplingParams
    from replay_exp.rollout.collect import generate_rollouts
    from replay_exp.tasks import Problem
    from replay_exp.update import policy_update

    mcfg, tcfg = _mcfg(tiny_hub_dir, tie_word_embeddings="false")
    policy, tok, _ = load_policy(mcfg, tcfg, make_task(tcfg), dtype="float32")
    embed0 = policy.model.embed_tokens.weight.detach().clone()
    gen = HFGenerator(policy, tok.pad_token_id, tok.eos_token_id)
    batch = generate_rollouts(
        gen, tok, make_task(tcfg), [Problem("What is 1+1?", "2")], 4,
        SamplingParams(1.0, 1.0, 4), seed=0, step=0, first_uid=0, first_group=0,
    )  # fmt: skip
    batch.advantage_B = torch.tensor([1.0, -1.0, 0.5, -0.5])  # a learning signal
    algo = compose([]).algo
    algo.lr = 1e-2
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    policy_update(policy, opt, batch, algo, 1.0, 4)
    head, embed = policy.lm_head.weight, policy.model.embed_tokens.weight
    assert not torch.equal(head, embed)  # both moved, differently
    assert not torch.equal(embed, embed0)


def test_chat_template_is_checked_at_resolve_for_local_dirs(tiny_hub_dir, tmp_path):
    from replay_exp.config.derive import resolve

    cfg, _ = resolve(compose([f"model={tiny_hub_dir}", "model.chat_template=true"]))
    assert cfg.model.chat_template
    plain = tmp_path / "no-template"
    model, tok = load_pretrained(tiny_hub_dir)
    tok.chat_template = None
    model.save_pretrained(plain)
    tok.save_pretrained(plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(ConfigError) as err:
        resolve(compose([f"model={plain}", "model.chat_template=true"]))
    assert str(err.value) == (
        f"model.chat_template=true, but the tokenizer of model.pretrained={plain} has no chat "
        "template; set model.chat_template=false"
    )
