"""Snapshots (replay_exp/checkpoint.py) and the run-dir decision of replay_exp.train: atomic
writes, corrupt-file fallback, the ``latest`` pointer, keep-last-N, weights-only round trips of
every component, metrics truncation, and fresh / resume / finished / refused run dirs."""

from __future__ import annotations

import json
import os
import random
import re

import numpy as np
import pytest
import torch

from replay_exp import checkpoint as ck
from replay_exp.buffer import make_buffer
from replay_exp.checkpoint import (
    RUN_LAYOUT,
    Checkpointer,
    CheckpointError,
    GeneratorState,
    RNGState,
    RunSnapshots,
    SnapshotWarning,
    load_latest,
)
from replay_exp.compute.ledger import Ledger
from replay_exp.config.composition import compose
from replay_exp.config.derive import resolve
from replay_exp.config.errors import ConfigError
from replay_exp.rollout import HFGenerator
from replay_exp.rollout.synthetic import random_rollouts
from replay_exp.types import RolloutBatch


class Counter:
    """A minimal component: one int, and an optional failure inside ``state_dict``."""

    def __init__(self, n: int = 0, fail: bool = False):
        self.n, self.fail = n, fail

    def state_dict(self) -> dict:
        if self.fail:
            raise RuntimeError("simulated crash in the middle of a snapshot")
        return {"n": self.n, "t": torch.full((3,), float(self.n))}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


def _save_steps(root, steps, keep=2):
    c = Counter()
    ckpt = Checkpointer(root, {"a": c, "b": Counter(7)}, keep=keep)
    for s in steps:
        c.n = s
        ckpt.save(s, first_eval={"eval/pass@1": 0.5}, last_eval={"eval/pass@1": s / 10})
    return ckpt


def _dirs(root):
    return sorted(p.name for p in root.iterdir())


# ------------------------------------------------------------------------------ round trips


def _rollouts(R: int, step: int) -> RolloutBatch:
    return random_rollouts(R, step, step * R, p_width=4, c_width=3, seed=step)


def _components(seed: int, private_generator: bool = True):
    torch.manual_seed(seed)
    policy = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    gen = HFGenerator(policy, pad_id=0, eos_id=1, share_weights=not private_generator)
    sizes = dict(capacity=8, max_prompt_len=4, max_completion_len=3, seed=seed)
    buffer = make_buffer({"name": "fifo"}, **sizes)
    queue = make_buffer({"name": "on_policy"}, **sizes)
    ledger = Ledger(mu=2.0, batch_size=4, n_params=15, n_layers=1, hidden=4)
    return {
        "policy": policy,
        "optimizer": opt,
        "generator": GeneratorState(gen),
        "buffer": buffer,
        "queue": queue,
        "ledger": ledger,
        "rng": RNGState(),
    }


def _advance(c, step: int) -> None:
    """One fake training step touching every component's state."""
    loss = c["policy"](torch.randn(2, 4)).pow(2).sum()
    c["optimizer"].zero_grad()
    loss.backward()
    c["optimizer"].step()
    gen = c["generator"].generator
    if not gen.share_weights:
        gen.model.load_state_dict(c["policy"].state_dict())
    gen.version = step
    for buf in (c["buffer"], c["queue"]):
        buf.add(_rollouts(4, step), step)
        buf.sample(3, step)
    c["ledger"].add_generation(torch.full((4,), 5), 12, seconds=0.1 * step)
    c["ledger"].add_training(torch.full((3,), 5), 9, seconds=0.2)


def _state(c) -> dict:
    """Everything observable: parameters, optimizer moments, buffers, ledger, next draws."""
    gen = c["generator"].generator
    return {
        "policy": [p.detach().clone() for p in c["policy"].parameters()],
        "opt": {k: v.clone() for k, v in c["optimizer"].state_dict()["state"][0].items()},
        "gen": ([p.detach().clone() for p in gen.model.parameters()], gen.version),
        "buffer_stats": c["buffer"].stats(),
        "queue_stats": c["queue"].stats(),
        "buffer_next": c["buffer"].sample(3, 99).uid_B.tolist(),
        "ledger": c["ledger"].metrics(),
    }


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and np.isnan(a):
        return np.isnan(b)
    return a == b


