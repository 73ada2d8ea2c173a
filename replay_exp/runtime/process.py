"""What every training process sets before it builds anything: torch's thread count and, with
``deterministic=true``, deterministic kernels.

Called by the one process (``replay_exp.train``) and by every rank of ``runtime=distributed``
(``replay_exp.runtime.launch.run_rank``), before the policy is loaded.

``deterministic=true`` (docs/real-models.md, "Determinism"):

- ``torch.use_deterministic_algorithms(True)``: ops with a deterministic implementation use it
  (on CUDA the ``index_add_`` / ``scatter_add_`` / embedding backwards, which otherwise add
  with atomics in whatever order the threads finish), and an op without one raises instead of
  drifting silently;
- ``CUBLAS_WORKSPACE_CONFIG=:4096:8``: cuBLAS (CUDA >= 10.2) is deterministic only with a fixed
  workspace; it must be set before the first cuBLAS handle, hence here, first thing;
- cuDNN: deterministic algorithms, no autotuning (``benchmark``), which picks kernels by timing.

On CPU our kernels are deterministic already (the shared-prompt broadcast uses ``index_select``:
bench/determinism_cost.py); the switch changes nothing there but makes an op without a
deterministic implementation fail loudly.
"""

from __future__ import annotations

import os

import torch

CUBLAS_WORKSPACE = ":4096:8"


def set_up_process(threads: int, deterministic: bool) -> None:
    """torch's CPU threads, and deterministic kernels if asked (module docstring)."""
    torch.set_num_threads(threads)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = False
