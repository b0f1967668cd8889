"""The shadow process: runs candidate models and compares them, outside the app's process.

``client_sdk.shadow_process.ShadowProcess`` starts it (a new interpreter calling ``main`` with
``<socket fd> <data dir> <persist every> <lower priority>``). Samples reach it without a
system call on the app's side: the app's thread copies each one (input, active outputs, a
header of int64s) into the next slot of a shared-memory ring and counts it in the shared
counters page (``WRITTEN``). This process says in the same page how many samples it finished
(``DONE``, which frees their slots), what it is running (``RUNNING``/``LOADING``: what was in
flight if it dies), and when it sleeps (``SLEEPING``; ``WAKEUPS`` and ``SLEEP_US`` count its
sleeps and say how long the latest may last). It never polls — a process waking every
millisecond on a small device evicts the app's caches and costs its predictions more than the
samples do (docs/benchmarks.md) — but sleeps on its socket, for as long as half a ring of
samples takes to arrive at the rate they came lately (``client_sdk.pace``), and runs them in
one batch; when the rate jumps and the ring is three quarters full, the app's thread wakes it
early through an ``eventfd`` (a system call, on those offers only; a wake-up lost to the race
between the two sides, which do not fence a store before a load, waits for the pace).
Everything else goes over one ``AF_UNIX``/``SOCK_SEQPACKET`` socket, as pickled tuples
(both ends are this package's own code): a sample's layout (model, shape variant, array names,
dtypes, shapes, offsets: ``LAYOUT``, sent once per layout), a new ring (``RING``, its file
descriptor passed with ``SCM_RIGHTS``), candidates to ``ATTACH``/``DETACH``, ``FLUSH`` and
``STOP``. Each carries the number of samples written before it was sent: those are
processed first, so a message and the samples around it are handled in the order the app
made them.

This process owns the candidates' ``ShadowStats`` while it runs: it loads them from the
``ShadowStore`` when a candidate is attached, hands every sample to the ``Evaluator``
(``client_sdk.shadow``: the sequence the thread worker runs too), which aggregates it and
persists the stats every ``persist every`` samples and on a decided verdict (this process then
tells the parent, ``DECIDED``); it persists them too on
``DETACH``, ``FLUSH`` and ``STOP`` (answered by ``ACK`` once done) and when the parent goes
away (end of file on the socket). It lowers its own CPU priority first (``SCHED_IDLE``, else
nice 19: the whole process is ours), so it runs only on cores the app leaves idle; holding its
own GIL, its comparisons never make the app's thread wait.
"""

from __future__ import annotations

import array
import mmap
import os
import pickle
import select
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from client_sdk.backends import Backend, open_backend
from client_sdk.background import lower_thread_priority
from client_sdk.install import Bundle, Member
from client_sdk.loaded import prepare_bundle
from client_sdk.pace import Pace
from client_sdk.shadow import Arrays, Evaluator, Session
from client_sdk.shadow_stats import PENDING, ShadowStats, ShadowStore

# Parent → child: (kind, samples written before it, ...).
ATTACH = "attach"      # (ATTACH, tag, model, bundle, number): load it, resume its stats
DETACH = "detach"      # (DETACH, tag, seq, model, dropped): persist and forget; ACK seq
LAYOUT = "layout"      # (LAYOUT, tag, id, model, shape_variant, [Spec]): how samples lie
RING = "ring"          # (RING, tag, slot size) + its fd: samples from tag on are in this one
COUNTERS = "counters"  # (COUNTERS, 0) + the counters page's fd and the wake-up eventfd: first
FLUSH = "flush"        # (FLUSH, tag, seq, {model: dropped}): persist everything; ACK seq
STOP = "stop"          # (STOP, tag, seq, {model: dropped}): persist everything, ACK, exit
# Child → parent.
READY = "ready"        # (READY, priority): started, priority lowered
DECIDED = "decided"    # (DECIDED, model, sha256): the verdict is decided and persisted
ACK = "ack"            # (ACK, seq)

# The counters page, int64 slots.
WRITTEN = 0    # samples written into the ring (the parent)
DONE = 1       # samples finished (compared, skipped or failed), their slots free again
RUNNING = 2    # 1 + the seq of the sample being run, 0 when none
LOADING = 3    # the number of the ATTACH being loaded, 0 when none
SLEEPING = 4   # 1 while this process waits for a wake-up (the app then writes the eventfd)
WAKEUPS = 5    # sleeps this process woke from so far (what its pace costs the device)
SLEEP_US = 6   # how long its latest sleep was allowed to last, in microseconds
COUNTERS_BYTES = 4096
# A ring slot: a header of int64s, then the arrays at their layout's offsets.
SEQ, LAYOUT_ID, ACTIVE_US, NOW, DROPPED = range(5)
HEADER_BYTES = 64
MAX_MESSAGE = 1 << 20
MAX_FDS = 4  # file descriptors one message can carry (COUNTERS has two)