@pytest.mark.parametrize("private_generator", [True, False])
def test_every_component_round_trips_through_weights_only_files(tmp_path, private_generator):
    src = _components(seed=0, private_generator=private_generator)
    for step in range(3):
        _advance(src, step)
    Checkpointer(tmp_path, src).save(3, first_eval=None, last_eval={"eval/pass@1": 0.25})
    for f in (tmp_path / "step_000003").glob("*.pt"):  # each file alone is weights-only safe
        torch.load(f, weights_only=True)

    dst = _components(seed=1, private_generator=private_generator)  # different init and seed
    snap = load_latest(tmp_path)
    assert snap.step == 3 and snap.skipped == []
    trainer = Checkpointer(tmp_path, dst).restore(snap)
    assert trainer == {"first_eval": None, "last_eval": {"eval/pass@1": 0.25}}
    # Restored == source, and both continue identically (buffer RNG, global RNG, optimizer).
    assert _equal(_state(src), _state(dst))
    draws = []
    for c in (src, dst):
        c["rng"].load_state_dict(snap.states["rng"])
        draws.append((torch.rand(3), np.random.rand(3).tolist(), random.random()))
    assert _equal(draws[0], draws[1])


def test_rng_state_restores_torch_numpy_and_python_streams():
    rng = RNGState()
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    np.random.normal()  # leaves a cached gaussian in numpy's legacy state
    state = rng.state_dict()
    first = (torch.rand(4), np.random.normal(size=4), [random.random() for _ in range(4)])
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    rng.load_state_dict(state)
    again = (torch.rand(4), np.random.normal(size=4), [random.random() for _ in range(4)])
    assert torch.equal(first[0], again[0])
    assert np.array_equal(first[1], again[1]) and first[2] == again[2]


def test_generator_state_refuses_a_snapshot_of_the_other_kind():
    private = _components(0, private_generator=True)["generator"]
    shared = _components(0, private_generator=False)["generator"]
    with pytest.raises(CheckpointError, match="private weight copy"):
        shared.load_state_dict(private.state_dict())
    with pytest.raises(CheckpointError, match="private weight copy"):
        private.load_state_dict(shared.state_dict())


def test_restore_names_missing_components(tmp_path):
    Checkpointer(tmp_path, {"a": Counter(1)}).save(0)
    with pytest.raises(CheckpointError, match=r"holds components \['a'\], this run has"):
        Checkpointer(tmp_path, {"a": Counter(), "schedule": Counter()}).restore(
            load_latest(tmp_path)
        )


# ------------------------------------------------------------------- a run's one snapshot layout


def _run_values(n_trainers: int, step: int) -> dict:
    """A run's snapshot values as a runtime hands them over (one shard per trainer)."""
    c = _components(seed=step)
    _advance(c, step)
    return {
        "policy": c["policy"].state_dict(),
        "optimizer": c["optimizer"].state_dict(),
        "buffers": [c["buffer"].state_dict() for _ in range(n_trainers)],
        "ledgers": [
            Ledger(mu=2.0, batch_size=4 + t, n_params=15, n_layers=1, hidden=4).state_dict()
            for t in range(n_trainers)
        ],
        "source": {"next_batch": {0: 3}, "received": {t: {0: 8} for t in range(n_trainers)}},
    }


@pytest.mark.parametrize("n_trainers", [1, 2], ids=["inprocess", "distributed"])
def test_run_snapshot_has_one_layout_and_restores_each_trainers_entry(tmp_path, n_trainers):
    logs = tmp_path / "metrics.jsonl"
    logs.write_text('{"step": 0}\n')
    snaps = RunSnapshots(tmp_path, keep=2, log_files=["metrics.jsonl"])
    values = _run_values(n_trainers, step=2)
    snaps.save(2, values, first_eval=None, last_eval={"eval/pass@1": 0.5}, runtime={"n": 1})
    step_dir = tmp_path / "checkpoints" / "step_000002"
    assert sorted(p.name for p in step_dir.glob("*.pt")) == sorted(f"{n}.pt" for n in RUN_LAYOUT)
    assert all(slot.value is None for slot in snaps.slots.values())  # nothing held after a save

    got = {}
    for rank in range(n_trainers):  # each trainer loads its own buffer and ledger entry
        trainer = RunSnapshots(tmp_path, 2, ["metrics.jsonl"]).restore(
            load_latest(tmp_path / "checkpoints"), rank,
            **{name: (lambda s, name=name, rank=rank: got.__setitem__((name, rank), s))
               for name in RUN_LAYOUT},
        )  # fmt: skip
        assert trainer == {"first_eval": None, "last_eval": {"eval/pass@1": 0.5},
                           "runtime": {"n": 1}}  # fmt: skip
        assert _equal(got["ledgers", rank], values["ledgers"][rank])
        assert _equal(got["buffers", rank], values["buffers"][rank])
        assert _equal(got["policy", rank], values["policy"])
        assert got["source", rank] == values["source"]


