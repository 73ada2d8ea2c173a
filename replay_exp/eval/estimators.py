"""Pure estimators and the per-problem evaluation record: numpy and math only.

Shared by the generation side (``replay_exp.eval.evaluate`` writes what the trainer logs) and the
analysis (``replay_exp.analysis.stats`` reads it back), so that reading a sweep never imports
torch, transformers or the generation stack. Imports nothing of the package
(tests/test_layering.py checks both).
"""

from __future__ import annotations

from math import comb

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k)
    (Chen et al., 2021). Requires 1 <= k <= n."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_at_k_per_problem(n: int, correct, k: int) -> np.ndarray:
    """:func:`pass_at_k` of every problem: ``correct[j]`` of ``n`` samples correct -> [J]."""
    return np.array([pass_at_k(n, int(c), k) for c in correct], dtype=float)


def encode_details(details: dict) -> dict:
    """Per-problem results as compact strings for ``eval_details.jsonl``: ``pass1`` as packed
    bits in hex, ``n_correct`` as one byte per problem in hex (two if a count exceeds 255),
    and the counts ``n_problems`` and ``n_samples``."""
    counts = np.asarray(details["n_correct"])
    dtype = np.uint8 if counts.max(initial=0) < 256 else np.dtype("<u2")
    return {
        "n_problems": int(len(details["pass1"])),
        "n_samples": int(details["n_samples"]),
        "pass1": np.packbits(np.asarray(details["pass1"], dtype=bool)).tobytes().hex(),
        "n_correct": counts.astype(dtype).tobytes().hex(),
        "n_correct_bytes": int(np.dtype(dtype).itemsize),
    }


def decode_details(row: dict) -> dict[str, np.ndarray]:
    """The inverse of :func:`encode_details` (``n_samples`` stays in the row)."""
    n = int(row["n_problems"])
    bits = np.unpackbits(np.frombuffer(bytes.fromhex(row["pass1"]), dtype=np.uint8))[:n]
    dtype = np.uint8 if int(row.get("n_correct_bytes", 1)) == 1 else np.dtype("<u2")
    counts = np.frombuffer(bytes.fromhex(row["n_correct"]), dtype=dtype).astype(np.int64)
    return {"pass1": bits.astype(bool), "n_correct": counts}
