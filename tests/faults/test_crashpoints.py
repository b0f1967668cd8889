"""The crash-point switch itself: only named steps, never in production, inert unarmed."""

from __future__ import annotations

import pytest

from server import crashpoints
from server.crashpoints import CrashPointError
from server.settings import Settings


def test_an_unknown_or_malformed_crash_point_is_refused() -> None:
    assert crashpoints.parse("publish.signed@2") == ("publish.signed", 2)
    assert crashpoints.parse("") is None
    for bad in ("publish.sign", "publish.signed@0", "publish.signed@x"):
        with pytest.raises(CrashPointError):
            crashpoints.parse(bad)


def test_crash_points_are_refused_in_production() -> None:
    with pytest.raises(ValueError, match="MODELFLEET_CRASH_AT"):
        Settings(env="production", crash_at="publish.signed")


def test_an_unarmed_process_passes_every_step() -> None:
    crashpoints.arm("")
    for step in crashpoints.STEPS:
        crashpoints.reached(step)  # still here
