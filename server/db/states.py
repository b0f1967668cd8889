"""Every lifecycle state machine of the server, in one pure module (no SQLAlchemy): the
states of a table's `state` column and the transitions its rows' `transition()` checks.

    model version  uploaded → compiling → ready | patching | failed;  patching → ready;
                   failed → compiling
    build          queued → running → succeeded | failed | queued (retry);  failed → queued
    patch job      queued → running → done | failed | queued;  done | failed → queued
    release        active ⇄ paused;  active | paused → halted (the rollback);
                   halted → active (an operator resumes it, with a reason)

The release machine is the rollout's: server/rollouts/rules.py turns a refused rollout
change into the API's RolloutStateError.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TypeVar


class InvalidTransitionError(ValueError):
    """A lifecycle state change that the state machine does not allow."""

    def __init__(self, kind: str, current: enum.Enum, new: enum.Enum) -> None:
        super().__init__(f"{kind} cannot go from {current.value!r} to {new.value!r}")
        self.kind = kind
        self.current = current
        self.new = new


State = TypeVar("State", bound=enum.Enum)


def check_transition(kind: str, allowed: Mapping[State, frozenset[State]], current: State,
           new: State) -> None:
    if new not in allowed.get(current, frozenset()):
        raise InvalidTransitionError(kind, current, new)


class VersionState(enum.StrEnum):
    uploaded = "uploaded"
    compiling = "compiling"
    # Every build succeeded and earlier published versions exist: its delta patches from them
    # are being made, so the first manifest offering it can list them. Ends ready whether the
    # patch job succeeds or fails (devices then download in full).
    patching = "patching"
    ready = "ready"
    failed = "failed"


VERSION_TRANSITIONS: dict[VersionState, frozenset[VersionState]] = {
    VersionState.uploaded: frozenset({VersionState.compiling, VersionState.failed}),
    VersionState.compiling: frozenset({VersionState.ready, VersionState.patching,
                                       VersionState.failed}),
    VersionState.patching: frozenset({VersionState.ready}),
    # A failed version may be compiled again (e.g. after a worker fix); ready is final.
    VersionState.failed: frozenset({VersionState.compiling}),
    VersionState.ready: frozenset(),
}


class BuildState(enum.StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"


BUILD_TRANSITIONS: dict[BuildState, frozenset[BuildState]] = {
    BuildState.queued: frozenset({BuildState.running, BuildState.failed}),
    # running -> queued is a retry after a transient failure or a lost worker heartbeat.
    BuildState.running: frozenset({BuildState.succeeded, BuildState.failed, BuildState.queued}),
    BuildState.failed: frozenset({BuildState.queued}),
    BuildState.succeeded: frozenset(),
}


class PatchJobState(enum.StrEnum):
    queued = "queued"
    running = "running"
    done = "done"
    failed = "failed"


PATCH_JOB_TRANSITIONS: dict[PatchJobState, frozenset[PatchJobState]] = {
    PatchJobState.queued: frozenset({PatchJobState.running}),
    # running -> queued: a retry after a failure, or asked again while it ran.
    PatchJobState.running: frozenset({PatchJobState.done, PatchJobState.failed,
                                      PatchJobState.queued}),
    # A finished job is queued again by the next request (a newly published base).
    PatchJobState.done: frozenset({PatchJobState.queued}),
    PatchJobState.failed: frozenset({PatchJobState.queued}),
}


class ReleaseState(enum.StrEnum):
    """Lifecycle of one release (a rollout) on one channel."""

    active = "active"  # offered at its share; may be ramped
    paused = "paused"  # offered at its frozen share; resume before ramping
    halted = "halted"  # share 0 and no longer offered: the rollback (an operator may resume)


RELEASE_TRANSITIONS: dict[ReleaseState, frozenset[ReleaseState]] = {
    ReleaseState.active: frozenset({ReleaseState.paused, ReleaseState.halted}),
    ReleaseState.paused: frozenset({ReleaseState.active, ReleaseState.halted}),
    # A halted release is offered again only when an operator resumes it (audited, with a
    # reason: server/rollouts/service.py resume_rollout).
    ReleaseState.halted: frozenset({ReleaseState.active}),
}


def release_may_ramp(state: ReleaseState) -> bool:
    """Only an active release changes its share (a paused one is resumed first)."""
    return state is ReleaseState.active


def release_may_pin(state: ReleaseState) -> bool:
    """Pinning devices to a release matters only while it is offered."""
    return state is not ReleaseState.halted