def test_run_snapshot_refuses_other_components_and_names_a_state_that_does_not_fit(tmp_path):
    snaps = RunSnapshots(tmp_path, keep=2, log_files=[])
    with pytest.raises(ValueError, match=r"holds \['buffers', 'ledgers', 'optimizer'"):
        snaps.save(0, {"policy": {}})
    snaps.save(0, _run_values(1, step=0), first_eval=None, last_eval={})
    snap = load_latest(tmp_path / "checkpoints")
    noop = {name: (lambda s: None) for name in RUN_LAYOUT}
    with pytest.raises(CheckpointError, match=r"buffers\.pt does not fit this run's buffers"):
        snaps.restore(snap, 1, **noop)  # a trainer rank the snapshot has no shard for
    policy = torch.nn.Linear(5, 3)  # another shape than the saved Linear(4, 3)
    with pytest.raises(CheckpointError, match=r"policy\.pt does not fit this run's policy"):
        snaps.restore(snap, 0, **{**noop, "policy": policy.load_state_dict})


# ------------------------------------------------------------------------------ atomic writes


def test_crash_inside_state_dict_leaves_no_partial_snapshot(tmp_path):
    ckpt = _save_steps(tmp_path, [0, 2])
    ckpt.components["b"].fail = True  # "a" is written, then "b" raises mid-snapshot
    with pytest.raises(RuntimeError, match="simulated crash"):
        ckpt.save(4)
    assert _dirs(tmp_path) == ["latest", "step_000000", "step_000002"]  # no temp dir either
    assert (tmp_path / "latest").read_text() == "step_000002\n"
    assert load_latest(tmp_path).step == 2


def test_crash_inside_torch_save_leaves_no_partial_snapshot(tmp_path, monkeypatch):
    ckpt = _save_steps(tmp_path, [0])
    real_save = torch.save
    calls = []

    def half_save(obj, f):  # writes some bytes of the second file, then dies
        calls.append(1)
        if len(calls) == 2:
            f.write(b"PK\x03\x04 partial")
            raise OSError("disk full")
        real_save(obj, f)

    monkeypatch.setattr(ck.torch, "save", half_save)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save(2)
    assert _dirs(tmp_path) == ["latest", "step_000000"]
    assert load_latest(tmp_path).step == 0


def test_a_killed_save_leaves_only_a_temp_dir_which_is_ignored_then_removed(tmp_path):
    ckpt = _save_steps(tmp_path, [0])
    (tmp_path / ".tmp_step_000002_abc").mkdir()  # what SIGKILL mid-save leaves behind
    (tmp_path / ".tmp_step_000002_abc" / "a.pt").write_bytes(b"partial")
    (tmp_path / ".latest.xyz.tmp").write_text("step_000002")
    assert load_latest(tmp_path).step == 0
    ckpt.save(2)
    assert _dirs(tmp_path) == ["latest", "step_000000", "step_000002"]


# ------------------------------------------------------------------------------ corrupt files


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "meta"])
def test_corrupt_newest_snapshot_falls_back_with_a_warning_naming_the_file(tmp_path, damage):
    _save_steps(tmp_path, [0, 2, 4], keep=2)
    bad = tmp_path / "step_000004" / ("meta.json" if damage == "meta" else "a.pt")
    data = bad.read_bytes()
    if damage == "truncate":
        bad.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        bad.write_bytes(data[:-30] + bytes([data[-30] ^ 1]) + data[-29:])
    elif damage == "delete":
        bad.unlink()
    else:
        bad.write_text('{"format": 1, "step": 4, "trai')
    with pytest.warns(SnapshotWarning, match=str(bad)):
        snap = load_latest(tmp_path)
    assert snap.step == 2 and str(bad) in snap.skipped[0]
    assert snap.states["a"]["n"] == 2


def test_no_good_snapshot_is_an_error_naming_the_files(tmp_path):
    _save_steps(tmp_path, [0, 2])
    for step in (0, 2):
        (tmp_path / f"step_00000{step}" / "b.pt").write_bytes(b"garbage")
    with pytest.warns(SnapshotWarning), pytest.raises(CheckpointError) as err:
        load_latest(tmp_path)
    msg = str(err.value)
    assert "\n" not in msg
    assert str(tmp_path / "step_000002" / "b.pt") in msg
    assert str(tmp_path / "step_000000" / "b.pt") in msg


