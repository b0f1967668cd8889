"""What each model should become on this device: pure selection, no I/O and no clock.

``select`` takes the verified manifest, the device profile and what the device can run
(formats, preferred variants, the models it wants) and returns, per model, a ``Plan`` for the
active slot (the first *active-mode* release that includes the device), possibly a ``Plan``
for the candidate slot (the first release that includes the device, when that one is in
shadow mode), or a ``Refusal`` saying why nothing is offered. ``direction`` compares a plan
with the device's local state (its pointer and active version) to tell an update from a
rollback or a no-op, and ``drops_candidate`` says when a held candidate is no longer wanted.

A plan's members are the first artifact the device can run (``primary``: among those whose
``requires`` its hardware meets, the one it runs best, see ``by_capability``) and, for a non-ONNX
primary, a CPU ONNX ``fallback``: the ONNX artifact for the device's platform with the same
variant, else the portable one (platform ``onnx``) built for the same input shapes. For a model
in ``all_shape_variants``, one ``shape:<variant>`` member per other input-shape variant the
release offers this device follows (the runtime loads them all and switches by name). A
release that lists the device's platform in ``failed_platforms`` offers it the portable
artifacts (``manifests.artifacts_for``).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

import manifests
from client_sdk.compile import COREML_FORMATS, FORMAT_ONNX, QNN_FORMATS
from client_sdk.errors import ClientSDKError
from client_sdk.fsutil import check_name
from client_sdk.install import SHAPE_ROLE_PREFIX, Member, Pointer, bundle_id_for
from client_sdk.runtime import ACTIVE, CANDIDATE
from manifests import Artifact, DeviceProfile, Manifest, Release

# The platform of the portable CPU artifacts the server compiles for every model.
PORTABLE_PLATFORM = manifests.PORTABLE_PLATFORM
# Shape variant names that are safe inside a member file name (the server's variant rule).
_SAFE_SHAPE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")

_EXT = {FORMAT_ONNX: ".onnx", **{f: ".onnx" for f in QNN_FORMATS},
        **{f: ".mlpackage.tar" for f in COREML_FORMATS}}


@dataclass(frozen=True)
class Plan:
    """What one slot (active or candidate) of one model should hold on this device."""

    model: str
    release: Release
    artifacts: tuple[tuple[Member, Artifact], ...]
    bundle_id: str
    slot: str = ACTIVE  # or CANDIDATE: a shadow-mode release staged beside the active one

    @property
    def version(self) -> str:
        return self.release.version

    @property
    def sha256(self) -> str:
        """The primary artifact's sha256 (what the device reports for this slot)."""
        return self.artifacts[0][1].sha256


@dataclass(frozen=True)
class Refusal:
    """A model the device asked for but gets nothing of, and why."""

    model: str
    reason: str


@dataclass(frozen=True)
class Selection:
    """The plans in cycle order (each model's active plan, then its candidate) and refusals."""

    plans: tuple[Plan, ...]
    refused: tuple[Refusal, ...]


class Direction(enum.Enum):
    CURRENT = "current"   # the slot already holds this bundle
    FORWARD = "forward"   # a newer (or unordered) release
    BACK = "back"         # the previous bundle, or an older version: a rollback


def select(
    manifest: Manifest,
    device: DeviceProfile,
    *,
    formats: Sequence[str],
    variants: Mapping[str, str] | None = None,
    models: Sequence[str] | None = None,
    all_shape_variants: Collection[str] = (),
) -> Selection:
    """The plans and refusals for ``models`` (default: every model the manifest offers)."""
    variants = variants or {}
    plans: list[Plan] = []
    refused: list[Refusal] = []
    for model in list(models) if models is not None else list(manifest.models):
        try:
            check_name("model", model)
        except ClientSDKError as e:
            refused.append(Refusal(model, str(e)))
            continue
        if model not in manifest.models:
            refused.append(Refusal(model, "not offered on this channel"))
            continue
        release = _first_release(manifest, model, device, active_only=True)
        if release is None:
            refused.append(Refusal(model, (
                f"no release of {model} includes this device (id={device.device_id}, "
                f"platform={device.platform}, soc={device.soc or '-'}, "
                f"os={device.os_version or '-'}, app={device.app_version or '-'})")))
            continue
        shapes = model in all_shape_variants
        active = plan_for(model, release, device, formats, variants.get(model),
                          all_shapes=shapes)
        if active is None:
            offered = sorted({a.format for a in release.artifacts})
            refused.append(Refusal(model, (
                f"{model} {release.version} has no artifact this device can run "
                f"(offered {offered}, supported {list(formats)})")))
            continue
        plans.append(active)
        shadow = candidate_release(manifest, model, device, active.release)
        if shadow is not None:
            cand = plan_for(model, shadow, device, formats, variants.get(model),
                            slot=CANDIDATE, all_shapes=shapes)
            if cand is not None:
                plans.append(cand)
    return Selection(tuple(plans), tuple(refused))


def _first_release(manifest: Manifest, model: str, device: DeviceProfile, *,
                   active_only: bool) -> Release | None:
    entry = manifest.models[model]
    releases = [r for r in entry.releases if not active_only or r.rollout.mode == "active"]
    view = replace(manifest, models={model: replace(entry, releases=releases)})
    return manifests.select_release(view, model, device)


def candidate_release(manifest: Manifest, model: str, device: DeviceProfile,
                      active: Release) -> Release | None:
    """The shadow-mode release to run beside ``active``, if any: the first release that
    includes the device, when that one is in shadow mode (and is not ``active`` itself)."""
    first = _first_release(manifest, model, device, active_only=False)
    if first is None or first.rollout.mode != "shadow" or first.version == active.version:
        return None
    return first


