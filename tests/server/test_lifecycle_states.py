"""Lifecycle state machines: allowed transitions pass, everything else raises."""

from __future__ import annotations

import pytest

from server.db.models import (
    BUILD_TRANSITIONS,
    PATCH_JOB_TRANSITIONS,
    RELEASE_TRANSITIONS,
    VERSION_TRANSITIONS,
    Build,
    BuildState,
    InvalidTransitionError,
    ModelVersion,
    PatchJob,
    PatchJobState,
    Release,
    ReleaseState,
    VersionState,
)

CASES = [
    (ModelVersion, VersionState, VERSION_TRANSITIONS),
    (Build, BuildState, BUILD_TRANSITIONS),
    (Release, ReleaseState, RELEASE_TRANSITIONS),
    (PatchJob, PatchJobState, PATCH_JOB_TRANSITIONS),
]


@pytest.mark.parametrize(("cls", "states", "table"), CASES)
def test_every_pair_of_states_follows_the_table(cls, states, table) -> None:  # type: ignore[no-untyped-def]
    for current in states:
        for new in states:
            row = cls(state=current)
            if new in table[current]:
                row.transition(new)
                assert row.state == new
            else:
                with pytest.raises(InvalidTransitionError):
                    row.transition(new)
                assert row.state == current


def test_version_lifecycle_happy_path() -> None:
    v = ModelVersion(state=VersionState.uploaded)
    v.transition(VersionState.compiling)
    v.transition(VersionState.ready)
    with pytest.raises(InvalidTransitionError, match="'ready' to 'uploaded'"):
        v.transition(VersionState.uploaded)


def test_halted_release_goes_only_back_to_active_when_an_operator_resumes_it() -> None:
    # Issue 20: a halt is no longer final, but it never pauses nor skips the resume.
    assert RELEASE_TRANSITIONS[ReleaseState.halted] == frozenset({ReleaseState.active})