# One array of a sample: (is an output, name, dtype.str, shape, offset in the slot, nbytes).
Spec = tuple[bool, str, str, tuple[int, ...], int, int]


def send(sock: socket.socket, *msg: Any) -> None:
    sock.send(pickle.dumps(msg))


# socket.send_fds and socket.recv_fds ignore their ``flags`` (CPython 3.11): sendmsg/recvmsg.
def send_with_fds(sock: socket.socket, data: bytes, fds: list[int], flags: int) -> None:
    sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))],
                 flags)


def recv_with_fds(sock: socket.socket, flags: int) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    data, ancillary, _, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(MAX_FDS * fds.itemsize),
                                         flags)
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


def lower_process_priority() -> str:
    """This whole process (it is ours alone) at ``SCHED_IDLE``, else nice 19: the thread
    call, made on the main thread before any other thread starts (Linux threads inherit
    their creator's policy and nice value)."""
    return lower_thread_priority()


def _open_compiled(bundle: Bundle, member: Member) -> Backend:
    """``open_backend`` that never compiles: the app's process did, and the updater may be
    removing the bundle right now (compiling would create its directory again)."""
    return open_backend(bundle, member, compile_missing=False)


class Child:
    """The loop (see the module docstring)."""

    def __init__(self, sock: socket.socket, data_dir: Path, persist_every: int) -> None:
        self.sock = sock
        self.store = ShadowStore(data_dir)
        self.evaluator = Evaluator(run=self.run, persist_every=persist_every,
                                   persist=lambda s: self.store.save(s.stats),
                                   decided=lambda s: self.decided(s.loaded.bundle.model,
                                                                  s.stats))
        self.candidates: dict[str, Session] = {}
        self.layouts: dict[int, tuple[str, str | None, list[Spec]]] = {}
        self.counters: memoryview | None = None
        self.wake: int | None = None  # the eventfd the app writes to wake this process
        self.ring: mmap.mmap | None = None
        self.ring_q: memoryview | None = None
        self.slot_size = 0
        self.slots = 1
        self.next = 0  # the seq of the next sample to process
        self.pace = Pace()
        self.seen_models: set[str] = set()  # models a candidate was attached for here
        self.early: dict[str, int] = {}     # drops of models before their first ATTACH

    def serve(self) -> None:
        while True:
            # The count first: every message sent before those samples were written is in
            # the socket by now.
            written = int(self.counters[WRITTEN]) if self.counters is not None else 0
            messages, gone = self._drain()
            for msg, fds in messages:
                self.process_until(msg[1])
                if not self.handle(msg, fds):
                    return
            if self.next < written:
                self.process_until(written)
            if gone:  # the parent is gone: keep what was measured
                self.persist_all()
                return
            if not messages and self.next >= written:
                self.sleep()

    def sleep(self) -> None:
        """Until a message, a wake-up from the app, or the ``Pace``'s time: ``SLEEPING`` is
        set first, then the count is read again, so samples published before the app could
        see the flag are run now."""
        timeout = self.pace.timeout(self.next, self.slots)
        if self.counters is None or self.wake is None:
            select.select([self.sock], [], [], timeout)
            return
        self._set(SLEEP_US, int(timeout * 1_000_000))
        self._set(SLEEPING, 1)
        try:
            if int(self.counters[WRITTEN]) <= self.next:
                ready, _, _ = select.select([self.sock.fileno(), self.wake], [], [], timeout)
                if self.wake in ready:
                    os.eventfd_read(self.wake)
                self._set(WAKEUPS, int(self.counters[WAKEUPS]) + 1)
        finally:
            self._set(SLEEPING, 0)

    def _drain(self) -> tuple[list[tuple[tuple[Any, ...], list[int]]], bool]:
        out: list[tuple[tuple[Any, ...], list[int]]] = []
        while True:
            try:
                data, fds = recv_with_fds(self.sock, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return out, False
            except OSError:
                return out, True
            if not data:
                return out, True
            out.append((pickle.loads(data), fds))  # noqa: S301 - our parent, a socketpair

    def handle(self, msg: tuple[Any, ...], fds: list[int]) -> bool:
        kind = msg[0]
        if kind == LAYOUT:
            _, _, layout_id, model, shape_variant, specs = msg
            self.layouts[layout_id] = (model, shape_variant, specs)
        elif kind == ATTACH:
            self.attach(*msg[2:])
        elif kind == RING:
            if self.ring_q is not None:
                self.ring_q.release()
            if self.ring is not None:
                self.ring.close()
            self.ring = mmap.mmap(fds[0], 0)
            os.close(fds[0])
            self.slot_size = msg[2]
            self.slots = max(len(self.ring) // self.slot_size, 1)
            self.ring_q = memoryview(self.ring).cast("q")
        elif kind == COUNTERS:
            self.counters = memoryview(mmap.mmap(fds[0], COUNTERS_BYTES)).cast("q")
            os.close(fds[0])
            if len(fds) > 1:
                self.wake = fds[1]
        elif kind in (FLUSH, STOP):
            for model, n in msg[3].items():
                self.add_dropped(model, n)
            self.persist_all()
            send(self.sock, ACK, msg[2])
            return bool(kind == FLUSH)
        elif kind == DETACH:
            _, _, seq, model, dropped = msg
            self.add_dropped(model, dropped)
            c = self.candidates.pop(model, None)
            if c is not None:
                self.store.save(c.stats)
            send(self.sock, ACK, seq)
        return True

    def _set(self, slot: int, value: int) -> None:
        if self.counters is not None:
            self.counters[slot] = value

    def attach(self, model: str, bundle: Bundle, number: int) -> None:
        b = bundle
        stats = self.store.load(b.sha256) or ShadowStats(b.sha256, b.model, b.version)
        self.candidates.pop(model, None)
        self.seen_models.add(model)
        # Samples the app offered after this process started but before it sent the
        # ATTACH (a child started again after a crash re-attaches the candidates after it
        # runs): not compared, so dropped.
        stats.dropped += self.early.pop(model, 0)
        if stats.verdict != PENDING:
            return
        self._set(LOADING, number)
        try:
            loaded = prepare_bundle(b, _open_compiled, threshold=3, on_event=None)
        except Exception as e:
            if not all(b.member_path(m).is_file() for m in b.members):
                return  # the updater removed the bundle meanwhile: nothing to judge
            stats.fail(f"candidate does not load in the shadow process: {e}")
            self.decided(model, stats)
            return
        finally:
            self._set(LOADING, 0)
        self.candidates[model] = Session(loaded, stats)
        self.pace = Pace()  # its samples may come at once: do not sleep on an old rate

    def add_dropped(self, model: str, n: int) -> None:
        # Drops of a candidate no longer here (decided, or it did not load) change nothing.
        c = self.candidates.get(model)
        if c is not None:
            c.stats.dropped += n
        elif model not in self.seen_models:  # its ATTACH is on the way (a new child)
            self.early[model] = self.early.get(model, 0) + n

    def process_until(self, seq: int) -> None:
        while self.next < seq:
            try:
                self.sample(self.next)
            finally:
                self.next += 1
                # The slot is free from here on (the arrays read were views of it).
                self._set(DONE, self.next)

    def sample(self, seq: int) -> None:
        if self.ring is None or self.ring_q is None:
            return
        base = (seq % self.slots) * self.slot_size
        h = base // 8
        seq_seen, layout_id, active_us, now, dropped = (
            int(self.ring_q[h + i]) for i in (SEQ, LAYOUT_ID, ACTIVE_US, NOW, DROPPED))
        layout = self.layouts.get(layout_id)
        if layout is None:
            return
        model, shape_variant, specs = layout
        if seq_seen != seq:  # not the sample the count says (never expected): count it
            self.add_dropped(model, 1)
            return
        self.add_dropped(model, dropped)
        c = self.candidates.get(model)
        if c is None:
            self.add_dropped(model, 1)  # not compared: counted (when it still matters)
            return
        if c.stats.verdict != PENDING:
            return
        arrays: tuple[dict[str, np.ndarray[Any, Any]], dict[str, np.ndarray[Any, Any]]] = ({}, {})
        for is_output, name, dtype, shape, offset, nbytes in specs:
            dt = np.dtype(dtype)
            a = np.frombuffer(self.ring, dtype=dt, count=nbytes // max(dt.itemsize, 1),
                              offset=base + offset)
            arrays[is_output][name] = a.reshape(shape)
        inputs, outputs = arrays
        self.evaluator.sample(c, inputs, outputs, active_us, shape_variant, now)

    def run(self, candidate: Callable[[], Arrays]) -> tuple[Arrays, int]:
        """The evaluator's way to run the candidate: marked ``RUNNING`` (the sample in flight,
        ``self.next`` while ``process_until`` runs it) for the parent to blame if we die."""
        self._set(RUNNING, self.next + 1)
        t0 = time.perf_counter_ns()
        try:
            got = candidate()
        finally:
            self._set(RUNNING, 0)
        return got, (time.perf_counter_ns() - t0) // 1000

    def decided(self, model: str, stats: ShadowStats) -> None:
        self.store.save(stats)
        self.candidates.pop(model, None)
        send(self.sock, DECIDED, model, stats.sha256)

    def persist_all(self) -> None:
        for c in self.candidates.values():
            self.store.save(c.stats)


def main(argv: list[str]) -> None:
    fd, data_dir, persist_every, lower = int(argv[0]), Path(argv[1]), int(argv[2]), argv[3]
    sock = socket.socket(fileno=fd)
    # Before anything starts a thread (onnxruntime), so every thread of ours inherits it.
    priority = lower_process_priority() if lower == "1" else "normal"
    import onnxruntime  # noqa: F401 - loaded before READY, so the first sample runs at once

    try:
        send(sock, READY, priority)
        Child(sock, data_dir, persist_every).serve()
    except BrokenPipeError:
        pass  # the app's process went away first: nothing left to answer


if __name__ == "__main__":
    main(sys.argv[1:])
