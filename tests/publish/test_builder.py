"""The manifest builder and the pure rollout rules."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

import manifests
from server.db.states import ReleaseState
from server.publish.builder import build_manifest, join_url, offered
from server.publish.records import RolloutRecord, filters_from_columns, filters_to_columns
from server.rollouts.errors import InvalidRolloutError, RolloutStateError
from server.rollouts.rules import (
    check_filters,
    check_pause,
    check_pin,
    check_ramp,
    check_resume,
    percentage_to_ppm,
)

SHA_A, SHA_B = "a" * 64, "b" * 64


def rollout(seq, version, share, state=ReleaseState.active, model="clf", **kw):
    art = manifests.Artifact(
        platform="android", variant="", format="onnx", url=f"v1/artifacts/{SHA_B}", length=10,
        sha256=SHA_B,
        patches=[manifests.Patch(SHA_A, f"v1/patches/{SHA_A}", 3, SHA_A, "bsdiff4")])
    return RolloutRecord(id=seq, seq=seq, model=model, version=version, share_ppm=share,
                         salt=f"salt-{version}", mode="active", state=state,
                         artifacts=(art,), **kw)


def test_new_release_is_offered_first_with_previous_full_release_as_fallback():
    rs = [rollout(1, "1.0", 1_000_000), rollout(2, "1.1", 1_000_000), rollout(3, "1.2", 50_000)]
    assert [r.version for r in offered(rs)] == ["1.2", "1.1"]


def test_fully_rolled_out_release_keeps_the_previous_full_one_as_fallback():
    rs = [rollout(1, "0.9", 1_000_000), rollout(2, "1.0", 1_000_000),
          rollout(3, "1.1", 1_000_000)]
    assert [r.version for r in offered(rs)] == ["1.1", "1.0"]


def test_halted_release_is_not_offered_and_devices_fall_back():
    rs = [rollout(1, "1.0", 1_000_000), rollout(2, "1.1", 0, ReleaseState.halted)]
    assert [r.version for r in offered(rs)] == ["1.0"]


def test_paused_release_stays_offered_at_its_share():
    rs = [rollout(1, "1.0", 1_000_000), rollout(2, "1.1", 200_000, ReleaseState.paused)]
    assert [(r.version, r.share_ppm) for r in offered(rs)] == [("1.1", 200_000), ("1.0", 1_000_000)]


def test_without_any_full_release_every_live_release_is_offered():
    rs = [rollout(1, "1.0", 10_000), rollout(2, "1.1", 20_000)]
    assert [r.version for r in offered(rs)] == ["1.1", "1.0"]


def test_built_manifest_round_trips_and_devices_outside_the_cohort_get_the_fallback():
    rs = [rollout(1, "1.0", 1_000_000), rollout(2, "1.1", 0),
          rollout(3, "2.0", 1_000_000, model="det",
                  shadow=manifests.ShadowThresholds(1000, 20_000, 50),
                  filters=manifests.Filters(platforms=["android"], device_deny=["bad"]))]
    m = build_manifest(channel="prod", serial=7, expires=1_900_000_000, rollouts=rs)
    again = manifests.Manifest.from_bytes(m.to_bytes())
    assert again == m
    assert list(m.models) == ["clf", "det"]
    device = manifests.DeviceProfile(device_id="dev-1", platform="android")
    assert manifests.select_release(m, "clf", device).version == "1.0"
    assert manifests.select_release(m, "det", device).version == "2.0"
    assert manifests.select_release(
        m, "det", manifests.DeviceProfile(device_id="bad", platform="android")) is None
    assert m.models["clf"].releases[1].artifacts[0].patches[0].algorithm == "bsdiff4"


def test_model_with_only_halted_releases_is_left_out():
    m = build_manifest(channel="beta", serial=1, expires=1,
                       rollouts=[rollout(1, "1.0", 0, ReleaseState.halted)])
    assert m.models == {}


@pytest.mark.parametrize(("percentage", "ppm"), [
    (10, 100_000), (0.5, 5_000), ("0.0001", 1), (100, 1_000_000), (0, 0), (33.3333, 333_333),
    (Decimal("12.5"), 125_000),
])
def test_percentage_maps_exactly_to_parts_per_million(percentage, ppm):
    assert percentage_to_ppm(percentage) == ppm


@pytest.mark.parametrize("percentage", [-1, 100.0001, 101, float("nan"), float("inf"), "x"])
def test_percentage_outside_0_to_100_is_refused(percentage):
    with pytest.raises(InvalidRolloutError):
        percentage_to_ppm(percentage)


def test_percentage_finer_than_one_ppm_is_refused():
    with pytest.raises(InvalidRolloutError, match="finer than 1 part per million"):
        percentage_to_ppm(0.00001)


@given(st.integers(min_value=0, max_value=1_000_000))
def test_every_ppm_round_trips_through_its_percentage(ppm):
    assert percentage_to_ppm(Decimal(ppm) / 10_000) == ppm
    assert percentage_to_ppm(str(Decimal(ppm) / 10_000)) == ppm


def test_filters_naming_a_platform_the_release_lacks_are_refused():
    with pytest.raises(InvalidRolloutError, match="unknown platform"):
        check_filters(manifests.Filters(platforms=["andriod"]), {"android", "ios"})
    check_filters(manifests.Filters(platforms=["android"]), {"android", "ios"})


def test_bad_version_range_in_filters_is_refused():
    with pytest.raises(InvalidRolloutError, match="not understood"):
        check_filters(manifests.Filters(os_versions=["about 14"]), {"android"})


def test_ramping_a_halted_release_is_refused():
    with pytest.raises(RolloutStateError, match="halted"):
        check_ramp(ReleaseState.halted)


def test_rollout_rules_follow_the_release_state_machine():
    check_ramp(ReleaseState.active)
    for refused, check in [(ReleaseState.paused, check_ramp), (ReleaseState.paused, check_pause),
                           (ReleaseState.halted, check_pause), (ReleaseState.active, check_resume),
                           (ReleaseState.halted, check_pin)]:
        with pytest.raises(RolloutStateError):
            check(refused)
    check_pause(ReleaseState.active)
    check_resume(ReleaseState.paused)
    check_pin(ReleaseState.paused)
    # A halt is no longer final (issue 20): an operator resumes it, but only with a reason.
    with pytest.raises(InvalidRolloutError, match="needs a reason"):
        check_resume(ReleaseState.halted)
    check_resume(ReleaseState.halted, reason="the failing devices ran a broken OS build")


def test_filters_survive_their_database_columns_unchanged():
    f = manifests.Filters(platforms=["android"], socs=["SM8650"], archs=["arm64"],
                          os_versions=[">=14"], app_versions=["<2"], device_allow=["a"],
                          device_deny=["b"])
    columns = filters_to_columns(f)
    assert columns == {"filters": {"platforms": ["android"], "socs": ["SM8650"],
                                   "archs": ["arm64"], "os_versions": [">=14"],
                                   "app_versions": ["<2"]},
                       "pinned_devices": ["a"], "denied_devices": ["b"]}
    assert filters_from_columns(columns["filters"], ["a"], ["b"]) == f
    assert filters_from_columns(None, None, None) == manifests.Filters()


def test_urls_are_absolute_under_a_base_url_or_relative_without_one():
    assert join_url("https://cdn.example/mf/", "v1/artifacts/x") == "https://cdn.example/mf/v1/artifacts/x"
    assert join_url("", "v1/artifacts/x") == "v1/artifacts/x"


def test_builder_rules_records_and_state_machines_need_no_database():
    import subprocess
    import sys

    code = ("import sys, server.db.states, server.publish.builder, server.rollouts.rules, "
            "server.publish.records; print('sqlalchemy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
