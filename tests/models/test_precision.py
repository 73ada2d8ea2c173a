"""Mixed precision (replay_exp/models/precision.py): float32 master weights keep the Adam steps
that pure bfloat16 weights round away, and the entrypoint trains in bfloat16 compute from the
shipped warm start.

The tolerance of the update test, derived. On Adam's first step the bias corrections cancel
(m_hat = g, v_hat = g^2), so each weight moves by -lr * g / (|g| + eps), i.e. -lr * sign(g)
wherever |g| >> eps = 1e-8. Two gradients that agree in sign give the same update; each entry
whose sign flips turns a +lr into a -lr. With f the fraction of flipped entries the share of
the float32 update that bfloat16 compute keeps, <d_mp, d_ref> / |d_ref|^2, is 1 - 2f, and the
norm is unchanged. bfloat16 rounds each product's inputs to 8 bits (relative error 2^-9 per
rounding): a sign can flip only where |g| is within that accumulated error (~1 %) of zero, a
few per mille of the entries of a gradient centred on 0. We allow f <= 2.5 %: kept >= 0.95
(measured here: f = 0.29 %, kept 0.9975, at lr 6e-5, 1e-6 and 6.8e-8 alike).

Pure bfloat16 weights: a weight w moves only if lr exceeds half its spacing, 2^(floor(log2|w|)
- 8); at lr 1e-6 that is |w| < 2^-11 = 4.9e-4. For N(0, 0.02) entries (the init) that share is
2 * 4.9e-4 / (0.02 * sqrt(2 pi)) = 2.0 %, and the norm weights (1.0) never move: we assert
that under 5 % of the entries moved and under 10 % of the update is kept (measured: 2.1 %
moved, 2.9 % kept; the issue's measurement on a 0.02-scale matrix: 2 %).
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.config.errors import ConfigError
from replay_exp.models import build_char_tokenizer
from replay_exp.models.precision import compute_dtype, compute_in

LR = 1e-6
# bench/master_weights.py: the measurement itself (one AdamW step three ways), also run on CUDA
# by the device check.
_spec = importlib.util.spec_from_file_location(
    "master_weights", Path(__file__).resolve().parents[2] / "bench" / "master_weights.py"
)
mw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mw)


@pytest.fixture(scope="module")
def setup():
    return mw.setup()


def test_master_weights_keep_the_update_pure_bf16_loses_it(setup):
    algo, model, batch, C = setup
    ref = mw.adam_step(mw.prepared(model, "float32"), algo, batch, C, LR)
    mixed = mw.prepared(model, "master_bf16")
    seen = []
    probe = mixed.model.layers[0].mlp.down_proj.register_forward_hook(
        lambda mod, args, out: seen.append(out.dtype)
    )
    mp = mw.adam_step(mixed, algo, batch, C, LR)
    probe.remove()
    pure = mw.adam_step(mw.prepared(model, "pure_bf16"), algo, batch, C, LR)

    assert set(seen) == {torch.bfloat16}, "the mixed-precision forward did not compute in bf16"
    assert all(p.dtype == torch.float32 for p in mixed.parameters())
    assert not torch.equal(mp, ref), "bf16 compute gave float32's update to the bit"
    assert mw.kept(mp, ref) >= 0.95  # 1 - 2f with f <= 2.5 % (module docstring)
    assert abs(float(mp.norm() / ref.norm()) - 1) <= 0.05
    assert float((ref != 0).float().mean()) > 0.99  # float32 moves (nearly) every entry
    assert float((pure != 0).float().mean()) < 0.05
    assert mw.kept(pure, ref) < 0.10


def test_compute_in_float32_adds_nothing_and_copies_keep_the_setting(setup):
    _, model, _, _ = setup
    plain = compute_in(copy.deepcopy(model), "float32")
    assert not plain._forward_pre_hooks and not plain._forward_hooks
    assert compute_dtype(plain) == torch.float32
    mixed = compute_in(copy.deepcopy(model), "bfloat16")
    twin = copy.deepcopy(mixed)  # a generator's private copy, FSDP's evaluated copy
    assert compute_dtype(twin) == torch.bfloat16
    ids = torch.tensor([[1, 5, 6, 7]])
    with torch.no_grad():
        assert torch.equal(mixed(input_ids=ids).logits, twin(input_ids=ids).logits)
        assert not torch.equal(mixed(input_ids=ids).logits, plain(input_ids=ids).logits)
    assert all(v.dtype == torch.float32 for v in twin.state_dict().values())
    compute_in(mixed, "float32")  # undone: float32's forward again, to the bit
    with torch.no_grad():
        assert torch.equal(mixed(input_ids=ids).logits, plain(input_ids=ids).logits)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.dtype=float16"], "needs a loss scale"),
        (["model.dtype=bfloat16", "model.param_dtype=float16"], "model.param_dtype=float16"),
        (["model.save_dtype=int8"], "model.save_dtype=int8 is unknown"),
    ],
)
def test_precision_settings_refused_at_resolve(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve(compose(overrides))


def test_pure_bf16_is_allowed_with_a_warning(caplog):
    with caplog.at_level("WARNING", logger="replay_exp"):
        _, d = resolve(compose(["model.dtype=bfloat16", "model.param_dtype=bfloat16"]))
    assert (d.dtype, d.param_dtype) == ("bfloat16", "bfloat16")
    assert "Adam step below its resolution is lost" in caplog.text


def test_entrypoint_in_bf16_starts_from_the_shipped_warm_start_and_moves_like_fp32(
    tmp_path, caplog
):
    """The embedded default in bfloat16 compute at lr 1e-6: the shipped warm start (no
    retraining: a float32 recipe key for every dtype), final_model in float32, and its weights
    moved like the float32 run's (same seed; the two runs sample slightly different rollouts,
    so the updates are compared by direction and size, not entry by entry)."""
    from replay_exp.models import load_pretrained
    from replay_exp.models.warm_start import shipped_warm_start
    from replay_exp.train import run

    common = ["schedule.max_steps=2", "eval.n_problems=16", "algo.lr=1e-6", "threads=1"]
    moved = {}
    for dtype in ("float32", "bfloat16"):
        cfg, d = resolve(compose([*common, f"model.dtype={dtype}", f"run_dir={tmp_path / dtype}"]))
        caplog.clear()
        with caplog.at_level("INFO"):
            run(cfg, d, tmp_path / dtype)
        assert "warm start: shipped with the package" in caplog.text
        final = tmp_path / dtype / "final_model"
        assert json.loads((final / "config.json").read_text())["dtype"] == "float32"
        start = shipped_warm_start(cfg.model, cfg.task, build_char_tokenizer())
        w0 = load_pretrained(start)[0].state_dict()
        w1 = load_pretrained(final)[0].state_dict()
        assert all(w1[k].dtype == torch.float32 for k in w1)
        moved[dtype] = torch.cat([(w1[k] - w0[k]).flatten() for k in w0])
    ref, mp = moved["float32"], moved["bfloat16"]
    # Two Adam steps of ~lr per entry each: most entries move in both runs.
    assert float((mp != 0).float().mean()) > 0.9
    assert 0.8 < float(mp.norm() / ref.norm()) < 1.25
    assert float(torch.dot(mp, ref) / (mp.norm() * ref.norm())) > 0.5
