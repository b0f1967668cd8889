"""The app's side of the link to one shadow child (``client_sdk.shadow_process``): the
shared-memory ring the app's thread copies samples into, the layouts samples lie in, and the
child's process, socket and shared counters page (``Link``).

A module of its own so ``shadow_process.py`` keeps the worker's logic (sessions, offers,
the child's life and death) and this one the memory: slots, layouts, the fence.
"""

from __future__ import annotations

import mmap
import os
import pickle
import platform
import socket
import subprocess
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from client_sdk.background import NORMAL
from client_sdk.shadow import Array
from client_sdk.shadow_child import (
    DONE,
    HEADER_BYTES,
    LAYOUT,
    RING,
    Spec,
    send_with_fds,
)

# A ring slot's size is a multiple of this (a page).
SLOT_ALIGN = 4096

_FENCE = threading.Lock()
# x86 keeps stores in program order (TSO): the child never sees the count before the bytes.
WEAK_ORDERING = platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86")


def fence() -> None:
    """A memory barrier on CPUs that reorder stores (ARM): a lock's acquire and release."""
    with _FENCE:
        pass


def shared_fd(size: int) -> int:
    """A file descriptor of ``size`` bytes of anonymous memory to share with the child
    (``memfd_create``: samples never touch a file system)."""
    fd = os.memfd_create("modelfleet-shadow", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    return fd



class Layout:
    """How one kind of sample (a model, a shape variant, its arrays' names, dtypes and shapes)
    lies in the ring: ``fill`` copies a sample with one ``memcpy`` per array (a numpy
    assignment when the array is not C-contiguous)."""

    def __init__(self, layout_id: int, shape_variant: str | None, ring: mmap.mmap,
                 slot_size: int, slots: int, specs: list[Spec]) -> None:
        self.id = layout_id
        self.shape_variant = shape_variant
        self.n_outputs = sum(1 for spec in specs if spec[0])
        self.n_inputs = len(specs) - self.n_outputs
        self.ring = ring
        self.slot_size = slot_size
        self.arrays = [
            (is_output, name, np.dtype(dtype), shape, offset, nbytes,
             [np.ndarray(shape, np.dtype(dtype), buffer=ring, offset=i * slot_size + offset)
              for i in range(slots)])
            for is_output, name, dtype, shape, offset, nbytes in specs]

    def fill(self, slot: int, inputs: Mapping[str, Array], outputs: Mapping[str, Array]
             ) -> bool:
        """Copy the sample into ``slot``; False (nothing published) when it is not of this
        layout. Each step here is paid on the app's thread right after its prediction, when
        the interpreter's caches are cold (≈ 1 µs apiece on a 2-core VM): an ``mmap`` slice
        assignment is one C call and one ``memcpy``, half the cost of a memoryview copy."""
        if len(inputs) != self.n_inputs or len(outputs) != self.n_outputs:
            return False
        ring, at = self.ring, slot * self.slot_size
        for is_output, name, dtype, shape, offset, nbytes, views in self.arrays:
            a = (outputs if is_output else inputs).get(name)
            if a is None or a.shape != shape or (a.dtype is not dtype and a.dtype != dtype):
                return False
            try:
                # An ndarray is a buffer; typeshed's mmap wants bytes-like by its protocol.
                ring[at + offset:at + offset + nbytes] = a  # type: ignore[call-overload]
            except (TypeError, ValueError, BufferError):  # not C-contiguous (or not numpy)
                views[slot][...] = a
        return True


class Link:
    """One child process: its socket, the shared pages, and what was sent to it."""

    def __init__(self, proc: subprocess.Popen[bytes], sock: socket.socket,
                 counters: mmap.mmap, wake: int, slots: int) -> None:
        self.proc, self.sock = proc, sock
        self.wake: int | None = wake  # the child's eventfd (closed under the offer lock)
        self._counters_mm = counters
        self.counters = memoryview(counters).cast("q")
        self.slots = slots
        self.ring: mmap.mmap | None = None
        self.headers: list[memoryview] = []    # each slot's header (int64s)
        self.slot_size = 0
        self.written = 0                       # samples written (under the offer lock)
        # The child's DONE count as last read: that cache line (the child writes it) is read
        # again only when the ring looks full, or ¾ full (time to wake the child).
        self.done_seen = 0
        self.slot_models = [""] * slots        # the model of the sample in each ring slot
        self.layouts: list[Layout] = []
        self.made = 0                          # layouts made so far (all rings)
        self.last: dict[str, Layout] = {}     # by model: the layout of its last sample
        self.attached = [""]                   # ATTACH number → model
        self.acked = 0
        self.ready = threading.Event()
        self.priority = NORMAL
        self.alive = True
        self.stopping = False
        self.reader: threading.Thread | None = None

    def done(self) -> int:
        return int(self.counters[DONE])

    def send_now(self, msg: tuple[Any, ...], fds: list[int] | None = None) -> None:
        """Send without waiting (the app's thread); ``OSError`` when it cannot."""
        data = pickle.dumps(msg)
        if fds:
            send_with_fds(self.sock, data, fds, socket.MSG_DONTWAIT)
        else:
            self.sock.send(data, socket.MSG_DONTWAIT)

    def new_ring(self, slot_size: int) -> None:
        """A ring of ``slot_size``-byte slots; samples from now on go there (the child
        finishes the ones in the old ring first). The layouts are made again on it."""
        fd = shared_fd(slot_size * self.slots)
        try:
            ring = mmap.mmap(fd, slot_size * self.slots)
            self.send_now((RING, self.written, slot_size), [fd])
        finally:
            os.close(fd)
        self.ring, self.slot_size = ring, slot_size
        whole = memoryview(ring)
        self.headers = [whole[i * slot_size:i * slot_size + HEADER_BYTES].cast("q")
                        for i in range(self.slots)]
        self.layouts, self.last = [], {}

    def layout(self, model: str, shape_variant: str | None, inputs: Mapping[str, Array],
               outputs: Mapping[str, Array]) -> Layout | None:
        """A new layout for this sample, told to the child (with a bigger ring first when
        its slots are too small); None when an array is not numeric."""
        arrays = [(False, k, np.asarray(v)) for k, v in inputs.items()]
        arrays += [(True, k, np.asarray(v)) for k, v in outputs.items()]
        if any(a.dtype.hasobject for _, _, a in arrays):
            return None
        specs: list[Spec] = []
        offset = HEADER_BYTES
        for is_output, name, a in arrays:
            specs.append((is_output, name, a.dtype.str, a.shape, offset, a.nbytes))
            offset += -(-a.nbytes // 8) * 8
        if self.ring is None or offset > self.slot_size:
            self.new_ring(-(-offset // SLOT_ALIGN) * SLOT_ALIGN)
        assert self.ring is not None
        layout = Layout(len(self.layouts) + 1, shape_variant, self.ring, self.slot_size,
                         self.slots, specs)
        self.send_now((LAYOUT, self.written, layout.id, model, shape_variant, specs))
        self.layouts.append(layout)
        self.made += 1
        return layout

    def fill(self, slot: int, model: str, shape_variant: str | None,
             inputs: Mapping[str, Array], outputs: Mapping[str, Array]) -> Layout | None:
        """Copy a sample whose layout is not its model's last one: a known one, else a new
        one (None: not numeric)."""
        layout = next((lay for lay in self.layouts if lay.shape_variant == shape_variant
                       and lay.fill(slot, inputs, outputs)), None)
        if layout is None:
            layout = self.layout(model, shape_variant, inputs, outputs)
            if layout is None or not layout.fill(slot, inputs, outputs):
                return None
        self.last[model] = layout
        return layout
