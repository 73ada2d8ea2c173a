"""The runtime's messages: torch.distributed point-to-point sends over gloo (CPU tensors),
announced through the rendezvous store.

They travel over ``links`` (:func:`open_links`), a gloo group of all W + T ranks made on its
own, never the process's default group: the trainers' default group is theirs alone (DDP,
FSDP, gathers), and a generator has none, so an engine that makes its own torch.distributed
world (vLLM does, even for one process) is free to.

A posted gloo receive cannot be polled (``is_completed`` stays False until ``wait``), so every
message is announced: the sender posts its sends, then bumps a counter in the store
(``store.add``); the receiver reads the counter (``store.add(key, 0)``) and receives exactly
the announced messages, which are already on their way, so its receives never wait on an idle
peer. Channels are one-directional and ordered per pair of ranks and tag.

- rollouts, generator w -> trainer t (counter ``msgs/w/t``): a header ``[kind, n]`` (tag
  ``TAG_HEADER``) then, for ``kind = ROLLOUTS``, the payload of n bytes (``torch.save`` of a
  dict of tensors, tag ``TAG_PAYLOAD``). ``kind = DONE``: the generator stops, and n is how
  many rollouts it sent to t over the whole run. A generator keeps at most ``max_in_flight``
  messages in flight per trainer (``runtime.max_in_flight``): before one more, it waits until
  the oldest was received (the back-pressure of a busy trainer, measured as
  ``stall_seconds``). With 1, a generator faster than its trainers delivers one batch per
  trainer step and idles the rest of the time.
- weights, trainer rank 0 -> generator w (counters ``pushes/w``, ``taken/w``): the version
  (tag ``TAG_VERSION``), then the flattened weights (tag ``TAG_WEIGHTS``); version ``STOP``
  (no weights) ends the generator. A generator takes pushes between generation calls, never
  mid-sequence. Rank 0 skips a push to a generator that has not taken the previous one
  (counted): trainers never wait for generators.

Liveness: a dead peer is invisible until one waits on it, so each generator runs a heartbeat
thread bumping ``heartbeat/<rank>`` in the store (:class:`Heartbeat`); trainers read it every
step (:class:`HeartbeatMonitor`). A process that dies closes its connections (gloo fails at
once: connection reset); a host that goes away does not, and a receive of a message announced
just before would wait for the group's timeout (``runtime.rendezvous_timeout_s``, minutes:
seen on the emulated hosts of scripts/two_hosts.sh with a link cut). So the trainers' waits
on a generator's bytes are bounded by ``wait_s`` (``runtime.heartbeat_timeout_s``, the time
after which a silent generator is dead anyway): past it the generator joins ``broken``.
"""

from __future__ import annotations

import io
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

TAG_HEADER, TAG_PAYLOAD, TAG_VERSION, TAG_WEIGHTS = 11, 12, 13, 14
ROLLOUTS, DONE = 1, 2
STOP = -1


def pack(obj: Any) -> torch.Tensor:
    """``obj`` (tensors, numbers, strings in dicts and lists) as a uint8 tensor."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def unpack(payload: torch.Tensor) -> Any:
    return torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=True)


class RolloutSender:
    """A generator's outgoing rollout messages, at most ``max_in_flight`` per trainer."""

    def __init__(
        self, store: dist.Store, links, worker: int, trainers: list[int], max_in_flight: int
    ):
        self.store, self.links, self.worker = store, links, worker
        self.max_in_flight = max_in_flight
        # per trainer: the messages in flight, oldest first, each a list of (work, tensor)
        self.pending: dict[int, list[list[tuple[Any, torch.Tensor]]]] = {t: [] for t in trainers}
        self.sent = dict.fromkeys(trainers, 0)  # rollouts sent to each trainer (this process)
        self.stall_seconds = 0.0  # time spent waiting for a trainer to take the previous one

    def _drain(self, trainer: int, keep: int = 0) -> None:
        """Wait until at most ``keep`` messages to ``trainer`` are in flight."""
        t0 = time.perf_counter()
        while len(self.pending[trainer]) > keep:
            for work, _ in self.pending[trainer].pop(0):
                work.wait()
        self.stall_seconds += time.perf_counter() - t0

    def _post(self, trainer: int, kind: int, n: int, payload: torch.Tensor | None) -> None:
        self._drain(trainer, keep=self.max_in_flight - 1)
        header = torch.tensor([kind, n], dtype=torch.long)
        works = [(self.links.send([header], trainer, TAG_HEADER), header)]
        if payload is not None:
            works.append((self.links.send([payload], trainer, TAG_PAYLOAD), payload))
        self.pending[trainer].append(works)
        self.store.add(f"msgs/{self.worker}/{trainer}", 1)

    def send(self, trainer: int, obj: dict, n_rollouts: int) -> None:
        payload = pack(obj)
        self._post(trainer, ROLLOUTS, payload.numel(), payload)
        self.sent[trainer] += n_rollouts

    def close(self, sent_total: dict[int, int]) -> None:
        """Tell every trainer this generator is done, with the rollouts it sent to it."""
        for t in self.pending:
            self._post(t, DONE, sent_total[t], None)
        for t in self.pending:
            self._drain(t)


