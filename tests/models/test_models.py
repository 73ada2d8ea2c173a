"""Char tokenizer round trips; tiny models save/load with from_pretrained; warm start caches."""

from __future__ import annotations

import pytest
import torch

from replay_exp.config.composition import compose
from replay_exp.models import (
    build_char_tokenizer,
    build_tiny_model,
    load_policy,
    load_tokenizer,
    warm_start,
)
from replay_exp.models.tiny import load_pretrained
from replay_exp.tasks import make_task


def test_char_tokenizer_round_trip_and_left_padding(tmp_path):
    tok = build_char_tokenizer()
    enc = tok(["12+3=", "1+1="], padding=True)
    assert enc["input_ids"][1][0] == tok.pad_token_id  # left padding
    assert enc["input_ids"][0][0] == tok.bos_token_id
    tok.save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path)
    ids = again("ab c, 1+2=3")["input_ids"]
    assert len(ids) == 1 + len("ab c, 1+2=3")  # one token per char, spaces kept
    assert again.decode(ids, skip_special_tokens=True) == "ab c, 1+2=3"


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_tiny_model_from_config_saves_and_loads_with_from_pretrained(arch, tmp_path):
    mcfg = compose([f"model.arch={arch}"]).model
    tok = build_char_tokenizer()
    model = build_tiny_model(mcfg, tok, seed=0)
    assert type(model).__name__.lower().startswith(arch)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, tok2 = load_pretrained(tmp_path)
    for p0, p1 in zip(model.parameters(), loaded.parameters(), strict=True):
        assert torch.equal(p0, p1)
    # Qwen2 + AutoTokenizer would drop the space token: ours must keep it.
    assert tok2.decode(tok2("a b")["input_ids"], skip_special_tokens=True) == "a b"
    # Same seed, same init.
    again = build_tiny_model(mcfg, tok, seed=0)
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True)
    )


def test_pretrained_path_is_used_as_is(tmp_path):
    cfg = compose([f"model.pretrained={tmp_path}"])
    tok = build_char_tokenizer()
    build_tiny_model(cfg.model, tok, seed=7).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model, _, source = load_policy(cfg.model, cfg.task, make_task(cfg.task))
    assert source == str(tmp_path)
    ref = build_tiny_model(cfg.model, tok, seed=7)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters(), strict=True))


def test_warm_start_is_cached_by_a_hash_of_its_inputs(tmp_path, monkeypatch):
    over = [
        f"model.warm_start.cache_dir={tmp_path}", "model.warm_start.steps=5",
        "model.hidden_size=32", "model.num_layers=1", "model.intermediate_size=64",
    ]  # fmt: skip
    cfg = compose(over)
    task = make_task(cfg.task)
    m1, _, path1 = load_policy(cfg.model, cfg.task, task)

    def no_training(*args, **kwargs):
        raise AssertionError("the second load trained instead of reading the cache")

    monkeypatch.setattr(warm_start, "supervised_train", no_training)
    m2, _, path2 = load_policy(cfg.model, cfg.task, task)
    assert path1 == path2
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters(), strict=True))
    init = build_tiny_model(cfg.model, build_char_tokenizer(), seed=0)
    assert not all(
        torch.equal(a, b) for a, b in zip(m1.parameters(), init.parameters(), strict=True)
    )
    # Anything that changes the result changes the key; the cache dir itself does not.
    monkeypatch.undo()
    cfg3 = compose([*over, "model.warm_start.lr=2e-3"])
    assert load_policy(cfg3.model, cfg3.task, task)[2] != path1
    assert len([p for p in tmp_path.iterdir() if not p.name.startswith(".")]) == 2
