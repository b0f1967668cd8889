"""Fixtures for the client SDK tests: a fake clock, the repository simulator, an updater
factory and a snapshot of the device's trusted state."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from client_sdk import DeviceProfile, Event, ModelRuntime, Updater, UpdaterConfig
from tests.client.onnx_models import scaled_model
from tests.client.simulator import BASE, FakeClock, RepositorySimulator

LINUX = DeviceProfile("device-1", "linux", arch="x86_64", os_version="6.1", app_version="2.0")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sim(clock: FakeClock) -> RepositorySimulator:
    return RepositorySimulator(clock)


@pytest.fixture
def events() -> list[Event]:
    return []


@pytest.fixture
def make_updater(
    tmp_path: Path, sim: RepositorySimulator, clock: FakeClock, events: list[Event]
) -> Callable[..., Updater]:
    def make(**overrides: Any) -> Updater:
        kwargs: dict[str, Any] = dict(
            base_url=BASE, channel="prod", pinned_root=sim.pinned_root, device=LINUX,
            data_dir=tmp_path / "device", clock=clock, transport=sim,
            on_event=events.append, formats=["onnx"], update_deadline_seconds=60,
        )
        kwargs.update(overrides)
        return Updater(UpdaterConfig(**kwargs))

    return make


@pytest.fixture
def runtime(tmp_path: Path) -> ModelRuntime:
    return ModelRuntime(tmp_path / "device")


@pytest.fixture
def v1() -> bytes:
    return scaled_model(1.0, padding=4000)


@pytest.fixture
def v2() -> bytes:
    return scaled_model(2.0, padding=4000, tweak=10)


def trusted_state(data_dir: Path) -> dict[str, bytes]:
    """Every file that makes up what the device trusts and runs (trust/ and models/)."""
    out: dict[str, bytes] = {}
    for sub in ("trust", "models"):
        base = data_dir / sub
        if base.exists():
            for p in sorted(base.rglob("*")):
                if p.is_file():
                    out[str(p.relative_to(data_dir))] = p.read_bytes()
    return out
