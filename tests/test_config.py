"""Compose-and-resolve every config option; bad configs fail with one line, writing nothing."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from omegaconf import MISSING, OmegaConf

from replay_exp.config import checks, derive, schemas
from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.config.errors import ConfigError
from replay_exp.config.schemas import NAME_KEYS, OPTION_SCHEMAS, TrainConfig, option_defaults

CONF = Path(schemas.CONF_DIR)
# conf/sweep links to sweeps/ (multirun files, appended with +sweep=...): tests/test_sweeps.py.
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name != "sweep")
# Options: every YAML but the _base.yaml a group's options share.
OPTIONS = [
    (g, f.stem)
    for g in GROUPS
    for f in sorted((CONF / g).glob("*.yaml"))
    if not f.name.startswith("_")
]


GSM8K = Path(__file__).parent / "fixtures" / "math" / "gsm8k.jsonl"
MATH_FIXTURE = {"gsm8k": "gsm8k.jsonl", "math": "math500.jsonl", "openr1_math": "openr1.parquet"}
VLLM = importlib.util.find_spec("vllm") is not None


def _offline_extras(group: str, option: str, tiny_hub_dir: Path) -> list[str]:
    """What an option needs to resolve on a machine without the hub: a local model for the
    math tasks (and the generic pretrained option), a local dataset file."""
    if group == "model" and option == "pretrained":
        return [f"model.pretrained={tiny_hub_dir}"]
    if group == "model" and option not in ("tiny", "tiny_qwen2", "chain_sum_qwen2"):  # hub ids
        return [f"model.pretrained={tiny_hub_dir}"]
    if group == "runtime" and option == "distributed":  # the real node of schedule=async
        return ["schedule=async", "buffer.shards=2"]
    if group == "task" and option == "reasoning_gym":  # a tiny model with a subword tokenizer
        return ["model=chain_sum_qwen2", "task.n_eval=16", "task.max_prompt_tokens=28",
                "task.max_response_tokens=6"]  # fmt: skip
    if group == "task" and option != "arithmetic":
        path = GSM8K.with_name(MATH_FIXTURE[option])
        return [f"model={tiny_hub_dir}", f"task.path={path}", "task.n_eval=2"]
    return []


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_resolves(group, option, tiny_hub_dir):
    overrides = [f"{group}={option}", *_offline_extras(group, option, tiny_hub_dir)]
    if group == "generation" and option == "vllm" and not VLLM:
        with pytest.raises(ConfigError, match=r"generation.backend=vllm needs the vllm package"):
            resolve(compose(overrides))
        return
    cfg, derived = resolve(compose(overrides))
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


DIST = ["runtime=distributed", "schedule=async", "buffer.shards=2"]
BAD = [
    (["schedule.batch_size=0"], "schedule.batch_size=0 must be > 0"),
    (["runtime=distributed"],
     "runtime=distributed runs the node of schedule=async (W generators, T trainers); given "
     "schedule=sync"),
    (["runtime=distributed", "schedule=async"],
     "runtime=distributed gives each of the schedule.trainers=2 trainer ranks its own buffer "
     "shard: set buffer.shards=2 (given 1)"),
    ([*DIST, "runtime.wrapper=zero3"], "runtime.wrapper=zero3 is unknown; choose ddp or fsdp"),
    ([*DIST, "runtime.backend=nccl", "device=cpu"],
     "runtime.backend=nccl needs device=cuda (given device=cpu)"),
    ([*DIST, "schedule.sync_lag=1"],
     "schedule.sync_lag=1 emulates a weight-push delay; under runtime=distributed the delay is "
     "real: set schedule.sync_lag=0"),
    ([*DIST, "generation.behaviour_logp=trainer"],
     "generation.behaviour_logp=trainer needs the trainer's weights in the generator's process; "
     "under runtime=distributed use generation.behaviour_logp=engine"),
    ([*DIST, "runtime.heartbeat_timeout_s=0"], "runtime.heartbeat_timeout_s=0.0 must be > 0"),
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
    (["generation.backend=sglang"],
     "generation.backend=sglang is unknown; choose one of ['hf', 'vllm']"),
    (["generation.sampler=beam"],
     "generation.sampler=beam is unknown; choose one of ['cached_loop', 'generate', 'static']"),
    (["generation.compile=true"],
     "generation.compile=true compiles the static decode step; it needs "
     "generation.sampler=static (given: cached_loop)"),
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
    (["algo.group_size=1"], "algo.group_size=1: a group of one is its own baseline, so every "
     "advantage is 0 (and AsymRE's coefficient a constant): nothing would train; use >= 2"),
    (["eval.unit=tokens"], "eval.unit=tokens is unknown; choose one of ['steps', 'compute', "
     "'rollouts']"),
    (["eval.every=2.5"], "eval.every=2.5 must be a whole number of steps (eval.unit=steps)"),
    (["eval.sampled_problems=0"], "eval.sampled_problems=0 must be > 0"),
    (["generation.temperature=0"], "generation.temperature=0.0 must be > 0"),
    (["generation.top_p=1.5"], "generation.top_p=1.5 must be in (0, 1]"),
    (["algo.eps_low=1.0"], "algo.eps_low=1.0 must be in [0, 1)"),
    (["schedule.sync_every=0"], "schedule.sync_every=0 must be > 0"),
    (["task.n_digits=0"], "task.n_digits=0 must be in [1, 9]"),
    (["task.operations=[+,/]"], "task.operations=['+', '/'] must be a non-empty subset of "
     "['+', '-', '*']"),
    (["model.arch=gpt2"], "model.arch=gpt2 is unknown; choose one of ['llama', 'qwen2', 'qwen3']"),
    (["buffer.capacity=null"], "buffer.capacity=null: buffer=fifo needs a capacity N"),
    (["schedule.max_steps=null", "schedule.max_compute=-1"],
     "schedule.max_compute=-1.0 must be > 0"),
    (
        ["model.max_position_embeddings=12"],
        "model.max_position_embeddings = 12 < prompt 9 + generation.max_new_tokens=5 tokens",
    ),
    (
        ["model.hidden_size=130"],
        "model.hidden_size=130 is not a multiple of model.num_heads=4",
    ),
    (["generation=vllm", "generation.gpu_memory_utilization=1.5"],
     "generation.gpu_memory_utilization=1.5 must be in (0, 1] (the share of GPU memory the "
     "vLLM engine may take)"),
    (["generation=vllm", "generation.gpu_memory_utilization=0"],
     "generation.gpu_memory_utilization=0.0 must be in (0, 1] (the share of GPU memory the "
     "vLLM engine may take)"),
    (["generation=vllm", "device=cuda:1"],
     "device=cuda:1 with generation.backend=vllm: the engine always runs on the first "
     "visible GPU; run with CUDA_VISIBLE_DEVICES=1 and device=cuda instead"),
    (["generation.behaviour_logp=magic"],
     "generation.behaviour_logp=magic is unknown; choose engine or trainer"),
    (["generation.behaviour_logp=trainer", "schedule.sync_every=2"],
     "generation.behaviour_logp=trainer recomputes behaviour log-probs with the trainer's "
     "weights, which are the generator's only with schedule.sync_every=1 and "
     "schedule.sync_lag=0 (given 2 and 0)"),
    (["algo.micro_batch_size=0"], "algo.micro_batch_size=0 must be > 0"),
    (["model.chat_template=true"], "model.chat_template=true, but the tokenizer of the tiny "
     "model has no chat template; set model.chat_template=false"),
    (["model.dtype=int8"], "model.dtype=int8 is unknown; choose float32, bfloat16, float16 or "
     "auto (bfloat16 on CUDA, float32 on CPU)"),
    (["model=pretrained"], "model=pretrained needs model.pretrained=<local dir or hub org/name>"),
    (["model.pretrained=/nonexistent/model"], "model.pretrained=/nonexistent/model is neither a "
     "local model directory nor a hub id (org/name)"),
    ([f"model.pretrained={GSM8K.parent}"], f"model.pretrained={GSM8K.parent} has no "
     "config.json (not a save_pretrained directory)"),
    (["model=pretrained", "model.pretrained=nobody/no-such-model"],
     "task.name=arithmetic measures prompts in characters; on model.pretrained="
     "nobody/no-such-model the prompt width needs that model's tokenizer, which is not on this "
     "machine (neither a local dir nor in the hub's cache: download it first)"),
    (["task=gsm8k", f"task.path={GSM8K}"],
     "task.name=gsm8k needs a model with a subword tokenizer (model=qwen2_5_0_5b, "
     "model=<local dir>, model.pretrained=..., or a tiny model's model.tokenizer=<shipped>); "
     "the embedded tiny model's char tokenizer cannot read it"),
    (["model=qwen2_5_0_5b", "task=gsm8k", "task.path=/nonexistent/gsm8k.jsonl"],
     "task.path=/nonexistent/gsm8k.jsonl does not exist (a .jsonl/.json/.parquet file)"),
    (["model=qwen2_5_0_5b", "task=math", f"task.path={GSM8K}"],
     f"task.path={GSM8K}: {GSM8K} is not in the math format: missing field(s) ['problem', "
     "'solution'] (expected ['problem', 'solution']; found ['question', 'answer'])"),
    (["model=qwen2_5_0_5b", "task=gsm8k", f"task.path={GSM8K}", "task.n_eval=6"],
     "task.n_eval=6: n_eval=6 must be in [0, 5] (6 distinct prompts; at least one must stay "
     "for training)"),
    (["model=qwen2_5_0_5b", "task=gsm8k", f"task.path={GSM8K}", "task.template=no-placeholder"],
     "task.template: prompt template 'no-placeholder' is neither one of ['default', 'plain'] "
     "nor a string containing '{question}'"),
    (["task=reasoning_gym"],
     "task.name=reasoning_gym needs a model with a subword tokenizer (model=qwen2_5_0_5b, "
     "model=<local dir>, model.pretrained=..., or a tiny model's model.tokenizer=<shipped>); "
     "the embedded tiny model's char tokenizer cannot read it"),
    (["testbed=chain_sum", "task.dataset=chain_summ"],
     "task.dataset=chain_summ is not a reasoning-gym dataset (did you mean chain_sum, "
     "decimal_chain_sum?); 106 are registered (reasoning_gym.factory.DATASETS)"),
    (["testbed=chain_sum", "task.params.min_terms=0"],
     "task.params={'max_digits': 2, 'max_terms': 4, 'min_digits': 1, 'min_terms': 0} of "
     "task.dataset=chain_sum is invalid: min_terms must be positive"),
    (["testbed=chain_sum", "+task.params.terms=3"],
     "task.params={'max_digits': 2, 'max_terms': 4, 'min_digits': 1, 'min_terms': 3, 'terms': "
     "3} of task.dataset=chain_sum: ChainSumConfig.__init__() got an unexpected keyword "
     "argument 'terms'; its keys: ['allow_negation', 'max_digits', 'max_terms', 'min_digits', "
     "'min_terms']"),
    (["testbed=chain_sum", "task.extract=boxed"],
     "task.extract=boxed is unknown; choose one of ['completion', 'answer_tag', 'final']"),
    (["model.tokenizer=nope"],
     "model.tokenizer=nope is unknown; choose one of ['char', 'chain_sum_bpe']"),
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


def _schemas() -> list[type]:
    """Every schema class, nested ones included."""
    seen, todo = [], [TrainConfig, *(c for opts in OPTION_SCHEMAS.values() for c in opts.values())]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.append(cls)
        todo += [f.default_factory for f in dataclasses.fields(cls)
                 if f.default_factory is not dataclasses.MISSING]  # fmt: skip
    return seen


@pytest.mark.parametrize("schema", _schemas(), ids=lambda s: s.__name__)
def test_schemas_hold_no_default_to_contradict_the_yaml(schema):
    """One source of truth: a schema field has no value of its own (MISSING), or is a nested
    schema; every value comes from conf/*.yaml."""
    for f in dataclasses.fields(schema):
        if f.default_factory is not dataclasses.MISSING:
            assert dataclasses.is_dataclass(f.default_factory), (schema.__name__, f.name)
        else:
            assert f.default == MISSING, f"{schema.__name__}.{f.name} = {f.default!r}"


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_sets_exactly_its_schema_keys(group, option):
    """The composed node of each option has a value for every field of its schema (so each is
    documented in a YAML: test_every_yaml_key_has_a_comment_above) and no other key."""
    if group in ("experiment", "testbed", "correction", "debug", "launcher"):
        pytest.skip("presets and launchers hold deltas of other groups")
    node = option_defaults(group, option)
    name_key = NAME_KEYS.get(group)
    schemas = OPTION_SCHEMAS[group]
    if name_key is not None:
        schema = schemas[node[name_key]]
    elif group == "controller":  # no name key (fixed's policy is null): by the option's name
        schema = schemas[option]
    else:
        schema = schemas["tiny"] if "warm_start" in node else next(iter(schemas.values()))
    keys = {f.name for f in dataclasses.fields(schema)}
    assert set(node) == keys, f"{group}={option}: {sorted(set(node) ^ keys)}"
    for f in dataclasses.fields(schema):
        if dataclasses.is_dataclass(f.default_factory):
            nested = {g.name for g in dataclasses.fields(f.default_factory)}
            assert set(node[f.name]) == nested, f"{group}={option}: {f.name}"


def test_option_schemas_name_the_registered_options():
    """OPTION_SCHEMAS lists exactly the names each registry owns."""
    for group, registry in checks.REGISTRIES.items():
        assert sorted(OPTION_SCHEMAS[group]) == sorted(registry), group


def test_a_renamed_node_is_refused():
    """buffer.name=max_age on the fifo node has not max_age's keys: one line, select it."""
    with pytest.raises(ConfigError) as err:
        resolve(compose(["buffer.name=max_age"]))
    assert str(err.value) == (
        "buffer.name=max_age is not the option this node was composed from (its keys lack "
        "max_age); select it with buffer=max_age"
    )


def test_every_yaml_is_a_mapping_without_duplicate_keys():
    """A key written twice in one YAML: yaml.safe_load keeps the last, silently; OmegaConf's
    loader (Hydra's) refuses it. Every YAML under conf/ and sweeps/ (``YAMLS``: the shared
    ``_base`` files and the sweep files too, which the compose tests above load only through
    an option or not at all) loads with it, to a non-empty mapping."""
    with pytest.raises(yaml.constructor.ConstructorError, match="found duplicate key"):
        OmegaConf.create("a: 1\nb: 2\na: 3\n")  # what safe_load would read as {a: 3, b: 2}
    assert len(YAMLS) > 50
    for path in YAMLS:
        node = OmegaConf.load(path)
        assert OmegaConf.is_dict(node) and len(node) > 0, f"{path}: not a mapping of keys"


def test_unknown_key_fails_at_compose_time():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        compose(["buffer.capcity=5"])


# --- the pure derivations of resolve(), with numbers ---------------------------------------

SYNC = {"name": "sync", "batch_size": 64, "rollouts_per_step": None, "reuse_ratio": None,
        "sync_every": 1, "sync_lag": 0, "max_steps": None, "max_rollouts": None,
        "max_compute": None}  # fmt: skip
ASYNC = {**{k: v for k, v in SYNC.items() if k not in ("rollouts_per_step", "reuse_ratio")},
         "name": "async", "workers": None, "trainers": 2, "gpus": 8}  # fmt: skip


def _node(d, **kw):
    return OmegaConf.create({**d, **kw})


def test_derive_rollouts():
    # sync: neither R nor y -> R = B; y = 4 -> R = 64 / 4 = 16.
    assert derive.derive_rollouts(_node(SYNC), 8, 1.0) == (64, 64, None, None)
    assert derive.derive_rollouts(_node(SYNC, reuse_ratio=4), 8, 1.0) == (16, 16, None, None)
    # async (6, 2) at mu = 6.84: R = B W / (mu T) = 64 * 6 / 13.68 = 28.07; the most a step
    # brings is whole groups of 8 covering it: 32.
    rate, R_max, W, T = derive.derive_rollouts(_node(ASYNC), 8, 6.84)
    assert (R_max, W, T) == (32, 6, 2)
    assert rate == pytest.approx(28.0701754)
    # (4, 4) at mu = 6.84: R = 64 * 4 / 27.36 = 9.357, R_max = 16.
    rate, R_max, W, _ = derive.derive_rollouts(_node(ASYNC, trainers=4), 8, 6.84)
    assert (R_max, W) == (16, 4)
    assert rate == pytest.approx(9.3567251)
    with pytest.raises(ConfigError, match="not a multiple of algo.group_size=8"):
        derive.derive_rollouts(_node(SYNC, rollouts_per_step=12), 8, 1.0)


def test_derive_capacity():
    sync16 = _node(SYNC, reuse_ratio=4)
    arr = derive.derive_rollouts(sync16, 8, 1.0)
    buf = {"capacity": None, "shards": 1}
    # max_age A = 3 without a capacity: (A + 1) R = 4 * 16 = 64.
    assert derive.derive_capacity(_node(buf, name="max_age", max_age=3), sync16, arr, 8) == 64
    # A = 7, R = 8, 3 shards (B = 63): (A + 1) R = 64 rounded up to a multiple of 3: 66.
    b, s = (
        _node(buf, name="max_age", max_age=7, shards=3),
        _node(SYNC, batch_size=63, rollouts_per_step=8),
    )
    assert derive.derive_capacity(b, s, derive.derive_rollouts(s, 8, 1.0), 8) == 66
    # on_policy: N = B.
    on = _node(SYNC)
    assert (
        derive.derive_capacity(
            _node(buf, name="on_policy"), on, derive.derive_rollouts(on, 8, 1.0), 8
        )
        == 64
    )
    with pytest.raises(ConfigError, match="buffer.capacity=32 is smaller than"):
        derive.derive_capacity(
            _node(buf, name="fifo", capacity=32), on, derive.derive_rollouts(on, 8, 1), 8
        )


def test_units_per_step_and_steps():
    # sync y = 4 at mu = 6.84: (B + mu R) / (B (1 + mu)) = (64 + 109.44) / 501.76 = 0.345663.
    s = _node(SYNC, reuse_ratio=4, max_compute=100)
    units = derive.units_per_step(s, 16, 6.84)
    assert units == pytest.approx(0.3456632653)
    assert derive.derive_steps(s, 16, units) == 289  # floor(100 / 0.345663)
    # async (6, 2): gamma = (1 + 3) / 7.84 = 0.510204; 100 units -> 196 steps.
    a = _node(ASYNC, workers=6, max_compute=100)
    assert derive.units_per_step(a, 28.07, 6.84) == pytest.approx(0.5102040816)
    assert derive.derive_steps(a, 28.07, derive.units_per_step(a, 28.07, 6.84)) == 196
    # rollouts budget: whole steps of R.
    assert derive.derive_steps(_node(SYNC, max_rollouts=1000), 64, 1.0) == 15
    with pytest.raises(ConfigError, match="exactly one budget"):
        derive.derive_steps(_node(SYNC, max_steps=3, max_rollouts=10), 64, 1.0)


def test_a_char_task_on_a_pretrained_tokenizer_gets_a_prompt_width_that_holds(tiny_hub_dir):
    """task=arithmetic bounds prompts in characters; on a BPE tokenizer with a chat template
    resolve() measures the template's overhead, and every training prompt fits the width."""
    from replay_exp.models.tokenizer import load_tokenizer
    from replay_exp.rollout.collect import prompt_lengths
    from replay_exp.tasks import make_task

    overrides = ["model=pretrained", f"model.pretrained={tiny_hub_dir}", "model.chat_template=true"]
    cfg, d = resolve(compose(overrides))
    task = make_task(cfg.task)
    prompts = [p.prompt for p in task.sample_train(np.random.default_rng(0), 2000)]
    lengths = prompt_lengths(load_tokenizer(tiny_hub_dir), prompts, chat=True)
    # The template adds far more than the char tokenizer's one BOS: the old width (chars + 1)
    # would not hold them.
    assert max(lengths) > task.max_prompt_chars + 1
    assert max(lengths) <= d.max_prompt_len
