"""The public surface: what ``client_sdk`` exports, its error tree, and its config rules."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

import client_sdk
from client_sdk import ConfigError, DeviceProfile, UpdaterConfig
from client_sdk.schedule import PollSchedule

EXPECTED = {
    "Updater", "UpdaterConfig", "Limits", "ModelRuntime", "Prediction", "Transport",
    "Response", "UrllibTransport", "Clock", "SystemClock", "Event", "EventKind",
    "UpdateResult", "ModelResult", "Outcome", "DeviceProfile", "ClientSDKError",
    "ConfigError", "FetchError", "DeadlineExceededError", "OversizeError", "TrustError",
    "MetadataExpiredError",
    "IntegrityError", "PatchFailedError", "InstallError", "RuntimeSDKError",
    "ModelNotLoadedError", "BackendUnavailableError", "BackendError", "__version__",
    "Reporter", "TelemetryError", "Via", "ShadowConfig",
    "ProtectionError", "ContentKeyError", "LocalKeyError", "KeyStore", "FileKeyStore",
}


def test_all_lists_exactly_the_public_names_and_they_import():
    assert set(client_sdk.__all__) == EXPECTED
    for name in client_sdk.__all__:
        assert getattr(client_sdk, name) is not None


def test_every_error_derives_from_the_one_base():
    errors = [getattr(client_sdk, n) for n in client_sdk.__all__ if n.endswith("Error")]
    assert all(issubclass(e, client_sdk.ClientSDKError) for e in errors)


def test_sdk_reads_no_environment_variables():
    src = Path(client_sdk.__file__).parent
    for f in src.glob("*.py"):
        assert not re.search(r"os\.environ|getenv", f.read_text()), f


@pytest.mark.parametrize("field,value,match", [
    ("base_url", "ftp://x", "base_url"),
    ("channel", "../prod", "channel"),
    ("pinned_root", b"", "pinned_root"),
    ("poll_interval_seconds", 0, "poll_interval_seconds"),
])
def test_bad_config_is_refused_with_the_field_named(tmp_path, field, value, match):
    kwargs = dict(base_url="https://u.test", channel="prod", pinned_root=b"{}",
                  device=DeviceProfile("d", "linux"), data_dir=tmp_path)
    kwargs[field] = value
    with pytest.raises(ConfigError, match=match):
        UpdaterConfig(**kwargs)


def test_poll_schedule_jitters_and_backs_off_with_a_cap():
    s = PollSchedule(interval=100, jitter=0.1, backoff_base=10, backoff_cap=80,
                     rng=random.Random(1))
    ok = [s.next_delay(True) for _ in range(50)]
    assert all(90 <= d <= 110 for d in ok) and len(set(ok)) > 1
    failures = [s.next_delay(False) for _ in range(6)]
    assert 5 <= failures[0] <= 10 and 10 <= failures[1] <= 20 and 20 <= failures[2] <= 40
    assert all(40 <= d <= 80 for d in failures[3:])
    assert 90 <= s.next_delay(True) <= 110 and s.failures == 0
