"""Shared fixtures: fast overrides that make a full training run take seconds."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

GSM8K = Path(__file__).parent / "fixtures" / "math" / "gsm8k.jsonl"


def fast_overrides(tmp_path) -> list[str]:
    """A 1-digit addition task and a smaller model, warm-started for a few seconds (cached in
    ``tmp_path``), so end-to-end tests see non-zero rewards and real gradients."""
    return [
        "task.n_digits=1",
        "task.eval_fraction=0.2",
        "task.n_eval=8",
        "task.demo_carry_drop=0.0",
        "model.hidden_size=64",
        "model.num_layers=2",
        "model.intermediate_size=128",
        "model.warm_start.steps=60",
        "model.warm_start.lr=3e-3",
        f"model.warm_start.cache_dir={tmp_path / 'cache'}",
        "schedule.batch_size=16",
        "algo.group_size=4",
        "buffer.capacity=32",
        "eval.n_samples=4",
        "eval.pass_k=[1,4]",
        "eval.every=2",
        "logger.progress=false",
        "threads=1",
        "device=cpu",
    ]


def default_overrides(tmp_path) -> list[str]:
    """The embedded default itself (shipped warm start, default model, sizes and thread count)
    cut to seconds, with reuse 2 so that replay batches scatter the rows of a prompt: the setting
    determinism and resume are tested at (the small model of :func:`fast_overrides` runs every
    kernel on its serial path, where thread-order effects cannot show)."""
    return [
        "schedule.reuse_ratio=2",
        "task.n_eval=64",
        "eval.sampled_problems=16",
        "eval.every=3",
        "logger.progress=false",
        f"model.warm_start.cache_dir={tmp_path / 'cache'}",
    ]


@pytest.fixture
def math_small() -> list[str]:
    """Two steps of a hub-style model (``model=<dir>``) on the GSM8K-format fixture file, with
    short completions and small batches: seconds on CPU for the tiny hub models below."""
    return [
        "task=gsm8k", f"task.path={GSM8K}", "task.n_eval=2", "generation.max_new_tokens=12",
        "schedule.batch_size=8", "algo.group_size=4", "buffer.capacity=16",
        "schedule.max_steps=2", "eval.every=2", "eval.n_samples=2", "eval.pass_k=[1,2]",
        "logger.progress=false", "threads=1", "device=cpu", "checkpoint.every=null",
    ]  # fmt: skip


@pytest.fixture
def default_small(tmp_path):
    return default_overrides(tmp_path)


@pytest.fixture
def fast(tmp_path):
    return fast_overrides(tmp_path)


@pytest.fixture(scope="session")
def fast_session(tmp_path_factory):
    """:func:`fast_overrides` for session-scoped fixtures (one warm-start cache per session)."""
    return fast_overrides(tmp_path_factory.mktemp("fast"))


@pytest.fixture(scope="session")
def tiny_hub_dir(tmp_path_factory):
    """A tiny random Qwen2 + BPE tokenizer with a chat template, saved like a hub checkpoint
    (``replay_exp.models.tiny_hub``): what ``model=<dir>`` loads in the pretrained-model tests."""
    from replay_exp.models.tiny_hub import save_tiny_hub_model

    return save_tiny_hub_model(tmp_path_factory.mktemp("tiny_hub") / "tiny-qwen2")


@pytest.fixture(scope="session")
def tiny_qwen3_hub_dir(tmp_path_factory):
    """A tiny random Qwen3 shaped like Qwen3-0.6B (``tiny_hub.TINY_QWEN3``: q/k RMS norms,
    grouped-query attention, head_dim set on its own, padded vocabulary, UNTIED head) with the
    same BPE tokenizer and chat template, saved like a hub checkpoint."""
    from replay_exp.models.tiny_hub import save_tiny_hub_model

    return save_tiny_hub_model(tmp_path_factory.mktemp("tiny_hub") / "tiny-qwen3", arch="qwen3")


@pytest.fixture(autouse=True)
def _quiet_when_marked(request, tmp_path_factory):
    """Under ``pytest -n 2`` (xdist), a test marked ``quiet`` runs while no other test does:
    every test holds a shared lock on one file of the session's temporary root for its
    duration, a ``quiet`` one an exclusive lock, so it waits for the other worker's running test
    and the other worker waits for it. For the few tests that bound a wall-clock duration (a
    modelled generator's charge against its real calls): a busy second core breaks their
    premise, not the code. Without xdist there is nothing to wait for."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    # each worker's basetemp is <session root>/popen-gw<N>: the root is shared by the workers
    lock_path = tmp_path_factory.getbasetemp().parent / "quiet.lock"
    quiet = request.node.get_closest_marker("quiet") is not None
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX if quiet else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
