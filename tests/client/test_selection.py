"""Properties of the SDK's pure selection (client_sdk.selection): who gets an offer, what a
share change does, which release is the fallback, which artifact backs a QNN primary up, and
how a plan relates to the device's pointer. Selection opens no file."""

from __future__ import annotations

import hashlib
from dataclasses import replace

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from client_sdk.install import Pointer
from client_sdk.runtime import ACTIVE, CANDIDATE
from client_sdk.selection import PORTABLE_PLATFORM, Direction, direction, select
from manifests import (
    PPM,
    Artifact,
    DeviceProfile,
    Filters,
    Manifest,
    ModelEntry,
    Release,
    Rollout,
    ShadowThresholds,
    bucket,
    rollout_includes,
)
from tests.support.audit import recording

PLATFORMS = ["linux", "android", "qnn", PORTABLE_PLATFORM]
FORMATS = ["onnx", "qnn", "onnx-epcontext", "mlpackage"]
SOCS = ["", "sm8650", "sm8550"]
SHAPES = ["", "1x3x224x224", "1x3x320x320"]
ALL_FORMATS = tuple(FORMATS)
IDS = st.integers(0, 10_000).map(lambda n: f"dev-{n}")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@st.composite
def artifacts(draw: st.DrawFn) -> Artifact:
    platform = draw(st.sampled_from(PLATFORMS))
    fmt = draw(st.sampled_from(FORMATS))
    target = {k: v for k, v in (("soc", draw(st.sampled_from(SOCS))),
                                ("shape_variant", draw(st.sampled_from(SHAPES)))) if v}
    n = draw(st.integers(0, 10**9))
    return Artifact(platform=platform, variant=draw(st.sampled_from(["", "fp16", "int8"])),
                    format=fmt, url=f"blobs/{n}", length=100 + n % 1000, sha256=_sha(str(n)),
                    target=target)


filters = st.builds(
    Filters,
    platforms=st.lists(st.sampled_from(PLATFORMS), max_size=2, unique=True),
    socs=st.lists(st.sampled_from(SOCS[1:]), max_size=1),
    device_allow=st.lists(IDS, max_size=1),
    device_deny=st.lists(IDS, max_size=1),
)
SHADOW = ShadowThresholds(max_kl_micro=1000, max_latency_p99_us=10_000, min_samples=10)


@st.composite
def releases(draw: st.DrawFn, version: str,
             filters: st.SearchStrategy[Filters] = filters) -> Release:
    mode = draw(st.sampled_from(["active", "active", "shadow"]))
    share = draw(st.one_of(st.just(PPM), st.integers(0, PPM)))
    rollout = Rollout(share_ppm=share, salt=f"salt-{version}", mode=mode,
                      filters=draw(filters), shadow=SHADOW if mode == "shadow" else None)
    return Release(version, rollout, draw(st.lists(artifacts(), min_size=1, max_size=4)))


@st.composite
def manifests_st(draw: st.DrawFn, filters: st.SearchStrategy[Filters] = filters) -> Manifest:
    models = {}
    for model in draw(st.lists(st.sampled_from(["clf", "det"]), min_size=1, unique=True)):
        count = draw(st.integers(1, 4))
        models[model] = ModelEntry([draw(releases(f"{count - i}.0", filters))
                                    for i in range(count)])
    return Manifest(channel="prod", serial=1, expires=2_000_000_000, models=models)


devices = st.builds(DeviceProfile, device_id=IDS, platform=st.sampled_from(PLATFORMS),
                    soc=st.sampled_from(SOCS))
formats = st.lists(st.sampled_from(FORMATS), min_size=1, unique=True).map(tuple)


@settings(max_examples=100, deadline=None)
@given(manifests_st(), devices, formats)
def test_every_plan_is_for_a_release_that_includes_the_device(manifest, device, fmts):
    with recording() as opened:
        chosen = select(manifest, device, formats=fmts)
    assert opened == []  # pure: no file opened
    for plan in chosen.plans:
        assert rollout_includes(plan.release.rollout, device)
        primary = plan.artifacts[0][1]
        assert primary.platform == device.platform and primary.format in fmts
        assert plan.slot == ACTIVE or plan.release.rollout.mode == "shadow"
    planned = {p.model for p in chosen.plans if p.slot == ACTIVE}
    assert planned | {r.model for r in chosen.refused} == set(manifest.models)
    assert not planned & {r.model for r in chosen.refused}


@settings(max_examples=100, deadline=None)
@given(manifests_st(), devices, formats)
def test_a_device_outside_every_releases_filters_never_gets_an_offer(manifest, device, fmts):
    outside = DeviceProfile(device.device_id, "tv", device.soc)  # a platform no filter names
    for entry in manifest.models.values():
        for r in entry.releases:
            f = r.rollout.filters
            f.platforms[:] = f.platforms or ["linux"]
            f.device_allow[:] = [d for d in f.device_allow if d != outside.device_id]
    chosen = select(manifest, outside, formats=fmts)
    assert chosen.plans == ()
    assert [r.model for r in chosen.refused] == list(manifest.models)
    assert all("includes this device" in r.reason for r in chosen.refused)


