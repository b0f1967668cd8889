"""Events the SDK reports to the app, and the safe way to deliver them.

An app subscribes with ``UpdaterConfig.on_event`` / ``ModelRuntime(on_event=...)``. A callback
that raises never breaks an update or an inference: its error is swallowed.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass


class EventKind(enum.Enum):
    CHECKING = "checking"          # polling the channel manifest
    UP_TO_DATE = "up_to_date"      # nothing to change for this model
    DOWNLOADING = "downloading"    # bytes arriving; ``done``/``total`` carry progress
    VERIFIED = "verified"          # a manifest or a file passed verification
    STAGED = "staged"              # a bundle is complete on disk, not yet active
    ACTIVE = "active"              # a bundle became the active one
    ROLLED_BACK = "rolled_back"    # the device went back to an earlier bundle
    REFUSED = "refused"            # an offer was refused (not for this device, or untrusted)
    FALLBACK = "fallback"          # runtime fell back to another backend (circuit breaker)
    FAILED = "failed"              # a step failed; ``reason`` says why


@dataclass(frozen=True)
class Event:
    kind: EventKind
    model: str = ""
    version: str = ""
    reason: str = ""
    done: int = 0
    total: int = 0


EventCallback = Callable[[Event], None]


def emit(callback: EventCallback | None, event: Event) -> None:
    """Deliver ``event``; an app callback that raises must not break the SDK."""
    if callback is None:
        return
    try:
        callback(event)
    except Exception:  # noqa: S110 - the app's bug must not abort an update or inference
        pass
