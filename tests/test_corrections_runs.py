"""Every stale-data correction (loss, mask, proximal policy) and admission policy runs four steps
in all three runtimes: the sync loop, the emulated async node (runtime=inprocess) and the real
one (runtime=distributed, W = 1 generator, T = 1 trainer), some micro-batched; the diagnostics
and the data composition reach metrics.jsonl; refusals happen at resolve()."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.config.errors import ConfigError
from replay_exp.loop import must_wait
from replay_exp.rollout.synthetic import rollout_batch
from replay_exp.runlog import read_metrics
from replay_exp.train import run

# case -> (overrides, a loss stat the case must log). Micro-batching where the whole batch
# matters (M2PO's budget, the proximal forward) or a mask is per row.
CASES = {
    "cispo": (["algo=cispo"], "loss/weight_mean"),
    "gspo": (["algo=gspo"], "loss/seq_ratio_mean"),
    "topr": (["algo=topr"], "loss/taper_mean"),
    "m2po-micro": (["algo=m2po", "algo.micro_batch_size=5"], "loss/m2"),
    "icepop": (["algo.mask=icepop"], "loss/masked_frac"),
    "seq_mis": (["algo.mask=seq_mis", "algo.micro_batch_size=6"], "loss/masked_frac"),
    "geometric": (["algo=gspo", "algo.mask=geometric"], "loss/masked_frac"),
    "opsm": (["algo=cispo", "algo.mask=opsm"], "loss/masked_frac"),
    "recompute-micro": (["algo.proximal=recompute", "algo.micro_batch_size=5"],
                        "loss/tis_weight_mean"),
    "loglinear": (["algo.proximal=loglinear", "algo.tis_cap=2"], "loss/tis_weight_mean"),
    "tis-geometric": (["algo.tis_cap=2", "algo.tis_level=geometric"], "loss/tis_weight_mean"),
    "dual-clip": (["algo.clip_ratio_c=3"], "loss/dual_clip_frac"),
    "sapo": (["algo=sapo"], "loss/gate_mean"),
    "gmpo-dual-clip": (["algo=gmpo", "algo.clip_ratio_c=3"], "loss/dual_clip_frac"),
    "dppo-micro": (["algo=dppo", "algo.dppo_kl_tau=1e-3", "algo.micro_batch_size=5"],
                   "loss/tv_mean"),
    "sample-std": (["algo.adv_std=sample", "algo.adv_eps=1e-4"], "loss/pg_loss"),
}  # fmt: skip
ASYNC = ["schedule=async", "schedule.gpus=null", "schedule.workers=1", "schedule.trainers=1",
         "checkpoint.every=0"]  # fmt: skip
RUNTIMES = {
    # sync, weights pushed every 2 steps so the ratios are not all 1
    "sync": ["schedule.sync_every=2"],
    "async": [*ASYNC, "runtime=inprocess"],
    "distributed": [*ASYNC, "runtime=distributed"],
}
DIAG = ["diag/ratio_raw_mean", "diag/ratio_raw_max", "diag/above_2", "diag/below_half",
        "diag/staleness_kl", "diag/mismatch_kl", "diag/lag0/staleness_kl"]  # fmt: skip
DATA = ["data/generated_reward", "data/trained_reward", "data/generated_pass_rate",
        "data/trained_pass_rate", "data/generated_length", "data/trained_length"]  # fmt: skip


def _run(fast, tmp_path, overrides):
    run_dir = tmp_path / "run"
    cfg, derived = resolve(
        compose([*fast, "schedule.max_steps=4", "eval.every=4", *overrides, f"run_dir={run_dir}"])
    )
    summary = run(cfg, derived, run_dir)
    assert summary["status"] == "finished" and summary["runtime"]["balanced"] is True
    assert "Traceback" not in (run_dir / "train.log").read_text()
    return summary, read_metrics(run_dir / "metrics.jsonl"), run_dir


@pytest.mark.slow
@pytest.mark.parametrize("runtime", list(RUNTIMES))
@pytest.mark.parametrize("case", list(CASES))
def test_correction_runs_in_every_runtime(case, runtime, fast, tmp_path):
    overrides, stat = CASES[case]
    if runtime == "distributed":
        pytest.importorskip("torch.distributed")
    _, rows, _ = _run(fast, tmp_path, [*RUNTIMES[runtime], *overrides])
    trained = [r for r in rows if "loss/loss" in r]
    assert trained, "no update was logged"
    for r in trained:
        assert math.isfinite(r["loss/loss"]) and math.isfinite(r[stat])
        for key in DIAG + DATA:
            assert key in r, key
        # hf: the engine is the trainer's model, so the whole ratio is staleness
        assert r["diag/mismatch_kl"] == 0.0
    last = rows[-1]
    assert last["data/trained_count"] > 0 and "data/interval/trained_reward" in last


def test_the_sample_std_reaches_the_stored_advantages(fast, tmp_path):
    """algo.adv_std=sample divides by the larger sample std: the same first batch (same seed,
    same rollouts) trains with advantages smaller by sqrt((G - 1) / G) wherever a group is
    mixed, so the first step's loss differs, and the rewards do not."""
    first = {}
    for std in ("population", "sample"):
        _, rows, _ = _run(fast, tmp_path / std, [f"algo.adv_std={std}", "schedule.max_steps=1"])
        first[std] = next(r for r in rows if "loss/loss" in r)
    assert first["population"]["data/trained_reward"] == first["sample"]["data/trained_reward"]
    assert first["population"]["loss/pg_loss"] != first["sample"]["loss/pg_loss"]


