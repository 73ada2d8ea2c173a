"""runtime/channels.py on real parts: the messages a generator and a trainer exchange, over a
real ``TCPStore`` on localhost and the gloo group ``open_links`` makes, one rank per thread of
this process (gloo releases the GIL while it waits; a send completes only once the peer has
posted its receive, which is what the back-pressure relies on).

Framing: a rollout message (a dict of the batch's tensors, ``torch.save``d into a uint8
payload) round-trips exactly, and the receiver loads with ``weights_only`` (no code runs on
receipt). Announcing: a receiver reads only what the store's counter announces, so polling an
idle peer returns at once. Rollouts: in order, then DONE with the generator's count; at most
``max_in_flight`` in flight. Weights: a push arrives bitwise, a push to a generator that has
not taken the previous one is skipped, STOP ends it. Heartbeats: a stopped one is dead after
the timeout.
"""

from __future__ import annotations

import pickle
import threading
import time
from datetime import timedelta
from fractions import Fraction
from types import SimpleNamespace

import pytest
import torch

from replay_exp.runtime.channels import (
    STOP,
    Heartbeat,
    HeartbeatMonitor,
    RolloutReceiver,
    RolloutSender,
    WeightPusher,
    WeightReceiver,
    flatten,
    open_links,
    pack,
    unflatten_into,
    unpack,
    weight_keys,
)
from replay_exp.runtime.generator import batch_from_dict, batch_to_dict
from replay_exp.runtime.launch import _store, free_port
from replay_exp.types import RolloutBatch

TIMEOUT = 20  # seconds: any wait here that takes this long is a hang


def _in_thread(fn, *args) -> threading.Thread:
    """``fn(*args)`` in a daemon thread; its exception (if any) is kept on the thread."""

    def run():
        try:
            fn(*args)
        except BaseException as e:  # re-raised by _join
            thread.error = e

    thread = threading.Thread(target=run, daemon=True)
    thread.error = None
    thread.start()
    return thread


def _join(thread: threading.Thread) -> None:
    thread.join(TIMEOUT)
    assert not thread.is_alive(), "hung"
    if thread.error is not None:
        raise thread.error


@pytest.fixture
def ranks():
    """Rank 0 (a trainer: hosts the store) and rank 1 (a generator: a client of it), linked as
    the runtime links them (``open_links``; both ranks must join at once, hence the thread)."""
    port = free_port()
    stores = [_store("127.0.0.1", port, True, TIMEOUT), _store("127.0.0.1", port, False, TIMEOUT)]
    links = [None, None]

    def link(rank):
        links[rank] = open_links(stores[rank], rank, 2, timedelta(seconds=TIMEOUT))

    thread = _in_thread(link, 1)
    link(0)
    _join(thread)
    return [SimpleNamespace(store=s, links=g) for s, g in zip(stores, links, strict=True)]


def _batch(B: int = 3, P: int = 4, C: int = 5, seed: int = 0) -> RolloutBatch:
    """B rollouts with every field of its dtype (int64 ids, bool masks, float32 values)."""
    g = torch.Generator().manual_seed(seed)
    return RolloutBatch(
        prompt_ids_BxP=torch.randint(0, 100, (B, P), generator=g),
        prompt_mask_BxP=torch.rand(B, P, generator=g) > 0.3,
        completion_ids_BxC=torch.randint(0, 100, (B, C), generator=g),
        completion_mask_BxC=torch.rand(B, C, generator=g) > 0.3,
        behaviour_logp_BxC=-torch.rand(B, C, generator=g),
        reward_B=torch.tensor([1.0, 0.0, 1.0][:B]),
        advantage_B=torch.randn(B, generator=g),
        version_B=torch.full((B,), 7),
        created_step_B=torch.full((B,), 6),
        group_id_B=torch.arange(B) // 2,
        uid_B=torch.arange(B) + 1000 * seed,
        group_reward_B=torch.rand(B, generator=g),
        engine_gap_BxC=torch.zeros(B, C),
    )


def _message(seed: int) -> dict:
    """What a generator sends a trainer (runtime/generator.py ``generate_and_send``)."""
    return {"batch": batch_to_dict(_batch(seed=seed)), "generator": 0, "j": seed, "seconds": 0.25}


def _assert_same_message(got: dict, sent: dict) -> None:
    assert got.keys() == sent.keys()
    assert (got["generator"], got["j"], got["seconds"]) == (
        sent["generator"], sent["j"], sent["seconds"]
    )  # fmt: skip
    assert got["batch"].keys() == sent["batch"].keys()
    for k, v in sent["batch"].items():
        assert got["batch"][k].dtype == v.dtype, k
        assert torch.equal(got["batch"][k], v), k


def test_pack_round_trips_a_rollout_message_exactly():
    sent = _message(seed=1)
    payload = pack(sent)
    assert payload.dtype == torch.uint8 and payload.dim() == 1
    got = unpack(payload)
    _assert_same_message(got, sent)
    batch = batch_from_dict(got["batch"])  # what the trainer rebuilds
    assert len(batch) == 3 and batch.completion_mask_BxC.dtype == torch.bool
    # bfloat16 weights, nested lists and strings survive as well
    other = {"w": torch.randn(4, dtype=torch.bfloat16), "tags": ["a", [1, 2.5]], "n": None}
    again = unpack(pack(other))
    assert torch.equal(again["w"], other["w"]) and again["tags"] == ["a", [1, 2.5]]
    # The receiver loads with weights_only: an arbitrary object is refused, not constructed.
    with pytest.raises(pickle.UnpicklingError):
        unpack(pack({"x": Fraction(1, 3)}))


