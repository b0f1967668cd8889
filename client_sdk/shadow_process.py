"""``ShadowProcess``: the shadow worker's interface, with the candidates run in a child process.

A shadow worker thread shares the app's GIL: every microsecond it holds it (comparing,
aggregating, waking up, writing the statistics) while the app's thread wants it lands on the
app's predict latency. Here the candidates run, are compared and their statistics aggregated
and persisted in one child process of their own (``client_sdk.shadow_child``, at
``SCHED_IDLE``), which has its own GIL. What stays in the app's process:

- ``offer`` (the app's thread, after its prediction): copy the input and the active outputs
  into the next slot of a shared-memory ring, with a header, and count it in the shared
  counters page — never a wait, and a system call only to wake the sleeping child when ¾ of
  the ring waits (an ``eventfd`` write: the child never polls but sleeps paced to the
  samples' rate, see ``client_sdk.shadow_child``); a layout not seen before (model, shape
  variant, array names, dtypes, shapes) is sent once over the socket first. The ring has
  ``queue_size`` slots and the child counts the samples it finished in that page, so a full
  ring (the child is behind) drops the sample and counts it, like the thread's full queue;
- one reader thread, blocked in ``recv`` (GIL released) until the child says something —
  rarely: a decided verdict (``on_decided``, as the thread worker does), or the answer to a
  ``flush``/``detach``/``close``, which wait for it (the statistics are on disk when they
  return), or the end of the socket: the child died.

When the child dies, the samples it had not finished are counted as dropped and a new one is
started (after a short pause when it keeps dying), with the candidates attached again from
their persisted statistics (at most ``persist_every`` samples are lost, as with an app
crash). A candidate the child was running or loading when it died twice fails: "the
candidate crashed the shadow process" — with a thread worker it would have crashed the app.
When the child cannot start at all (it exits before saying it is ready: no usable Python
executable, say), ``on_unavailable`` is called once and the runtime goes back to the thread
worker.

The ring, its layouts and the link to one child (process, socket, counters page) are
``client_sdk.shadow_link``; the child's side and the message kinds ``client_sdk.shadow_child``.

Costs: the child is one more Python process with onnxruntime (tens of MB) and its own copy of
each candidate model (the runtime keeps the one it loaded, to promote it without a reload).
Linux only (``SOCK_SEQPACKET``, ``memfd``, ``eventfd``, ``SCHED_IDLE``); samples must be
numeric arrays (an input or output of dtype object is dropped and counted).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from client_sdk.background import NORMAL
from client_sdk.clock import Clock
from client_sdk.loaded import LoadedModel
from client_sdk.pace import wake_at
from client_sdk.shadow import Array, Decided, Session
from client_sdk.shadow_child import (
    ACK,
    ACTIVE_US,
    ATTACH,
    COUNTERS,
    COUNTERS_BYTES,
    DECIDED,
    DETACH,
    DROPPED,
    FLUSH,
    LAYOUT_ID,
    LOADING,
    MAX_MESSAGE,
    NOW,
    READY,
    RUNNING,
    SEQ,
    SLEEPING,
    STOP,
    WRITTEN,
    send_with_fds,
)
from client_sdk.shadow_link import WEAK_ORDERING, Link, fence, shared_fd
from client_sdk.shadow_stats import PENDING, ShadowStats, ShadowStore

# A candidate running (or loading) when the child died this many times has failed.
MAX_CRASHES = 2
_SEND_DEADLINE_S = 10.0


def supported() -> bool:
    """Whether this platform and interpreter can run the shadow process."""
    return (sys.platform.startswith("linux") and hasattr(socket, "SOCK_SEQPACKET")
            and hasattr(os, "memfd_create") and hasattr(os, "eventfd")
            and bool(sys.executable)
            and os.access(sys.executable, os.X_OK))


def child_command(fd: int, data_dir: Path, persist_every: int, lower: bool) -> list[str]:
    """How the child is started (a seam for the tests of a child that cannot start): the
    app's interpreter, importing this package from where the app's process found it (its
    ``sys.path``). Not ``-m client_sdk.shadow_child``: the package imports that module."""
    code = ("import json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
            "from client_sdk.shadow_child import main; main(sys.argv[2:])")
    return [sys.executable, "-c", code, json.dumps([p for p in sys.path if p]), str(fd),
            str(data_dir), str(persist_every), "1" if lower else "0"]


class ShadowProcess:
    """The ``client_sdk.shadow.Shadow`` interface over a child process (see the module
    docstring)."""

    def __init__(self, store: ShadowStore, clock: Clock, *, queue_size: int,
                 persist_every: int, on_decided: Decided, background: bool = True,
                 on_unavailable: Callable[[str], None] | None = None) -> None:
        self.store = store
        self._now = clock.time  # bound once: one step less on the app's thread
        self._size = max(queue_size, 1)
        # The child sleeps between batches, paced to wake with half a ring waiting; with this
        # many waiting the app wakes it (the rate jumped): a system call on those offers only.
        self._wake_at = wake_at(self._size)
        self.setups = 0  # layouts made by offers (sent to the child, a ring perhaps): not charged
        self._persist_every = max(persist_every, 1)
        self._background = background
        self._on_decided = on_decided
        self._on_unavailable = on_unavailable
        self._sessions: dict[str, Session] = {}
        self._crashes: dict[str, int] = {}     # by candidate sha256
        self._lock = threading.Lock()          # offers, drop counts, the link
        self._acks = threading.Condition()
        self._seq = 0
        self._link: Link | None = None
        self._deaths = 0                       # in a row, without a sample finished
        self._closing = False                  # close() runs: no new child
        self._priority = NORMAL
        self.unavailable: str | None = None    # why the child could not start

    # -- sessions --------------------------------------------------------------------------

    def attach(self, loaded: LoadedModel) -> Session | None:
        """Start (or resume, from the persisted stats) comparing ``loaded`` as its model's
        candidate; None when that artifact already has a verdict."""
        b = loaded.bundle
        self.detach(b.model)  # first: the child persists what it holds of it
        stats = self.store.load(b.sha256) or ShadowStats(b.sha256, b.model, b.version)
        if stats.verdict != PENDING:
            return None
        session = Session(loaded, stats)
        self._closing = False
        link = self._ensure_link()
        if link is not None:  # before the app can offer a sample of it
            self._send_attach(link, b.model, session)
        self._sessions[b.model] = session
        return session

    def detach(self, model: str) -> None:
        old = self._sessions.pop(model, None)
        if old is None:
            return
        old.detached = True
        dropped = self._take_dropped(old)
        if not self._request(DETACH, model, dropped):
            self._persist_here(old, dropped)

    def session(self, model: str) -> Session | None:
        return self._sessions.get(model)

    @property
    def priority(self) -> str:
        """The priority the child runs (or last ran) at, once one started."""
        return self._priority

    @property
    def pid(self) -> int | None:
        """The child's process id, while one runs."""
        link = self._link
        return link.proc.pid if link is not None and link.alive else None

    @property
    def busy(self) -> bool:
        """True while the child is running (or loading) a candidate."""
        link = self._link
        return link is not None and bool(link.counters[RUNNING] or link.counters[LOADING])

    # -- the app's side --------------------------------------------------------------------

    def offer(self, model: str, inputs: Mapping[str, Array], outputs: Mapping[str, Array],
              active_us: int, shape_variant: str | None) -> bool:
        """Copy one sample into the ring, never blocking; False when dropped (no child
        running, the ring full, an array that is not numeric). A system call only to wake
        the sleeping child once ¾ of the ring waits (and to send a layout not seen before).
        As few steps as can be: it runs on the app's thread, where each one costs (≈ 1 µs
        apiece right after a prediction, on a 2-core VM)."""
        s = self._sessions.get(model)
        if s is None or s.stats.verdict != PENDING:
            return False
        with self._lock:
            link = self._link
            if link is None:
                s.dropped += 1
                return False
            seq = link.written
            if seq - link.done_seen >= self._size:  # full, as last seen: look again
                link.done_seen = link.done()
                if seq - link.done_seen >= self._size:
                    s.dropped += 1
                    return False
            slot = seq % self._size
            layout = link.last.get(model)
            if (layout is None or layout.shape_variant != shape_variant
                    or not layout.fill(slot, inputs, outputs)):
                made = link.made
                try:
                    layout = link.fill(slot, model, shape_variant, inputs, outputs)
                except OSError:  # the child is gone or stuck: the reader thread sees to it
                    layout = None
                self.setups += link.made - made
                if layout is None:
                    s.dropped += 1
                    return False
            h = link.headers[slot]
            h[SEQ], h[LAYOUT_ID], h[ACTIVE_US] = seq, layout.id, active_us
            h[NOW], h[DROPPED] = int(self._now()), s.dropped
            s.dropped = 0
            link.slot_models[slot] = model
            if WEAK_ORDERING:  # the slot's bytes must be visible before the count
                fence()
            link.written = link.counters[WRITTEN] = seq + 1
            if seq + 1 - link.done_seen >= self._wake_at:  # maybe ¾ full: look again
                link.done_seen = link.done()
                if (seq + 1 - link.done_seen >= self._wake_at and link.counters[SLEEPING]
                        and link.wake is not None):
                    try:
                        os.eventfd_write(link.wake, 1)
                    except OSError:  # the child's end is gone: the reader thread sees to it
                        pass
        return True

    # -- the child -------------------------------------------------------------------------

    def _ensure_link(self) -> Link | None:
        with self._lock:
            if self._link is None and self.unavailable is None and not self._closing:
                self._link = self._spawn()
            return self._link

    def _spawn(self) -> Link:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            proc = subprocess.Popen(
                child_command(theirs.fileno(), self.store.dir.parent, self._persist_every,
                              self._background),
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                start_new_session=True)  # the terminal's Ctrl-C is the app's to handle
        fd = shared_fd(COUNTERS_BYTES)
        wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        try:
            counters = mmap.mmap(fd, COUNTERS_BYTES)
            send_with_fds(ours, pickle.dumps((COUNTERS, 0)), [fd, wake], 0)
        except BaseException:
            os.close(wake)
            raise
        finally:
            os.close(fd)
        link = Link(proc, ours, counters, wake, self._size)
        link.reader = threading.Thread(target=self._read, args=(link,), daemon=True,
                                       name="modelfleet-shadow-link")
        link.reader.start()
        return link

    def _send_attach(self, link: Link, model: str, session: Session) -> None:
        with self._lock:
            link.attached.append(model)
            number = len(link.attached) - 1
        with contextlib.suppress(OSError):  # a dead child is seen to by the reader
            self._send(link, (ATTACH, link.written, model, session.loaded.bundle, number))

    def _send(self, link: Link, msg: tuple[Any, ...]) -> None:
        """A control message (small): waits for room in the socket, up to a deadline."""
        data = pickle.dumps(msg)
        end = time.monotonic() + _SEND_DEADLINE_S
        while True:
            try:
                link.sock.send(data, socket.MSG_DONTWAIT)
                return
            except BlockingIOError:
                if time.monotonic() > end or not link.alive:
                    raise
                time.sleep(0.001)

    def _request(self, kind: str, *args: Any) -> bool:
        """Send ``kind`` and wait for the child's ACK; False when there is no child (or it
        died before answering)."""
        link = self._link
        if link is None or not link.alive:
            return False
        with self._acks:
            self._seq += 1
            seq = self._seq
        try:
            self._send(link, (kind, link.written, seq, *args))
        except OSError:
            return False
        with self._acks:
            while link.alive and link.acked < seq:
                self._acks.wait(1.0)
            return link.acked >= seq

    def _read(self, link: Link) -> None:
        """The reader thread: the child's messages, then its death."""
        while True:
            try:
                data = link.sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            if not data:
                break
            msg = pickle.loads(data)  # noqa: S301 - our own child process, over a socketpair
            if msg[0] == READY:
                link.priority = self._priority = msg[1]
                link.ready.set()
            elif msg[0] == DECIDED:
                self._child_decided(msg[1], msg[2])
            elif msg[0] == ACK:
                with self._acks:
                    link.acked = max(link.acked, msg[1])
                    self._acks.notify_all()
        self._lost(link)

    def _child_decided(self, model: str, sha256: str) -> None:
        s = self._sessions.get(model)
        if s is None or s.loaded.bundle.sha256 != sha256:
            return
        s.stats = self.store.load(sha256) or s.stats
        self._on_decided(model, s)

    def _lost(self, link: Link) -> None:
        """The child is gone: count what it had not finished, then start another one (or
        fail the candidate that keeps killing it, or give up on the process)."""
        link.alive = False
        try:
            code = link.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            link.proc.kill()
            code = link.proc.wait()
        with self._acks:
            self._acks.notify_all()
        with self._lock:
            if self._link is link:
                self._link = None
            if link.wake is not None:  # under the lock: an offer never writes a reused fd
                os.close(link.wake)
                link.wake = None
            done, running, loading = (link.done(), int(link.counters[RUNNING]),
                                      int(link.counters[LOADING]))
            for seq in range(done, link.written):
                s = self._sessions.get(link.slot_models[seq % self._size])
                if s is not None:
                    s.dropped += 1
            culprit = (link.slot_models[(running - 1) % self._size] if running
                       else link.attached[loading] if loading else None)
        link.sock.close()
        if link.stopping:
            return
        if not link.ready.is_set():
            self._give_up(f"the shadow process exited ({code}) before it started")
            return
        self._deaths = self._deaths + 1 if done == 0 else 1
        s = self._sessions.get(culprit) if culprit else None
        if s is not None:
            sha = s.loaded.bundle.sha256
            self._crashes[sha] = self._crashes.get(sha, 0) + 1
            if self._crashes[sha] >= MAX_CRASHES:
                self._fail_here(s, f"the candidate crashed the shadow process "
                                f"{self._crashes[sha]} times (last exit status {code})")
        time.sleep(min(0.05 * 2 ** self._deaths, 10.0))
        link = self._ensure_link()  # type: ignore[assignment]  # None: given up meanwhile
        if link is not None:
            for model, session in list(self._sessions.items()):
                if session.stats.verdict == PENDING:
                    self._send_attach(link, model, session)

    def _give_up(self, reason: str) -> None:
        self.unavailable = reason
        for s in list(self._sessions.values()):
            self._persist_here(s, self._take_dropped(s))
        if self._on_unavailable is not None:
            self._on_unavailable(reason)

    def _take_dropped(self, s: Session) -> int:
        """``s``'s drops not yet handed on, now handed to the caller."""
        with self._lock:
            dropped, s.dropped = s.dropped, 0
        return dropped

    def _persist_here(self, s: Session, dropped: int, *, fail: str | None = None) -> None:
        """Write ``s``'s drops (and a failed verdict) from this process (no child holds its
        statistics)."""
        if not dropped and fail is None:
            return
        stats = self.store.load(s.loaded.bundle.sha256) or s.stats
        stats.dropped += dropped
        if fail is not None:
            stats.fail(fail)
        self.store.save(stats)
        s.stats = stats

    def _fail_here(self, s: Session, reason: str) -> None:
        self._persist_here(s, self._take_dropped(s), fail=reason)
        self._on_decided(s.stats.model, s)

    # -- lifecycle -------------------------------------------------------------------------

    def _take_drops(self) -> dict[str, int]:
        with self._lock:
            drops = {m: s.dropped for m, s in self._sessions.items() if s.dropped}
            for m in drops:
                self._sessions[m].dropped = 0
        return drops

    def _after(self, drops: dict[str, int], answered: bool) -> None:
        for model, s in list(self._sessions.items()):
            if not answered:
                self._persist_here(s, drops.get(model, 0))
            s.stats = self.store.load(s.loaded.bundle.sha256) or s.stats

    def flush(self) -> None:
        """Wait until the child processed every sample sent, then until it persisted every
        session (the statistics on disk are current when this returns)."""
        drops = self._take_drops()
        self._after(drops, self._request(FLUSH, drops))

    def close(self) -> None:
        """Drain, persist and stop the child."""
        self._closing = True
        link = self._link
        drops = self._take_drops()
        if link is not None:
            link.stopping = True
        answered = self._request(STOP, drops)
        if link is not None:
            if link.reader is not None:
                link.reader.join()
            with self._lock:
                if self._link is link:
                    self._link = None
        self._after(drops, answered)