class RolloutReceiver:
    """A trainer's incoming rollout messages from every generator."""

    def __init__(self, store: dist.Store, links, rank: int, generators: list[int], first: int,
                 wait_s: float | None = None):  # fmt: skip
        """``generators``: their global ranks; generator index = rank - ``first``;
        ``wait_s``: the longest wait on an announced message's bytes (None: the group's)."""
        self.store, self.links, self.rank, self.first = store, links, rank, first
        self.wait = () if wait_s is None else (timedelta(seconds=wait_s),)
        self.taken = dict.fromkeys(generators, 0)  # messages received from each
        self.done: dict[int, int] = {}  # generator -> rollouts it says it sent here
        self.broken: set[int] = set()  # generators whose connection failed mid-message

    def poll(self) -> list[tuple[int, dict]]:
        """Every announced message, as (generator rank, payload). A generator that dies while
        sending one (gloo: connection reset), or whose bytes do not come within ``wait_s`` (a
        lost host), joins ``broken``; its partial message is lost."""
        out = []
        for g in self.open:
            announced = self.store.add(f"msgs/{g - self.first}/{self.rank}", 0)
            try:
                while self.taken[g] < announced and g not in self.done:
                    header = torch.zeros(2, dtype=torch.long)
                    self.links.recv([header], g, TAG_HEADER).wait(*self.wait)
                    kind, n = (int(x) for x in header)
                    if kind == DONE:
                        self.taken[g] += 1
                        self.done[g] = n
                        break
                    payload = torch.empty(n, dtype=torch.uint8)
                    self.links.recv([payload], g, TAG_PAYLOAD).wait(*self.wait)
                    self.taken[g] += 1
                    out.append((g, unpack(payload)))
            except RuntimeError:
                self.broken.add(g)
        return out

    @property
    def open(self) -> list[int]:
        """Generators that have not said DONE and whose connection holds."""
        return sorted(g for g in self.taken if g not in self.done and g not in self.broken)


class WeightPusher:
    """Trainer rank 0's weight pushes to the generators (global ranks ``first``...)."""

    def __init__(self, store: dist.Store, links, generators: list[int], first: int,
                 wait_s: float | None = None):  # fmt: skip
        self.store, self.links, self.first = store, links, first
        self.wait = () if wait_s is None else (timedelta(seconds=wait_s),)
        self.pending: dict[int, list[tuple[Any, torch.Tensor]]] = {g: [] for g in generators}
        self.count = dict.fromkeys(generators, 0)  # pushes sent to each (STOP included)
        self.pushed = 0
        self.skipped = 0  # pushes not sent: the generator had not taken the previous one
        self.gone: set[int] = set()  # generators whose connection closed under a push

    def _send(self, g: int, version: int, flat: torch.Tensor | None) -> bool:
        """Send ``version`` (and ``flat``) to ``g``; False if its connection closed (it died:
        it joins ``gone`` and gets nothing more)."""
        try:
            for w, _ in self.pending[g]:
                w.wait(*self.wait)  # taken already (or about to be: the generator counted it)
            header = torch.tensor([version], dtype=torch.long)
            works = [(self.links.send([header], g, TAG_VERSION), header)]
            if flat is not None:
                works.append((self.links.send([flat], g, TAG_WEIGHTS), flat))
        except RuntimeError:  # gloo: "Connection closed by peer", or a wait past wait_s
            self.gone.add(g)
            return False
        self.pending[g] = works
        self.count[g] += 1
        self.store.add(f"pushes/{g - self.first}", 1)
        return True

    def push(self, version: int, flat: torch.Tensor) -> None:
        for g in self.pending:
            if g in self.gone:
                continue
            if self.store.add(f"taken/{g - self.first}", 0) < self.count[g]:
                self.skipped += 1
                continue
            if self._send(g, version, flat):
                self.pushed += 1

    def stop(self, dead: set[int] = frozenset()) -> list[int]:
        """STOP to every live generator (queued behind a push it has not taken). Returns the
        generators found gone (their connection closed, now or under an earlier push)."""
        for g in self.pending:
            if g not in dead and g not in self.gone:
                self._send(g, STOP, None)
        return sorted(self.gone)