def test_rollouts_arrive_announced_in_order_then_done(ranks):
    trainer, generator = ranks
    sender = RolloutSender(generator.store, generator.links, worker=0, trainers=[0],
                           max_in_flight=4)  # fmt: skip
    receiver = RolloutReceiver(trainer.store, trainer.links, rank=0, generators=[1], first=1)
    t = time.perf_counter()
    assert receiver.poll() == []  # nothing announced: no receive is posted, nothing waits
    assert time.perf_counter() - t < 1.0
    sent = [_message(seed) for seed in range(3)]
    for i, message in enumerate(sent):
        sender.send(0, message, n_rollouts=3)
        assert trainer.store.add("msgs/0/0", 0) == i + 1  # announced once posted
    got = receiver.poll()
    assert [g for g, _ in got] == [1, 1, 1]
    for (_, message), expected in zip(got, sent, strict=True):
        _assert_same_message(message, expected)
    assert sender.sent == {0: 9} and receiver.taken == {1: 3}
    assert receiver.open == [1] and receiver.done == {}

    closing = _in_thread(sender.close, {0: 9})  # DONE, then waits until it was received
    deadline = time.monotonic() + TIMEOUT
    while not receiver.done and time.monotonic() < deadline:
        assert receiver.poll() == []
        time.sleep(0.01)
    _join(closing)
    assert receiver.done == {1: 9}  # the generator's own count, to check against
    assert receiver.taken == {1: 4} and receiver.open == []
    assert receiver.poll() == []  # a generator that said DONE is not read again


def test_a_busy_trainer_holds_back_the_generator(ranks):
    """max_in_flight = 1: the second message waits until the first was received (the
    generator's stall), and is announced only then."""
    trainer, generator = ranks
    sender = RolloutSender(generator.store, generator.links, 0, [0], max_in_flight=1)
    receiver = RolloutReceiver(trainer.store, trainer.links, rank=0, generators=[1], first=1)
    sending = _in_thread(lambda: [sender.send(0, _message(s), 3) for s in range(2)])
    deadline = time.monotonic() + TIMEOUT
    while trainer.store.add("msgs/0/0", 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)  # the trainer is busy
    assert trainer.store.add("msgs/0/0", 0) == 1  # the second one is held back
    got = receiver.poll()
    deadline = time.monotonic() + TIMEOUT
    while len(got) < 2 and time.monotonic() < deadline:
        got += receiver.poll()
        time.sleep(0.01)
    _join(sending)
    assert [m["j"] for _, m in got] == [0, 1]
    assert sender.stall_seconds >= 0.4


def test_weight_pushes_arrive_bitwise_skip_a_busy_generator_and_stop(ranks):
    trainer, generator = ranks
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    model.register_buffer("steps", torch.tensor(5))  # not floating point: never pushed
    keys = weight_keys(model.state_dict())
    assert keys == sorted(keys) and "steps" not in keys
    numel = sum(model.state_dict()[k].numel() for k in keys)
    pusher = WeightPusher(trainer.store, trainer.links, generators=[1], first=1)
    receiver = WeightReceiver(generator.store, generator.links, 0, numel, torch.float32)
    assert receiver.poll() is None  # nothing pushed: returns at once

    flats = []
    for version in (1, 2, 3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * version)
        flats.append(flatten(model.state_dict(), keys))
    pusher.push(1, flats[0])
    version, flat = receiver.poll()
    assert version == 1 and torch.equal(flat, flats[0])
    pusher.push(2, flats[1])  # taken the previous one: sent
    pusher.push(3, flats[2])  # push 2 not taken yet: skipped (trainers never wait)
    assert (pusher.pushed, pusher.skipped) == (2, 1)

    gone = []
    stopping = _in_thread(lambda: gone.append(pusher.stop()))
    version, flat = receiver.poll()  # push 2 first: STOP is queued behind it
    assert version == 2 and torch.equal(flat, flats[1])
    deadline = time.monotonic() + TIMEOUT
    while (news := receiver.poll()) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert news == (STOP, None)
    _join(stopping)
    assert gone == [[]] and pusher.count == {1: 3}

    # The generator's copy takes the pushed weights bitwise; a push of another size is refused.
    copy = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    copy.register_buffer("steps", torch.tensor(0))
    unflatten_into(copy, flats[1], keys)
    assert torch.equal(flatten(copy.state_dict(), keys), flats[1])
    with pytest.raises(RuntimeError, match=f"weight push of {numel + 1} values, the model has"):
        unflatten_into(copy, torch.zeros(numel + 1), keys)


def test_a_stopped_heartbeat_is_dead_after_the_timeout(ranks):
    trainer, generator = ranks
    beat = Heartbeat(generator.store, rank=1, every=0.05)
    monitor = HeartbeatMonitor(trainer.store, [1], timeout=1.0)
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:  # alive for longer than the timeout
        assert monitor.dead([1]) == []
        time.sleep(0.05)
    beat.stop()
    beat.thread.join(TIMEOUT)
    t0 = time.monotonic()
    while not monitor.dead([1]) and time.monotonic() - t0 < TIMEOUT:
        time.sleep(0.05)
    assert 0.8 <= time.monotonic() - t0 < 5  # dead once the counter stood still 1 s