def plan_for(model: str, release: Release, device: DeviceProfile, formats: Sequence[str],
             variant: str | None = None, *, slot: str = ACTIVE,
             all_shapes: bool = False) -> Plan | None:
    """The plan for ``release`` in ``slot``, or None when no artifact of it runs here."""
    chosen = members(release, device, formats, variant, all_shapes=all_shapes)
    if not chosen:
        return None
    ids = tuple(m for m, _ in chosen)
    return Plan(model, release, tuple(chosen), bundle_id_for(model, release.version, ids), slot)


def members(release: Release, device: DeviceProfile, formats: Sequence[str],
            variant: str | None = None, *, all_shapes: bool = False
            ) -> list[tuple[Member, Artifact]]:
    """The primary artifact (first match of device, format and variant) and, for a non-ONNX
    primary, its CPU fallback (then, with ``all_shapes``, the other input-shape variants);
    [] when nothing in ``release`` runs on this device."""
    # Matching artifacts, or the portable ones when the release lists this device's platform
    # as failed (released without its build).
    # A watermarked artifact stands for its per-cohort copies: this device's is the one.
    usable = [a.for_device(device.device_id) for a in manifests.artifacts_for(release, device)
              if a.format in formats]
    if variant is not None:
        usable = [a for a in usable if a.variant == variant]
    usable = by_capability(usable, device)
    if not usable:
        return []
    primary = usable[0]
    chosen = [(member("primary", primary), primary)]
    if primary.format != FORMAT_ONNX:
        cpu = cpu_fallback(release, primary, device)
        if cpu is not None:
            cpu = cpu.for_device(device.device_id)
            chosen.append((member("fallback", cpu), cpu))
    if all_shapes:
        chosen.extend(shape_members(usable, primary))
    return chosen


def by_capability(usable: Sequence[Artifact], device: DeviceProfile) -> list[Artifact]:
    """The artifacts whose ``requires`` the device's hardware meets, the one it runs best
    first (``manifests.preference``: an HTP with FP16 takes the FP16 build, one without the
    INT8 build), manifest order among equals. A manifest without ``requires`` keeps its order,
    so the choice is today's."""
    caps = manifests.device_capabilities(device)
    runnable = [a for a in usable if manifests.runs_on(a, caps)]
    return sorted(runnable, key=lambda a: manifests.preference(a, caps))


def shape_members(usable: Sequence[Artifact], primary: Artifact
                  ) -> list[tuple[Member, Artifact]]:
    """One member per other input-shape variant offered (the first usable artifact of each,
    in manifest order), role ``shape:<variant>``."""
    seen = {primary.target.get("shape_variant", "")}
    out: list[tuple[Member, Artifact]] = []
    for a in usable:
        shape = a.target.get("shape_variant", "")
        if shape and shape not in seen and _SAFE_SHAPE.fullmatch(shape):
            seen.add(shape)
            out.append((member(f"{SHAPE_ROLE_PREFIX}{shape}", a), a))
    return out


def cpu_fallback(release: Release, primary: Artifact, device: DeviceProfile) -> Artifact | None:
    """The ONNX artifact the runtime falls back to when ``primary``'s backend fails: one
    for this device's platform with the same variant, else the portable CPU artifact
    (platform "onnx", which any device runs) compiled for the same input shapes."""
    same_variant = next((a for a in release.artifacts if a.format == FORMAT_ONNX
                         and manifests.artifact_matches(a, device)
                         and a.variant == primary.variant), None)
    if same_variant is not None:
        return same_variant
    portable = replace(device, platform=PORTABLE_PLATFORM)
    shapes = primary.target.get("shape_variant", "")
    return next((a for a in release.artifacts if a.format == FORMAT_ONNX
                 and manifests.artifact_matches(a, portable)
                 and a.target.get("shape_variant", "") == shapes), None)


def member(role: str, a: Artifact) -> Member:
    """The bundle member that holds artifact ``a`` in ``role`` ("primary", "fallback" or
    ``shape:<variant>``, whose file is ``shape-<variant>``)."""
    stem = role.replace(":", "-")
    return Member(role=role, format=a.format, platform=a.platform, variant=a.variant,
                  file=f"{stem}{_EXT.get(a.format, '.bin')}", sha256=a.sha256,
                  length=a.length, target=dict(a.target),
                  compile_settings=dict(a.compile_settings))


def direction(plan: Plan, pointer: Pointer, active_version: str | None) -> Direction:
    """How ``plan`` relates to what its slot holds (``pointer``; ``active_version`` is the
    version of the active bundle, if any): already there, forward, or back (a rollback)."""
    held = pointer.active if plan.slot == ACTIVE else pointer.candidate
    if held == plan.bundle_id:
        return Direction.CURRENT
    if plan.slot == ACTIVE and (pointer.previous == plan.bundle_id or (
            active_version is not None and older(plan.version, active_version))):
        return Direction.BACK
    return Direction.FORWARD


def drops_candidate(model: str, plans: Sequence[Plan], pointer: Pointer) -> bool:
    """True when the device holds a candidate of ``model`` that no plan wants any more (the
    shadow release was withdrawn; a promoted candidate was already cleared by activation)."""
    wanted = any(p.model == model and p.slot == CANDIDATE for p in plans)
    return pointer.candidate is not None and not wanted


def older(a: str, b: str) -> bool:
    """True when version ``a`` is lower than ``b`` (non-numeric versions never compare)."""
    try:
        return manifests.compare_versions(a, b) < 0
    except ValueError:
        return False