# ------------------------------------------------------------------------------ pointer, keep


def test_pointer_names_the_committed_snapshot(tmp_path):
    assert load_latest(tmp_path / "nothing") is None
    _save_steps(tmp_path, [0, 2])
    assert (tmp_path / "latest").read_text() == "step_000002\n"
    # A newer dir the pointer does not name yet (killed between rename and pointer update):
    # the pointer wins; both are complete snapshots of the same deterministic run anyway.
    Checkpointer(tmp_path, {"a": Counter(4), "b": Counter()}, keep=9).save(4)
    (tmp_path / "latest").write_text("step_000002\n")
    assert load_latest(tmp_path).step == 2
    # No pointer: the newest dir.
    (tmp_path / "latest").unlink()
    assert load_latest(tmp_path).step == 4
    # A pointer to a missing dir: a warning naming the pointer, then the newest dir.
    (tmp_path / "latest").write_text("step_000010\n")
    with pytest.warns(SnapshotWarning, match="latest names 'step_000010'"):
        assert load_latest(tmp_path).step == 4
    # A pointer and no snapshot at all: an error, not a fresh start.
    for p in tmp_path.glob("step_*"):
        for f in p.iterdir():
            f.unlink()
        p.rmdir()
    with pytest.warns(SnapshotWarning), pytest.raises(CheckpointError, match="no good snapshot"):
        load_latest(tmp_path)


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_keeps_the_last_n_snapshots(tmp_path, keep):
    _save_steps(tmp_path, [0, 2, 4, 6, 8], keep=keep)
    want = [f"step_{s:06d}" for s in [0, 2, 4, 6, 8][-keep:]]
    assert _dirs(tmp_path) == ["latest", *want]


def test_a_save_after_falling_back_replaces_the_bad_snapshot_and_drops_stale_ones(tmp_path):
    _save_steps(tmp_path, [2, 4, 6], keep=3)
    (tmp_path / "step_000004" / "a.pt").write_bytes(b"bad")
    (tmp_path / "step_000006" / "a.pt").write_bytes(b"bad")
    with pytest.warns(SnapshotWarning):
        assert load_latest(tmp_path).step == 2
    Checkpointer(tmp_path, {"a": Counter(4), "b": Counter()}, keep=3).save(4)  # resumed at 2
    assert _dirs(tmp_path) == ["latest", "step_000002", "step_000004"]  # stale 6 gone
    assert load_latest(tmp_path).states["a"]["n"] == 4


# ------------------------------------------------------------------------------ metrics, config


