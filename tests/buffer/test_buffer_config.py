"""The buffer part of the config: every YAML builds its buffer, resolve() rejects bad nodes."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from replay_exp.buffer import BUFFERS, PolicyBuffer, ShardedBuffer, make_buffer
from replay_exp.config import schemas
from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.config.errors import ConfigError

# Options only: _base.yaml holds the keys every option shares.
BUFFER_YAMLS = sorted(
    p.stem for p in (Path(schemas.CONF_DIR) / "buffer").glob("*.yaml") if not p.name.startswith("_")
)


@functools.cache
def _composed(groups: tuple[str, ...]):
    return compose(list(groups))


def compose_fast(overrides: list[str]):
    """compose() once per group choice, then key=value overrides applied to a copy (Hydra's
    composition costs ~0.5 s; the schema still type-checks every assignment)."""
    groups = tuple(o for o in overrides if "." not in o.split("=")[0])
    cfg = _composed(groups).copy()
    for o in overrides:
        key, value = o.split("=", 1)
        if "." in key:
            OmegaConf.update(cfg, key, yaml.safe_load(value), merge=False)
    return cfg


def test_every_policy_has_a_yaml():
    assert sorted(BUFFERS) == BUFFER_YAMLS


@pytest.mark.parametrize("option", BUFFER_YAMLS)
def test_yaml_builds_its_buffer(option):
    cfg, d = resolve(compose_fast([f"buffer={option}"]))
    buf = make_buffer(
        cfg.buffer, capacity=d.capacity, max_prompt_len=d.max_prompt_len,
        max_completion_len=d.max_new_tokens, seed=0,
    )  # fmt: skip
    assert isinstance(buf, PolicyBuffer) and type(buf.eviction) is BUFFERS[option]
    assert buf.store.capacity == d.capacity


def test_derived_capacities():
    # max_age without a capacity: (A + 1) R, rounded up to a multiple of T
    _, d = resolve(
        compose_fast(["buffer=max_age", "buffer.max_age=3", "schedule.rollouts_per_step=16"])
    )
    assert d.capacity == 64
    over = ["buffer=max_age", "buffer.max_age=4", "buffer.shards=3", "schedule.batch_size=60",
            "schedule.rollouts_per_step=16"]  # fmt: skip
    _, d = resolve(compose_fast(over))
    assert d.capacity == 81  # ceil(5 * 16 / 3) * 3
    cfg, d = resolve(compose_fast(["buffer.shards=4", "buffer.capacity=512"]))
    buf = make_buffer(cfg.buffer, capacity=d.capacity, max_prompt_len=9, max_completion_len=5,
                      seed=0)  # fmt: skip
    assert isinstance(buf, ShardedBuffer) and len(buf.shards) == 4


BAD = [
    (["buffer.sampling=lifo"],
     "buffer.sampling=lifo is unknown; choose one of ['never_used_first', 'prioritized', "
     "'recency', 'uniform', 'without_replacement']"),
    (["buffer.priority=loss"],
     "buffer.priority=loss is unknown; choose one of ['abs_advantage', 'group_reward_var']"),
    (["buffer=positive_bias", "buffer.delta=1.5"], "buffer.delta=1.5 must be in [0, 1]"),
    (["buffer=positive_bias", "buffer.delta=0.9"],
     "buffer.delta=0.9 leaves 26 of buffer.capacity=256 for the freshest rollouts, fewer than "
     "schedule.rollouts_per_step=64: new rollouts would be evicted before any use"),
    (["buffer=max_age", "buffer.max_age=-1"], "buffer.max_age=-1 must be >= 0"),
    (["buffer=max_age", "buffer.max_age=1", "schedule.sync_every=4"],
     "buffer.max_age=1 is below the generator's staleness 3 (schedule.sync_every - 1 + "
     "schedule.sync_lag): rollouts would be evicted before any use"),
    (["buffer=max_age", "buffer.max_age=0", "schedule.rollouts_per_step=16"],
     "buffer.max_age=0 keeps at most (max_age + 1) R = 16 rollouts, fewer than "
     "schedule.batch_size=64"),
    (["buffer.max_reuse=0"], "buffer.max_reuse=0 must be > 0 (null = unlimited)"),
    (["buffer.shards=3"], "buffer.shards=3 does not divide buffer.capacity=256"),
    (["buffer.shards=0"], "buffer.shards=0 must be > 0"),
    (["buffer.shards=8", "schedule.batch_size=60", "schedule.rollouts_per_step=64"],
     "buffer.shards=8 does not divide schedule.batch_size=60"),
    (["buffer=on_policy", "buffer.sampling=prioritized"],
     "buffer=on_policy hands out the newest rollouts once; it needs buffer.sampling=uniform "
     "(got buffer.sampling=prioritized)"),
    (["buffer=on_policy", "buffer.max_reuse=2"],
     "buffer=on_policy uses each rollout once; buffer.max_reuse=2 must be null"),
    (["buffer=on_policy", "buffer.shards=16"],
     "buffer=on_policy with buffer.shards=16 needs the 8 prompt groups of a step "
     "(schedule.rollouts_per_step=64 / algo.group_size=8) to split evenly over the shards"),
    (["buffer.sampling=recency"],
     "buffer.recency_tau=null: buffer.sampling=recency needs tau > 0 (steps)"),
    (["buffer.sampling=recency", "buffer.recency_tau=0"], "buffer.recency_tau=0.0 must be > 0"),
    (["buffer.recency_tau=2"],
     "buffer.recency_tau=2.0 is only used by buffer.sampling=recency (got "
     "buffer.sampling=uniform); set it to null"),
    (["buffer.sampling=prioritized", "buffer.priority_alpha=-1"],
     "buffer.priority_alpha=-1.0 must be finite and >= 0"),
    (["buffer=priority", "buffer.capacity=null"],
     "buffer.capacity=null: buffer=priority needs a capacity N"),
    (["buffer.capacity=0"], "buffer.capacity=0 must be > 0"),
]  # fmt: skip


# An eviction policy's own knob is a key of its option only, and typed: misuse fails at compose
# time, naming the key.
COMPOSE_BAD = [
    ["buffer.delta=0.2"],  # fifo has no delta
    ["buffer.max_age=3"],  # nor a max_age
    ["buffer=positive_bias", "buffer.delta=null"],  # a float, not optional
    ["buffer=max_age", "buffer.max_age=null"],
]


@pytest.mark.parametrize("overrides", COMPOSE_BAD, ids=" ".join)
def test_an_option_knob_elsewhere_fails_at_compose_time(overrides):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as err:
        compose(overrides)
    key = overrides[-1].split("=")[0]
    assert key.split(".")[-1] in str(err.value) + str(err.value.__cause__)


@pytest.mark.parametrize(("overrides", "message"), BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_buffer_config_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        resolve(compose_fast(overrides))
    assert str(err.value) == message
    assert "\n" not in message