@settings(max_examples=100, deadline=None)
@given(manifests_st(filters=st.just(Filters())), st.data())
def test_raising_a_share_never_removes_a_devices_pick(manifest, data):
    """For a device that runs every format: raising any release's share keeps an offer, and
    raising the share of the picked release keeps that very pick."""
    model = data.draw(st.sampled_from(sorted(manifest.models)))
    offered = [a for r in manifest.models[model].releases for a in r.artifacts]
    a = data.draw(st.sampled_from(offered))
    device = DeviceProfile(data.draw(IDS), a.platform, soc=a.target.get("soc", ""))
    before = {p.slot: p for p in select(manifest, device, formats=ALL_FORMATS).plans
              if p.model == model}
    assume(ACTIVE in before)
    rels = list(manifest.models[model].releases)
    i = data.draw(st.integers(0, len(rels) - 1))
    old = rels[i]
    rels[i] = replace(old, rollout=replace(
        old.rollout, share_ppm=data.draw(st.integers(old.rollout.share_ppm, PPM))))
    raised = replace(manifest, models={**manifest.models, model: ModelEntry(rels)})
    after = {p.slot: p for p in select(raised, device, formats=ALL_FORMATS).plans
             if p.model == model}
    assert ACTIVE in after
    if before[ACTIVE].release is old:
        assert after[ACTIVE].release is rels[i]
        assert after[ACTIVE].artifacts == before[ACTIVE].artifacts


@settings(max_examples=150, deadline=None)
@given(IDS, st.integers(0, PPM), st.sampled_from(["active", "shadow"]))
def test_the_fallback_is_the_previous_fully_rolled_out_release(device_id, share, mode):
    art = Artifact(platform="linux", variant="", format="onnx", url="b/1", length=1,
                   sha256=_sha("1"))
    new = Release("2.0", Rollout(share, "salt-2.0", mode,
                                 shadow=SHADOW if mode == "shadow" else None), [art])
    previous = Release("1.0", Rollout(PPM, "salt-1.0"), [art])
    manifest = Manifest("prod", 1, 2_000_000_000, {"clf": ModelEntry([new, previous])})
    plans = {p.slot: p.release.version
             for p in select(manifest, DeviceProfile(device_id, "linux"), formats=["onnx"]).plans}
    in_new = bucket("salt-2.0", device_id) < share
    if mode == "active":
        assert plans == {ACTIVE: "2.0" if in_new else "1.0"}
    else:  # a shadow release runs beside the previous one, never instead of it
        assert plans == ({ACTIVE: "1.0", CANDIDATE: "2.0"} if in_new else {ACTIVE: "1.0"})


@settings(max_examples=100, deadline=None)
@given(st.permutations(SHAPES), st.sampled_from(SHAPES), st.sampled_from(["qnn", "onnx-epcontext"]),
       st.data())
def test_qnn_devices_fallback_is_the_portable_onnx_artifact_of_the_same_shapes(
        shapes, wanted, qnn_format, data):
    def art(platform: str, fmt: str, shape: str, soc: str = "") -> Artifact:
        target = {k: v for k, v in (("soc", soc), ("shape_variant", shape)) if v}
        name = f"{platform}/{fmt}/{shape}/{soc}"
        return Artifact(platform=platform, variant="w8a8" if platform == "qnn" else "",
                        format=fmt, url=name, length=1, sha256=_sha(name), target=target)

    portable = [art(PORTABLE_PLATFORM, "onnx", s) for s in shapes]
    others = [art("linux", "onnx", s) for s in shapes]
    primary = art("qnn", qnn_format, wanted, soc="sm8650")
    arts = data.draw(st.permutations([*portable, *others, art("qnn", qnn_format, wanted,
                                                                soc="sm8550")]))
    release = Release("1.0", Rollout(PPM, "s"), [primary, *arts])
    device = DeviceProfile("phone-1", "qnn", soc="sm8650")
    manifest = Manifest("prod", 1, 2_000_000_000, {"det": ModelEntry([release])})
    (plan,) = select(manifest, device, formats=["onnx", "qnn", "onnx-epcontext"]).plans
    (m1, a1), (m2, a2) = plan.artifacts
    assert (m1.role, a1) == ("primary", primary)
    assert m2.role == "fallback" and a2.platform == PORTABLE_PLATFORM and a2.format == "onnx"
    assert a2.target.get("shape_variant", "") == wanted


def _plan(slot: str = ACTIVE, version: str = "2.0"):
    art = Artifact(platform="linux", variant="", format="onnx", url="b", length=1,
                   sha256=_sha(version))
    manifest = Manifest("prod", 1, 2_000_000_000, {"clf": ModelEntry([Release(
        version, Rollout(PPM, "s"), [art])])})
    (plan,) = select(manifest, DeviceProfile("d", "linux"), formats=["onnx"]).plans
    return plan if slot == ACTIVE else replace(plan, slot=CANDIDATE)


@given(st.sampled_from([None, "other"]), st.sampled_from([None, "other"]),
       st.sampled_from([None, "1.0", "3.0", "x"]))
def test_direction_against_the_pointer(active, previous, active_version):
    plan = _plan()
    bid = plan.bundle_id
    assert direction(plan, Pointer(active=bid, previous=previous), active_version) is (
        Direction.CURRENT)
    assert direction(plan, Pointer(active=active, previous=bid), active_version) is (
        Direction.BACK)
    expected = Direction.BACK if active_version == "3.0" else Direction.FORWARD
    assert direction(plan, Pointer(active=active, previous=previous), active_version) is expected
    cand = _plan(CANDIDATE)
    assert direction(cand, Pointer(active=active, candidate=bid), active_version) is (
        Direction.CURRENT)
    assert direction(cand, Pointer(active=active, previous=bid), "3.0") is Direction.FORWARD
