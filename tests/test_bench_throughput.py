"""bench/throughput.py's FLOP and MFU arithmetic against hand-derived values (its --smoke run is
in tests/test_bench.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from replay_exp.compute.ledger import flop_params
from replay_exp.models.tiny_hub import QWEN3_0_6B

_path = Path(__file__).resolve().parents[1] / "bench" / "throughput.py"
_spec = importlib.util.spec_from_file_location("bench_throughput", _path)
throughput = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(throughput)


def test_update_flops_and_mfu_by_hand():
    # N = 10, 2 layers, attention width 4, rows of T = 3 and 5 tokens.
    # forward: T=3: 2*10*3 + 2*2*4*3^2 = 60 + 144 = 204; T=5: 2*10*5 + 2*2*4*5^2 = 100 + 400 = 500
    # -> 704; an update is 3 forwards = 2112 (4 with one extra whole-batch forward: 2816).
    lengths = torch.tensor([3, 5])
    assert throughput.update_flops(10, 2, 4, lengths) == 2112
    assert throughput.update_flops(10, 2, 4, lengths, extra_forwards=1) == 2816
    # 2112 FLOPs in 2 s on a 1000 FLOP/s device: 1056 FLOP/s = 105.6 % of the peak.
    assert throughput.mfu(2112, 2.0, 1000.0) == pytest.approx(1.056)
    assert throughput.mfu(2112, 2.0, None) is None


def test_qwen3_0_6b_update_flops_by_hand():
    with torch.device("meta"):  # the shape only, no memory
        model = Qwen3ForCausalLM(Qwen3Config(**QWEN3_0_6B))
    # Per layer: q 1024x2048 + k 1024x1024 + v 1024x1024 + o 2048x1024 = 6,291,456; q/k norms
    # 2 x 128; MLP 3 x 1024x3072 = 9,437,184; 2 layer norms 2 x 1024 -> 15,730,944. 28 layers
    # = 440,466,432, + final norm 1,024 + untied lm_head 151,936 x 1024 = 155,582,464
    # -> N = 596,049,920 (the input embedding, 155,582,464 more, does no matmul work).
    n = flop_params(model)
    assert n == 596_049_920
    assert throughput.attention_width(model.config) == 16 * 128
    # The default L=1024 step: 64 rows of T = 256 + 1024 = 1280 tokens. Per row forward:
    # 2 N T = 1,525,887,795,200 and 2 x 28 x 2048 x 1280^2 = 187,904,819,200 -> 1,713,792,614,400;
    # x 3 (forward + backward) x 64 rows = 329,048,181,964,800 FLOPs per update.
    flops = throughput.update_flops(n, 28, 2048, torch.full((64,), 1280))
    assert flops == 329_048_181_964_800
    # One such update per second on an H100 SXM (989 TFLOP/s bf16 dense): 33.27 % MFU.
    peak = throughput.datasheet_peak("NVIDIA H100 80GB HBM3")
    assert throughput.mfu(flops, 1.0, peak) == pytest.approx(0.332708, abs=1e-6)


def test_datasheet_peaks():
    assert throughput.datasheet_peak("NVIDIA H100 80GB HBM3") == 989e12
    assert throughput.datasheet_peak("NVIDIA H200") == 989e12
    assert throughput.datasheet_peak("NVIDIA H100 PCIe") is None  # a lower peak, not listed
    assert throughput.datasheet_peak("NVIDIA A100-SXM4-80GB") is None
