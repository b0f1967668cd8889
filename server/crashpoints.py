"""Named crash points on the server's dangerous steps, for the kill tests.

Each step that leaves something half-done if the process dies right there calls
`crashpoints.reached("<step>")` — one line, like the SDK's install steps (client_sdk
install.STEPS). Nothing happens unless the process was armed with `MODELFLEET_CRASH_AT=<step>`
or `<step>@<n>` (read by server/settings.py, refused in production; `arm` is called by
server/wiring.py `build_core` and by `modelfleet keys rotate`): the n-th time (default: the
first) the armed step is reached, the whole process group is SIGKILLed, as a power cut would
stop a machine — so `modelfleet serve`'s HTTP workers die with their supervisor and nothing
restarts them behind the test's back. An unarmed process pays one global read per step.

docs/architecture.md ("Crashes, step by step") says what each step leaves behind and what
repairs it; tests/faults/ kill a real server at each of them.
"""

from __future__ import annotations

import os
import signal
import threading

# Every step, in the order a release passes them. A name not listed here cannot be armed.
STEPS = (
    "upload.blobs_written",       # source blobs stored, the version's row not committed
    "upload.committed",           # version + builds committed, the compile not enqueued
    "build.artifacts_stored",     # artifact blobs stored, the build's result not committed
    "build.settled",              # build result committed (version ready/patching)
    "patch.stored",               # patch blob stored, its row not committed
    "patch.republished",          # patches committed and re-signed, the job not settled
    "publish.signed",             # manifest signed and stored as manifests/<c>/<serial>.json,
                                  # its row not committed
    "publish.committed",          # row committed, v1/channels/<c>/manifest not replaced yet
    "publish.served",             # v1/channels/<c>/manifest replaced, nobody told yet
    "ramp.moved",                 # ramp share moved in the transaction, not yet signed
    "guard.decided",              # the guard chose halt/promote, nothing published yet
    "guard.published",            # halt/promote published, the webhook not sent
    "rotate.root_written",        # roots/<n+1>.json written, the release key not replaced
    "rotate.release_replaced",    # new release key in place, channels not re-signed
    "resign.rekeyed",             # one channel re-signed with the new key, others not yet
)

_armed: tuple[str, int] | None = None
_hits = 0
_lock = threading.Lock()


class CrashPointError(ValueError):
    """MODELFLEET_CRASH_AT names no step, or the process may not be armed."""


def parse(spec: str) -> tuple[str, int] | None:
    """`step` or `step@n` → (step, n); "" → None. Raises CrashPointError."""
    if not spec:
        return None
    step, _, count = spec.partition("@")
    if step not in STEPS:
        raise CrashPointError(f"MODELFLEET_CRASH_AT={spec!r} names no crash point; "
                              f"use one of {', '.join(STEPS)} (optionally @N)")
    if count and (not count.isdigit() or int(count) < 1):
        raise CrashPointError(f"MODELFLEET_CRASH_AT={spec!r}: the count after @ must be a "
                              "positive integer")
    return step, int(count or 1)


def arm(spec: str) -> None:
    """Arms this process from the setting's value ("" disarms). The process must lead a
    process group of its own or be a child inside one (a test starts it with
    start_new_session=True): the crash kills that whole group, never the test runner."""
    global _armed, _hits
    parsed = parse(spec)
    if parsed is not None and os.getpgrp() != os.getsid(0):
        raise CrashPointError(f"MODELFLEET_CRASH_AT={spec!r} in a process that shares its "
                              "session's process group: start it in a new session")
    with _lock:
        _armed, _hits = parsed, 0


def reached(step: str) -> None:
    """The process has reached `step`; SIGKILL its process group if armed for this hit."""
    global _hits
    armed = _armed
    if armed is None or armed[0] != step:
        return
    with _lock:
        _hits += 1
        if _hits < armed[1]:
            return
    os.killpg(os.getpgrp(), signal.SIGKILL)