def test_loss_stats_of_a_correction_are_its_own(fast, tmp_path):
    """A mask's fraction is logged only when a mask is on (no empty keys elsewhere)."""
    _, rows, _ = _run(fast, tmp_path, [])
    assert not any("loss/masked_frac" in r for r in rows)
    assert all("diag/masked_frac" not in r for r in rows)


def test_store_trainer_logp_measures_the_engine_gap(fast, tmp_path):
    """hf with generation.store_trainer_logp: the trainer's forward at the generating weights
    beside the sampler's cached decode; their gap is float rounding, not 0 by construction."""
    _, rows, run_dir = _run(fast, tmp_path, ["generation.store_trainer_logp=true"])
    kls = [r["diag/mismatch_kl"] for r in rows if "diag/mismatch_kl" in r]
    assert kls and all(0 <= k < 1e-6 for k in kls)
    assert any("generation/behaviour_logp_absdiff_max" in r for r in rows)


def test_max_staleness_drop_counts_what_it_refuses(fast, tmp_path):
    """Weights pushed every 4 steps: rollouts arrive up to 3 versions old; k = 1 refuses the
    older ones, every rollout is still accounted for, and the composition shows the gap."""
    summary, rows, _ = _run(
        fast, tmp_path, ["schedule.sync_every=4", "buffer.max_staleness=1", "schedule.max_steps=8"]
    )
    runtime = summary["runtime"]
    assert runtime["dropped_stale"] > 0
    assert runtime["generated"] == runtime["added"] + runtime["dropped_stale"]
    assert rows[-1]["buffer/dropped_stale_total"] == runtime["dropped_stale"]
    assert rows[-1]["data/generated_count"] == runtime["generated"]


def test_staleness_wait_runs_in_the_distributed_runtime(fast, tmp_path):
    summary, rows, _ = _run(
        fast, tmp_path,
        [*RUNTIMES["distributed"], "buffer.max_staleness=1", "buffer.staleness_policy=wait"],
    )  # fmt: skip
    assert summary["runtime"]["balanced"] and "runtime/wait_seconds" in rows[-1]


def test_staleness_wait_is_refused_in_process(tmp_path):
    with pytest.raises(ConfigError, match="buffer.staleness_policy=wait needs runtime=distributed"):
        resolve(compose(["buffer.max_staleness=2", "buffer.staleness_policy=wait"]))
    with pytest.raises(ConfigError, match="needs buffer.max_staleness=k"):
        resolve(compose([*RUNTIMES["distributed"], "buffer.staleness_policy=wait"]))


class _Buffer:
    def __init__(self, versions):
        self.versions = versions

    def __len__(self):
        return len(self.versions)

    def newest_version(self):
        return max(self.versions, default=-1)


def test_must_wait():
    drop = SimpleNamespace(staleness_policy="drop", max_staleness=1)
    wait = SimpleNamespace(staleness_policy="wait", max_staleness=1)
    assert must_wait(drop, _Buffer([]), 5)  # empty: always
    assert not must_wait(drop, _Buffer([0]), 5)  # drop trains on what it holds
    assert must_wait(wait, _Buffer([3]), 5)  # newest 2 versions old > k = 1
    assert not must_wait(wait, _Buffer([3, 4]), 5)


def test_admission_drops_by_version_lag():
    from replay_exp.buffer import make_buffer

    buf = make_buffer(
        {"name": "fifo", "capacity": 8, "max_staleness": 2}, max_prompt_len=2,
        max_completion_len=2, seed=0,
    )  # fmt: skip
    b = rollout_batch([[1, 2]] * 4, [[3, 4]] * 4, version=[5, 3, 2, 7])
    buf.add(b, step=5)  # lags 0, 2, 3, -2: the lag-3 row is refused
    assert len(buf) == 3 and buf.counters["dropped_stale_total"] == 1
    assert buf.newest_version() == 7
