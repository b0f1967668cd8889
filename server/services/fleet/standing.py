"""Which reports count (docs/shadow.md "What a device can influence"): a report stands as

- `counted` — the release's rule offered the release to this device when the report
  arrived (bucket, filters, allow/deny lists and "has an artifact it can run", evaluated
  from the device's enrolled profile by the contract's own code, `manifests.rollout_includes`
  and `manifests.select_artifact`, exactly as the device and the rollout preview do), the
  device is attested when its channel requires it, and the figures do not contradict the
  verdict;
- `not_offered` — the rule does not reach this device (or the release is halted);
- `unattested` — the channel requires attestation and the device has none;
- `forged` — the verdict contradicts the device's own figures under the rollout's
  thresholds (`derived_verdict`), or the figures contradict each other.

Only `counted` reports reach `device_releases`, the standings the health and the guard read;
every report is stored in `telemetry_events` with its standing, so the others are shown
apart. Pure: no I/O (ingest.py loads the rules and the device facts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import manifests
from server.services.fleet.reports import HealthReport, ShadowReport, UpdateReport

StandingName = Literal["counted", "not_offered", "forged", "unattested"]
COUNTED: StandingName = "counted"
NOT_OFFERED: StandingName = "not_offered"
FORGED: StandingName = "forged"
UNATTESTED: StandingName = "unattested"
NOT_COUNTED = (NOT_OFFERED, FORGED, UNATTESTED)


@dataclass(frozen=True)
class ReleaseRule:
    """What the server needs to judge a report about one release."""

    release_id: int
    # The release as the manifest offers it; None when it is offered to no device (halted).
    release: manifests.Release | None
    thresholds: manifests.ShadowThresholds | None
    require_attestation: bool = False


@dataclass(frozen=True)
class DeviceFacts:
    """The device as it enrolled: its profile and whether an attestation vouched for it."""

    profile: manifests.DeviceProfile
    attested: bool = False


def offered(rule: ReleaseRule, device: DeviceFacts) -> bool:
    """Whether the release's rule offers it to the device: the devices' own rule."""
    release = rule.release
    return (release is not None
            and manifests.rollout_includes(release.rollout, device.profile)
            and manifests.select_artifact(release, device.profile) is not None)


def derived_verdict(r: ShadowReport, t: manifests.ShadowThresholds) -> str:
    """The verdict the device's own figures give under the rollout's thresholds, by the
    SDK's rule (client_sdk/shadow.py `ShadowStats.decide`): pending below min_samples, else
    failed when the mean KL or the candidate p99 is over its limit, else passed."""
    if r.samples < t.min_samples:
        return "pending"
    if r.kl_mean_micro > t.max_kl_micro or r.candidate_p99_us > t.max_latency_p99_us:
        return "failed"
    return "passed"


def contradiction(r: ShadowReport, t: manifests.ShadowThresholds | None) -> str | None:
    """Why the report's verdict cannot be true, or None. A failed verdict whose figures
    pass is possible only with a `reason` (the candidate crashed or did not load: failures
    figures cannot show); a passed verdict must be what the figures give; a pending one
    may lag (the release's minimum duration)."""
    if r.kl_max_micro < r.kl_mean_micro:
        return "kl_max_micro is below kl_mean_micro"
    if r.candidate_p50_us > r.candidate_p99_us or r.active_p50_us > r.active_p99_us:
        return "a p50 latency is above its p99"
    if t is None:
        return None
    derived = derived_verdict(r, t)
    if r.verdict == "passed" and derived != "passed":
        return f"verdict passed, but the figures give {derived}"
    if r.verdict == "failed" and derived != "failed" and not r.reason:
        return f"verdict failed without a reason, but the figures give {derived}"
    return None


def standing_of(report: UpdateReport | ShadowReport | HealthReport, rule: ReleaseRule | None,
                device: DeviceFacts) -> StandingName | None:
    """The report's standing (None: it names no release the server knows)."""
    if rule is None:
        return None
    if not offered(rule, device):
        return NOT_OFFERED
    if rule.require_attestation and not device.attested:
        return UNATTESTED
    if isinstance(report, ShadowReport) and contradiction(report, rule.thresholds):
        return FORGED
    return COUNTED
