"""Every sweep file composes, says its run count truthfully, and every job it launches resolves."""

from __future__ import annotations

import copy
import functools
import math
import re
from pathlib import Path

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import OmegaConf

import replay_exp.config.naming  # noqa: F401  (registers the resolvers conf/train.yaml uses)
from replay_exp.config.derive import resolve
from replay_exp.config.schemas import CONF_DIR, register_configs

SWEEPS = Path(CONF_DIR).parent / "sweeps"
OPENR1 = Path(__file__).parent / "fixtures" / "math" / "openr1.parquet"
FILES = sorted(p for p in SWEEPS.glob("*.yaml") if not p.name.startswith("_"))
# Sweeps that run on a laptop CPU: the embedded testbed's (*_tiny) and the second testbed's
# (*_chain_sum: CPU-only studies of transfer, whose paper-size questions are the *_paper ones).
CPU_SUFFIXES = ("_tiny", "_chain_sum")


@functools.cache
def _composed(overrides: tuple[str, ...]):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose("train", overrides=list(overrides), return_hydra_config=True)


def _compose(overrides: list[str]):
    """Hydra's composition of ``train`` with ``overrides``: each distinct list is composed once
    per test process (the same sweep's base config served ~8 tests) and handed out as a copy."""
    return copy.deepcopy(_composed(tuple(overrides)))


@functools.cache
def _sweep_jobs(name: str) -> tuple[tuple[str, ...], ...]:
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = _compose([f"+sweep={name}"]).hydra.sweeper.params
    overrides = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    (batch,) = BasicSweeper.split_arguments(overrides, max_batch_size=None)
    return tuple(tuple(job) for job in batch)


def _jobs(name: str) -> list[list[str]]:
    """The override lists of every job of sweep ``name``, as Hydra's basic sweeper expands its
    ``hydra.sweeper.params`` (its own parser and cartesian product)."""
    return [list(job) for job in _sweep_jobs(name)]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_header_states_question_command_and_true_run_count(path):
    text = path.read_text()
    assert re.search(r"^# Question: ", text, re.M), "header needs a '# Question:' line"
    command = re.search(r"^# Command: (.+)$", text, re.M).group(1)
    assert f"+sweep={path.stem}" in command
    # "# Runs: 3 configs x 5 seeds = 15": the factors and the total both match what the sweeper
    # launches.
    runs = re.search(r"^# Runs: (.*?)= (\d+)", text, re.M)
    factors = [int(f) for f in re.findall(r"(\d+) [^x]+", runs.group(1))]
    jobs = _jobs(path.stem)
    assert len(jobs) == int(runs.group(2)) == math.prod(factors)
    assert len({tuple(j) for j in jobs}) == len(jobs)
    assert _compose([f"+sweep={path.stem}"]).sweep_name == path.stem


def _compose_jobs(name: str, jobs: list[list[str]]) -> list:
    """``_compose([+sweep=name, *job])`` of every job, fast: Hydra composes once per distinct
    choice of config groups (``buffer=fifo``, ``+x=...``: whatever is not a plain value), and
    each job's plain ``key=value`` overrides are then set on a copy as Hydra sets them after
    composing (``OmegaConf.update(cfg, key, value, merge=True)`` on the struct config). A
    composition takes ~0.4 s and the tiny sweeps have hundreds of jobs; the test below checks
    that this gives what Hydra gives."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, base, out = OverridesParser.create(), {}, []
    for job in jobs:
        groups, values = [], []
        for text, o in zip(job, parser.parse_overrides(job), strict=True):
            plain = not (o.is_add() or o.is_delete() or o.is_force_add() or o.package)
            is_group = (Path(CONF_DIR) / o.key_or_group.replace(".", "/")).is_dir()
            (values if plain and not is_group else groups).append((text, o))
        key = tuple(t for t, _ in groups)
        if key not in base:
            base[key] = _compose([f"+sweep={name}", *key])
        cfg = copy.deepcopy(base[key])
        for _, o in values:
            OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
        out.append(cfg)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "path", [p for p in FILES if p.stem.endswith(CPU_SUFFIXES)], ids=lambda p: p.stem
)
def test_every_job_of_a_tiny_sweep_resolves(path):
    jobs = _jobs(path.stem)
    for cfg in _compose_jobs(path.stem, jobs):
        cfg_plain, derived = resolve(cfg)
        assert derived.total_steps >= 1
    assert len({tuple(sorted(job)) for job in jobs}) == len(jobs)  # no two jobs alike


@pytest.mark.slow
@pytest.mark.parametrize(
    "path", [p for p in FILES if p.stem.endswith(CPU_SUFFIXES)], ids=lambda p: p.stem
)
def test_the_fast_composition_is_hydras(path):
    jobs = _jobs(path.stem)
    picked = [jobs[0], jobs[-1]]
    for fast, job in zip(_compose_jobs(path.stem, picked), picked, strict=True):
        full = _compose([f"+sweep={path.stem}", *job])
        strip = lambda c: {k: v for k, v in OmegaConf.to_container(c).items() if k != "hydra"}  # noqa: E731
        assert strip(fast) == strip(full), job


@pytest.mark.slow
@pytest.mark.parametrize(
    "path", [p for p in FILES if p.stem.endswith("_paper")], ids=lambda p: p.stem
)
def test_first_and_last_job_of_a_paper_sweep_resolve(path):
    """Paper sweeps train Qwen3-0.6B on OpenR1-Math with vLLM; here (no hub, no vLLM) a local
    file in the OpenR1 format stands in for the dataset and the hf backend for vLLM."""
    offline = [f"task.path={OPENR1}", "task.n_eval=1", "generation=hf"]
    jobs = _jobs(path.stem)
    for job in (jobs[0], jobs[-1]):
        cfg = _compose([f"+sweep={path.stem}", *job])
        assert (cfg.task.name, cfg.generation.backend) == ("openr1_math", "vllm")
        cfg, derived = resolve(_compose([f"+sweep={path.stem}", *job, *offline]))
        assert cfg.model.pretrained == "Qwen/Qwen3-0.6B" and cfg.algo.group_size == 16
        assert cfg.model.tie_word_embeddings is False and derived.max_new_tokens == 1024


def test_every_figure_has_a_tiny_and_a_paper_size():
    stems = {p.stem for p in FILES if not p.stem.endswith("_chain_sum")}
    studies = {s.rsplit("_", 1)[0] for s in stems}
    assert {f"{s}_tiny" for s in studies} | {f"{s}_paper" for s in studies} == stems


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_sweep_evaluates_on_the_compute_grid(path):
    """Every figure compares arms at equal compute: each arm is evaluated at the same x values
    and equally often (a compute budget that is a whole number of evaluation intervals)."""
    cfg = _compose([f"+sweep={path.stem}"])
    assert cfg.eval.unit == "compute"
    assert cfg.schedule.max_steps is None and cfg.schedule.max_compute is not None
    assert (cfg.schedule.max_compute / cfg.eval.every).is_integer()
