"""Compose-and-resolve every config option; bad configs fail with one line, writing nothing."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from replay_exp import config as C
from replay_exp.config import ConfigError, compose, resolve

CONF = Path(C.CONF_DIR)
# conf/sweep links to sweeps/ (multirun files, appended with +sweep=...): tests/test_sweeps.py.
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name != "sweep")
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((CONF / g).glob("*.yaml"))]


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_resolves(group, option):
    cfg, derived = resolve(compose([f"{group}={option}"]))
    assert derived.total_steps >= 1
    assert derived.rollouts_per_step % cfg.algo.group_size == 0
    assert derived.capacity >= cfg.schedule.batch_size


def test_default_derived_sizes():
    cfg, d = resolve(compose([]))
    B, R, N = cfg.schedule.batch_size, d.rollouts_per_step, d.capacity
    assert (B, R, N) == (64, 64, 256)
    assert d.reuse_ratio == B / R and d.staleness_horizon == N / R
    assert d.total_steps == cfg.schedule.max_steps


@pytest.mark.parametrize(
    ("overrides", "R", "y", "x", "steps"),
    [
        # The example: N=512, R=16 -> y = 64/16 = 4, x = 512/16 = 32.
        (["buffer.capacity=512", "schedule.rollouts_per_step=16"], 16, 4.0, 32.0, 300),
        # y given: R = B / y = 64 / 2 = 32.
        (["schedule.reuse_ratio=2"], 32, 2.0, 8.0, 300),
        # Generation budget: 6400 rollouts / R=32 per step = 200 steps.
        (["schedule.reuse_ratio=2", "schedule.max_steps=null", "schedule.max_rollouts=6400"],
         32, 2.0, 8.0, 200),
        # Compute budget, mu=1: a step costs (B + mu R) / (B (1 + mu)) = (64+32)/128 = 0.75
        # paper units, so 30 units buy 40 steps.
        (["schedule.reuse_ratio=2", "schedule.max_steps=null", "schedule.max_compute=30"],
         32, 2.0, 8.0, 40),
        # On-policy: R = B, N = B, each step costs exactly 1 unit -> 30 steps.
        (["buffer=on_policy", "schedule.max_steps=null", "schedule.max_compute=30"],
         64, 1.0, 1.0, 30),
    ],
)  # fmt: skip
def test_derivations(overrides, R, y, x, steps):
    _, d = resolve(compose(overrides))
    assert (d.rollouts_per_step, d.reuse_ratio, d.staleness_horizon, d.total_steps) == (
        R,
        y,
        x,
        steps,
    )


BAD = [
    (["schedule.batch_size=0"], "schedule.batch_size=0 must be > 0"),
    (
        ["schedule.rollouts_per_step=12"],
        "schedule.rollouts_per_step=12 is not a multiple of algo.group_size=8",
    ),
    (
        ["schedule.rollouts_per_step=16", "schedule.reuse_ratio=4"],
        "schedule.rollouts_per_step=16 and schedule.reuse_ratio=4.0 are mutually exclusive; "
        "set one of them to null",
    ),
    (["buffer.capacity=32"], "buffer.capacity=32 is smaller than schedule.batch_size=64"),
    (
        ["schedule.max_rollouts=1000"],
        "exactly one budget of schedule.max_steps / max_rollouts / max_compute must be set "
        "(given: schedule.max_steps=300, schedule.max_rollouts=1000); set the others to null",
    ),
    (
        ["schedule.max_steps=null"],
        "exactly one budget of schedule.max_steps / max_rollouts / max_compute must be set "
        "(given: none); set the others to null",
    ),
    (["buffer.name=lifo"], "buffer.name=lifo is unknown; choose one of "
     "['fifo', 'max_age', 'on_policy', 'positive_bias', 'priority']"),
    (["generation.backend=sglang"], "generation.backend=sglang is unknown; choose one of ['hf']"),
    (["generation.sampler=beam"],
     "generation.sampler=beam is unknown; choose one of ['cached_loop', 'generate']"),
    (
        ["algo.loss_agg=sum"],
        "algo.loss_agg=sum is unknown; choose one of ['seq_mean', 'seq_sum_norm', 'token_mean']",
    ),
    (
        ["buffer=on_policy", "schedule.rollouts_per_step=32"],
        "buffer=on_policy uses each rollout once, so it needs "
        "schedule.rollouts_per_step=32 == schedule.batch_size=64",
    ),
    (
        ["schedule.reuse_ratio=3"],
        "schedule.reuse_ratio=3.0 gives a non-integer rollouts_per_step B/y = 64/3.0 = 21.3333",
    ),
    (["eval.pass_k=[1,16]"], "eval.pass_k=[1, 16] needs every k in [1, eval.n_samples=8]"),
    (["generation.temperature=0"], "generation.temperature=0.0 must be > 0"),
    (["generation.top_p=1.5"], "generation.top_p=1.5 must be in (0, 1]"),
    (["algo.eps_low=1.0"], "algo.eps_low=1.0 must be in [0, 1)"),
    (["schedule.sync_every=0"], "schedule.sync_every=0 must be > 0"),
    (["task.n_digits=0"], "task.n_digits=0 must be in [1, 9]"),
    (["task.operations=[+,/]"], "task.operations=['+', '/'] must be a non-empty subset of "
     "['+', '-', '*']"),
    (["model.arch=gpt2"], "model.arch=gpt2 is unknown; choose one of ['llama', 'qwen2']"),
    (["buffer.capacity=null"], "buffer.capacity=null: buffer=fifo needs a capacity N"),
    (["schedule.max_steps=null", "schedule.max_compute=-1"],
     "schedule.max_compute=-1.0 must be > 0"),
    (
        ["model.max_position_embeddings=12"],
        "model.max_position_embeddings=12 < prompt 9 + generation.max_new_tokens=5",
    ),
    (
        ["model.hidden_size=130"],
        "model.hidden_size=130 is not a multiple of model.num_heads=4",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("overrides", "message"), BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_config_one_line_nothing_written(overrides, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = compose([*overrides, f"output_root={tmp_path / 'runs'}"])
    with pytest.raises(ConfigError) as err:
        resolve(cfg)
    assert str(err.value) == message
    assert "\n" not in str(err.value)
    assert list(tmp_path.iterdir()) == []  # no run directory, no file


def _yaml_key_lines(path: Path):
    """(line number, key, is_leaf) for each mapping key outside the defaults list."""
    lines = path.read_text().splitlines()
    in_defaults = False
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)([A-Za-z_][\w]*):(.*)$", line)
        if not m:
            continue
        indent, key, rest = m.groups()
        if not indent:
            in_defaults = key == "defaults"
        if in_defaults or key == "hydra" or _under_hydra(lines, i):
            continue
        yield i, key, rest.strip() != ""


def _under_hydra(lines: list[str], i: int) -> bool:
    for line in reversed(lines[:i]):
        if line and not line[0].isspace() and not line.startswith("#"):
            return line.startswith("hydra:")
    return False


YAMLS = sorted(CONF.rglob("*.yaml")) + sorted((CONF.parent / "sweeps").glob("*.yaml"))


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_yaml_key_has_a_comment_above(path):
    lines = path.read_text().splitlines()
    undocumented = [
        key
        for i, key, leaf in _yaml_key_lines(path)
        if leaf and not lines[i - 1].lstrip().startswith("#")
    ]
    assert undocumented == [], f"{path}: keys without a comment line above: {undocumented}"


SCHEMA_FILES = {
    C.ModelConfig: "model/tiny.yaml",
    C.WarmStartConfig: "model/tiny.yaml",
    C.ArithmeticTaskConfig: "task/arithmetic.yaml",
    C.BufferConfig: "buffer/fifo.yaml",
    C.ScheduleConfig: "schedule/sync.yaml",
    C.AlgoConfig: "algo/grpo.yaml",
    C.GenerationConfig: "generation/hf.yaml",
    C.EvalConfig: "eval/default.yaml",
    C.LoggerConfig: "logger/jsonl.yaml",
    C.ComputeConfig: "train.yaml",
    C.CheckpointConfig: "train.yaml",
    C.TrainConfig: "train.yaml",
}


@pytest.mark.parametrize("schema", list(SCHEMA_FILES), ids=lambda s: s.__name__)
def test_every_schema_field_is_documented_in_yaml(schema):
    """A field added to a schema must appear (with its comment) in the group's YAML."""
    text = (CONF / SCHEMA_FILES[schema]).read_text()
    keys = {key for _, key, _ in _yaml_key_lines(CONF / SCHEMA_FILES[schema])}
    keys |= set(re.findall(r"^  - (?:optional )?(\w+):", text, flags=re.M))  # groups
    missing = [f.name for f in dataclasses.fields(schema) if f.name not in keys]
    assert missing == [], f"{schema.__name__} fields missing from {SCHEMA_FILES[schema]}"


def test_yaml_is_valid():
    for path in CONF.rglob("*.yaml"):
        yaml.safe_load(path.read_text())


def test_unknown_key_fails_at_compose_time():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        compose(["buffer.capcity=5"])