class WeightReceiver:
    """A generator's incoming weight pushes."""

    def __init__(self, store: dist.Store, links, worker: int, numel: int, dtype: torch.dtype):
        self.store, self.links, self.worker = store, links, worker
        self.numel, self.dtype = numel, dtype
        self.taken = 0

    def poll(self) -> tuple[int, torch.Tensor | None] | None:
        """None if nothing new; (STOP, None); or (version, flat weights)."""
        if self.store.add(f"pushes/{self.worker}", 0) <= self.taken:
            return None
        header = torch.zeros(1, dtype=torch.long)
        self.links.recv([header], 0, TAG_VERSION).wait()
        version, flat = int(header), None
        if version != STOP:
            flat = torch.empty(self.numel, dtype=self.dtype)
            self.links.recv([flat], 0, TAG_WEIGHTS).wait()
        self.taken += 1
        self.store.add(f"taken/{self.worker}", 1)
        return version, flat


def open_links(store: dist.Store, rank: int, world: int, timeout) -> dist.ProcessGroup:
    """The channels' point-to-point group of every rank (module docstring)."""
    return dist.ProcessGroupGloo(dist.PrefixStore("links", store), rank, world, timeout)


def weight_keys(state: dict[str, torch.Tensor]) -> list[str]:
    """The floating-point entries of a state dict, in a fixed order: what a push carries."""
    return sorted(k for k, v in state.items() if torch.is_floating_point(v))


def flatten(state: dict[str, torch.Tensor], keys: list[str]) -> torch.Tensor:
    return torch.cat([state[k].detach().reshape(-1).cpu() for k in keys])


def unflatten_into(model: torch.nn.Module, flat: torch.Tensor, keys: list[str]) -> None:
    state = model.state_dict()
    i = 0
    with torch.no_grad():
        for k in keys:
            n = state[k].numel()
            state[k].copy_(flat[i : i + n].view_as(state[k]))
            i += n
    if i != flat.numel():
        raise RuntimeError(f"weight push of {flat.numel()} values, the model has {i}")


class Heartbeat:
    """A daemon thread that bumps ``heartbeat/<rank>`` in the store every ``every`` seconds
    while the process lives."""

    def __init__(self, store: dist.Store, rank: int, every: float = 1.0):
        self.store, self.key, self.every = store, f"heartbeat/{rank}", every
        self.store.set(self.key, "0")
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        beat = 0
        while not self._stop.wait(self.every):
            beat += 1
            try:
                self.store.set(self.key, str(beat))
            except Exception:  # the store (rank 0) is gone: the job is ending
                return

    def stop(self) -> None:
        self._stop.set()


class HeartbeatMonitor:
    """Reads the generators' heartbeats; a counter that has not moved for ``timeout`` seconds
    of this process's clock means its generator is dead (or hung)."""

    def __init__(self, store: dist.Store, ranks: list[int], timeout: float):
        self.store, self.timeout = store, timeout
        now = time.monotonic()
        self.last = {r: (self._read(r), now) for r in ranks}

    def _read(self, rank: int) -> bytes:
        return self.store.get(f"heartbeat/{rank}")

    def dead(self, ranks: list[int]) -> list[int]:
        now, out = time.monotonic(), []
        for r in ranks:
            value = self._read(r)
            if value != self.last[r][0]:
                self.last[r] = (value, now)
            elif now - self.last[r][1] > self.timeout:
                out.append(r)
        return out
