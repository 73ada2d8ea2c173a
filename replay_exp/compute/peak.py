"""The matrix-product rate of a device, measured: what every MFU of the device check
(tests/gpu/test_gpu_check.py) and of bench/throughput.py is divided by."""

from __future__ import annotations

import time

import torch


def matmul_peak(device: str, dtype_name: str, n: int) -> dict:
    """FLOP/s of an n x n x n product after 3 warm-ups: on cuda the mean of 10 timed with CUDA
    events; on cpu the fastest of 10 (a shared CPU's other load only slows some of them)."""
    dtype = getattr(torch, dtype_name)
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=g)
    reps = 10
    for _ in range(3):
        a @ b
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            a @ b
        end.record()
        torch.cuda.synchronize()
        secs = start.elapsed_time(end) / 1e3 / reps
        del a, b
        torch.cuda.empty_cache()  # leave the device to the training runs
    else:
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - t)
        secs = min(times)
    return {"n": n, "dtype": dtype_name, "flops_per_s": 2 * n**3 / secs}