def test_truncate_metrics_keeps_rows_up_to_the_step_byte_for_byte(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [json.dumps({"step": s, "x": s / 3}) + "\n" for s in range(6)]
    path.write_text("".join(rows) + '{"step": 6, "x": 0.')  # a row cut by SIGKILL
    assert ck.truncate_metrics(path, 3) == 3
    assert path.read_text() == "".join(rows[:4])
    inode = os.stat(path).st_ino
    assert ck.truncate_metrics(path, 3) == 0
    assert os.stat(path).st_ino == inode  # nothing to drop: the file is not rewritten
    assert ck.metrics_steps(path) == [0, 1, 2, 3]


def test_config_differences_names_keys_and_ignores_cosmetic_ones():
    saved = {"a": {"b": 1, "c": [1, 2]}, "run_dir": "x", "gone": 3, "unused": None}
    now = {"a": {"b": 2, "c": [1, 2]}, "run_dir": "y", "new": {"k": 0, "null": None}}
    # A key absent on one side and null on the other is no difference (an older config listing
    # a knob its option does not use, or a derived size it did not record).
    assert ck.config_differences(saved, now, ignore=["run_dir"]) == [
        ("a.b", 1, 2),
        ("gone", 3, ck.MISSING_VALUE),
        ("new.k", ck.MISSING_VALUE, 0),
    ]


# ------------------------------------------------------------------------------ run dirs


@pytest.fixture
def over(fast, tmp_path):
    return [*fast, "schedule.max_steps=4", f"run_dir={tmp_path / 'run'}"]


@pytest.fixture
def resolved(over):
    return resolve(compose(over))


def _write_run(
    run_dir, cfg, d, metrics_steps=(0,), finished=False, snapshot_steps=(), layout=RUN_LAYOUT
):
    """A run dir as a run leaves it; its snapshots hold one Counter per name of ``layout``."""
    from replay_exp.rundir import config_yaml

    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(config_yaml(cfg, d))
    (run_dir / "metrics.jsonl").write_text("".join(f'{{"step": {s}}}\n' for s in metrics_steps))
    for s in snapshot_steps:
        parts = {name: Counter(s) for name in layout}
        Checkpointer(run_dir / "checkpoints", parts).save(s, first_eval=None)
    if finished:
        (run_dir / "summary.json").write_text(json.dumps({"status": "finished", "steps": 4}))
    return _files(run_dir)


def _files(run_dir):
    return {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def test_run_dir_decisions(over, resolved, tmp_path):
    from replay_exp.rundir import prepare_run_dir

    cfg, d = resolved
    run_dir = tmp_path / "run"
    start = prepare_run_dir(cfg, d)  # nothing there: fresh
    assert (start.run_dir, start.snapshot, start.finished) == (run_dir, None, None)
    assert not run_dir.exists()

    before = _write_run(run_dir, cfg, d, metrics_steps=[0, 2, 4], snapshot_steps=[0, 2])
    start = prepare_run_dir(cfg, d)  # resume from the newest snapshot
    assert start.snapshot.step == 2 and start.finished is None

    # Cosmetic keys may change; anything else may not, and the error names keys and values.
    cosmetic = ["logger.progress=true", "checkpoint.every=7", "checkpoint.keep=5"]
    assert prepare_run_dir(*resolve(compose([*over, *cosmetic]))).snapshot.step == 2
    changed = resolve(compose([*over, "seed=5", "logger.log_every=2"]))
    with pytest.raises(ConfigError) as err:
        prepare_run_dir(*changed)
    assert str(err.value) == (
        f"run_dir={run_dir} already holds a run with a different config: "
        "logger.log_every=1 there, 2 here; seed=0 there, 5 here "
        "(resuming needs the same config; or choose another run_dir)"
    )
    (run_dir / "summary.json").write_text(json.dumps({"status": "finished", "steps": 4}))
    start = prepare_run_dir(*changed)  # finished: skipped, with a note on the difference
    assert start.finished == {"status": "finished", "steps": 4}
    assert start.notes == [
        "note: this config differs from the run's: logger.log_every=1 there, 2 here; "
        "seed=0 there, 5 here"
    ]
    before[run_dir / "summary.json"] = (run_dir / "summary.json").read_bytes()
    assert _files(run_dir) == before  # deciding never writes


@pytest.mark.parametrize(
    ("metrics", "error"),
    [
        ([], None),  # died before the first eval finished: fresh
        ([0], None),  # died between the step-0 row and the step-0 snapshot: fresh
        ([0, 2], "metrics.jsonl up to step 2) but no snapshot"),  # e.g. checkpoint.every=0
    ],
)
def test_run_dir_without_snapshot(resolved, tmp_path, metrics, error):
    from replay_exp.rundir import prepare_run_dir

    cfg, d = resolved
    _write_run(tmp_path / "run", cfg, d, metrics_steps=metrics)
    if error is None:
        assert prepare_run_dir(cfg, d).snapshot is None
    else:
        with pytest.raises(ConfigError, match=re.escape(error)):
            prepare_run_dir(cfg, d)


def test_run_dir_with_only_bad_snapshots_is_an_error(resolved, tmp_path):
    from replay_exp.rundir import prepare_run_dir

    cfg, d = resolved
    _write_run(tmp_path / "run", cfg, d, metrics_steps=[0, 2], snapshot_steps=[0, 2])
    for p in (tmp_path / "run" / "checkpoints").glob("step_*/policy.pt"):
        p.write_bytes(b"x")
    with pytest.warns(SnapshotWarning), pytest.raises(CheckpointError, match="policy.pt is trunc"):
        prepare_run_dir(cfg, d)


def test_a_snapshot_of_another_layout_is_refused_before_anything_is_cut(resolved, tmp_path):
    """A snapshot written by another version (other component files) is refused when the run
    dir is read, with one line naming both layouts, and nothing in the run dir changes (its
    metrics.jsonl past the snapshot is not cut back for a resume that cannot happen)."""
    from replay_exp.rundir import prepare_run_dir

    cfg, d = resolved
    run_dir = tmp_path / "run"
    before = _write_run(run_dir, cfg, d, [0, 2, 4], snapshot_steps=[2], layout=("a", "policy"))
    with pytest.raises(CheckpointError, match=r"holds components \['a', 'policy'\], not this"):
        prepare_run_dir(cfg, d)
    assert _files(run_dir) == before
