"""Rollout rule: bucketing formula, filters, allow/deny precedence, release selection."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from manifests import (
    Artifact,
    DeviceProfile,
    Filters,
    MalformedError,
    Rollout,
    VersionRange,
    bucket,
    compare_versions,
    rollout_includes,
    select_artifact,
    select_release,
)
from tests.manifests.manifest_builders import make_manifest, make_release


def test_bucket_follows_the_documented_formula() -> None:
    digest = hashlib.sha256(b"s1:device-42").digest()
    assert bucket("s1", "device-42") == int.from_bytes(digest[:8], "big") % 1_000_000
    # Pinned values other languages can check against (also in vectors/bucketing.json).
    assert bucket("", "") == int.from_bytes(hashlib.sha256(b":").digest()[:8], "big") % 10**6


def test_bucket_spreads_devices_evenly() -> None:
    n = 20_000
    inside = sum(bucket("spread", f"dev-{i}") < 250_000 for i in range(n))
    assert abs(inside / n - 0.25) < 0.015


def _device(**kw: str) -> DeviceProfile:
    base = {"device_id": "d1", "platform": "android", "soc": "sm8650", "arch": "arm64",
            "os_version": "14.10", "app_version": "3.2.1"}
    base.update(kw)
    return DeviceProfile(**base)


def _rollout(share: int = 1_000_000, **filters: list[str]) -> Rollout:
    return Rollout(share_ppm=share, salt="s", filters=Filters(**filters))


def test_share_zero_includes_nobody_and_full_share_everybody() -> None:
    for i in range(200):
        d = _device(device_id=f"x{i}")
        assert not rollout_includes(_rollout(0), d)
        assert rollout_includes(_rollout(1_000_000), d)


@pytest.mark.parametrize(
    ("filters", "included"),
    [
        ({"platforms": ["ios"]}, False),
        ({"platforms": ["ios", "android"]}, True),
        ({"socs": ["sm8550"]}, False),
        ({"socs": ["sm8650"]}, True),
        ({"archs": ["x86_64"]}, False),
        ({"os_versions": [">=14.9"]}, True),  # 14.10 > 14.9 numerically
        ({"os_versions": [">=14.11"]}, False),
        ({"os_versions": [">=15", "<14.10"]}, False),
        ({"os_versions": [">=15", "==14.10.0"]}, True),  # any range of the list
        ({"app_versions": [">=3.2,<4"]}, True),
        ({"app_versions": [">=3.2, <3.2.1"]}, False),
        ({"app_versions": ["!=3.2.1"]}, False),
    ],
)
def test_attribute_filters(filters: dict[str, list[str]], included: bool) -> None:
    assert rollout_includes(_rollout(**filters), _device()) is included


def test_unknown_device_attribute_fails_a_constraining_filter() -> None:
    assert not rollout_includes(_rollout(socs=["sm8650"]), _device(soc=""))
    assert not rollout_includes(_rollout(os_versions=[">=1"]), _device(os_version="17.2-beta"))
    assert rollout_includes(_rollout(), _device(soc="", os_version=""))


def test_deny_beats_allow_and_allow_beats_share_and_filters() -> None:
    d = _device()
    assert rollout_includes(_rollout(0, device_allow=["d1"], platforms=["ios"]), d)
    assert not rollout_includes(_rollout(1_000_000, device_allow=["d1"], device_deny=["d1"]), d)
    assert not rollout_includes(_rollout(1_000_000, device_deny=["d1"]), d)


def test_version_ranges_compare_numerically() -> None:
    assert compare_versions("14.10", "14.9") == 1
    assert compare_versions("14", "14.0.0") == 0
    assert compare_versions("2.0.1", "2.0.10") == -1
    assert VersionRange.parse(" >= 14.0 , < 18 ").contains("17.99")
    bad_ranges = ["", ">=", "14", "=>1", ">=1.", ">=1..2", ">=a", ">=1,", "~1.2",
                  ">=1.2.3.4.5.6.7.8.9", ">=1234567890"]
    for bad in bad_ranges:
        with pytest.raises(MalformedError, match="version range"):
            VersionRange.parse(bad)


def test_select_release_picks_first_including_release_and_falls_back() -> None:
    manifest = make_manifest(releases=[make_release("2.0", 0), make_release("1.0")])
    d = _device()
    assert select_release(manifest, "detector", d).version == "1.0"  # type: ignore[union-attr]
    pinned = make_release("2.0", 0, Filters(device_allow=["d1"]))
    manifest = make_manifest(releases=[pinned, make_release("1.0")])
    assert select_release(manifest, "detector", d).version == "2.0"  # type: ignore[union-attr]
    assert select_release(manifest, "detector", _device(device_id="d2")).version == "1.0"  # type: ignore[union-attr]
    assert select_release(manifest, "missing-model", d) is None


def test_select_release_skips_releases_without_an_artifact_for_the_device() -> None:
    pinned_ios_only = make_release("2.0", 1_000_000, Filters(device_allow=["d1"]),
                                   platforms=["ios"])
    manifest = make_manifest(releases=[pinned_ios_only, make_release("1.0")])
    assert select_release(manifest, "detector", _device()).version == "1.0"  # type: ignore[union-attr]
    only = make_manifest(releases=[pinned_ios_only])
    assert select_release(only, "detector", _device()) is None


def test_select_artifact_honours_target_soc_and_arch() -> None:
    rel = make_release("1.0", platforms=["android"])
    generic = rel.artifacts[0]
    qnn = replace(generic, variant="qnn", target={"soc": "sm8650", "arch": "arm64"})
    other_soc = replace(generic, variant="qnn2", target={"soc": "sm8550"})
    rel = replace(rel, artifacts=[other_soc, qnn, generic])
    assert select_artifact(rel, _device()) == qnn
    assert select_artifact(rel, _device(soc="sm7000")) == generic
    assert select_artifact(rel, _device(platform="ios")) is None
    assert isinstance(generic, Artifact)
