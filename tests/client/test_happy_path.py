"""The normal update cycle: install, no-op poll with ETag/304, patch update, rollback."""

from __future__ import annotations

import hashlib

import numpy as np

from client_sdk import EventKind, Outcome
from tests.client.onnx_models import check_whole
from tests.client.simulator import RepositorySimulator

X = np.arange(4, dtype=np.float32).reshape(1, 4)


def test_first_update_installs_and_runtime_predicts(make_updater, sim, v1, runtime, events):
    sim.publish("clf", [sim.release("1.0", [sim.artifact(v1)])])
    up = make_updater(runtime=runtime)
    result = up.check_once()
    assert result.outcome is Outcome.UPDATED
    (m,) = result.models
    assert (m.model, m.version, m.sha256) == ("clf", "1.0", hashlib.sha256(v1).hexdigest())
    pred = runtime.predict("clf", {"x": X})
    assert pred.version == "1.0" and check_whole(pred.outputs, X) == 1.0
    kinds = [e.kind for e in events]
    for k in (EventKind.CHECKING, EventKind.VERIFIED, EventKind.DOWNLOADING, EventKind.STAGED,
              EventKind.ACTIVE):
        assert k in kinds


def test_unchanged_manifest_is_revalidated_with_etag_and_304(make_updater, sim: RepositorySimulator,
                                                             v1):
    sim.publish("clf", [sim.release("1.0", [sim.artifact(v1)])])
    up = make_updater()
    up.check_once()
    sim.fetches.clear()
    result = up.check_once()
    assert result.outcome is Outcome.UP_TO_DATE
    (mf,) = sim.fetched("/v1/channels/")
    assert mf.status == 304 and mf.headers["If-None-Match"].startswith('"')
    assert sim.fetched("/blobs/") == []


def test_patch_is_used_when_device_holds_the_base(make_updater, sim, v1, v2):
    sim.publish("clf", [sim.release("1.0", [sim.artifact(v1)])])
    up = make_updater()
    up.check_once()
    patch = sim.patch(v1, v2)
    art = sim.artifact(v2, patches=[patch])
    sim.publish("clf", [sim.release("2.0", [art]), sim.release("1.0", [sim.artifact(v1)])])
    sim.fetches.clear()
    result = up.check_once()
    assert result.outcome is Outcome.UPDATED and result.models[0].version == "2.0"
    paths = [f.path for f in sim.fetched("/blobs/")]
    assert paths == ["/" + patch.url], "only the patch should be downloaded"
    assert patch.length < len(v2) / 2
    assert up.store.verify(up.store.active("clf"))


def test_patch_base_mismatch_downloads_the_full_artifact(make_updater, sim, v1, v2):
    sim.publish("clf", [sim.release("1.0", [sim.artifact(v1)])])
    up = make_updater()
    up.check_once()
    other_base = b"not what the device holds" * 10
    patch = sim.patch(other_base, v2)
    art = sim.artifact(v2, patches=[patch])
    sim.publish("clf", [sim.release("2.0", [art])])
    sim.fetches.clear()
    assert up.check_once().outcome is Outcome.UPDATED
    assert [f.path for f in sim.fetched("/blobs/")] == ["/" + art.url]


def test_broken_patch_falls_back_to_full_download(make_updater, sim, v1, v2, events):
    sim.publish("clf", [sim.release("1.0", [sim.artifact(v1)])])
    up = make_updater()
    up.check_once()
    bad = sim.patch(v1, v2, data=b"BSDIFF40" + b"\x00" * 64)  # signed, but garbage
    art = sim.artifact(v2, patches=[bad])
    sim.publish("clf", [sim.release("2.0", [art])])
    sim.fetches.clear()
    result = up.check_once()
    assert result.outcome is Outcome.UPDATED
    assert [f.path for f in sim.fetched("/blobs/")] == ["/" + bad.url, "/" + art.url]
    assert any(e.kind is EventKind.FAILED and "patch" in e.reason for e in events)
    assert up.store.active("clf").sha256 == hashlib.sha256(v2).hexdigest()


def test_halted_release_rolls_back_to_the_kept_bundle_without_download(make_updater, sim, v1,
                                                                       v2, runtime):
    a1 = sim.artifact(v1)
    sim.publish("clf", [sim.release("1.0", [a1])])
    up = make_updater(runtime=runtime)
    up.check_once()
    sim.publish("clf", [sim.release("2.0", [sim.artifact(v2)]), sim.release("1.0", [a1])])
    assert up.check_once().outcome is Outcome.UPDATED
    assert runtime.predict("clf", {"x": X}).version == "2.0"
    sim.publish("clf", [sim.release("1.0", [a1])])  # the halt: a new manifest without 2.0
    sim.fetches.clear()
    result = up.check_once()
    assert result.outcome is Outcome.ROLLED_BACK and result.models[0].version == "1.0"
    assert sim.fetched("/blobs/") == []
    assert runtime.predict("clf", {"x": X}).version == "1.0"


def test_variant_switch_is_a_swap(make_updater, sim, runtime):
    from tests.client.onnx_models import scaled_model

    small, large = scaled_model(3.0), scaled_model(5.0)
    rel = sim.release("1.0", [sim.artifact(small, variant="224"),
                              sim.artifact(large, variant="448")])
    sim.publish("det", [rel])
    make_updater(runtime=runtime, variants={"det": "224"}).check_once()
    assert check_whole(runtime.predict("det", {"x": X}).outputs, X) == 3.0
    make_updater(runtime=runtime, variants={"det": "448"}).check_once()
    assert check_whole(runtime.predict("det", {"x": X}).outputs, X) == 5.0


def test_portable_artifact_without_soc_or_arch_is_selected_by_any_arch(make_updater, sim, v1,
                                                                       runtime):
    """server/compile writes platform "onnx", format "onnx" and no soc/arch for the portable
    artifact; a device reporting platform "onnx" and a real arch must get it."""
    from client_sdk import DeviceProfile

    art = sim.artifact(v1, platform="onnx", target={"runtime": "onnxruntime"})
    sim.publish("clf", [sim.release("1.0", [art])])
    up = make_updater(runtime=runtime, device=DeviceProfile("edge-1", "onnx", arch="x86_64"))
    assert up.check_once().outcome is Outcome.UPDATED
    assert runtime.predict("clf", {"x": X}).version == "1.0"


def test_epcontext_primary_gets_a_cpu_onnx_fallback_member(make_updater, sim, v1, v2):
    qnn = sim.artifact(v2, platform="android", fmt="onnx-epcontext", target={"soc": "SM8650"})
    cpu = sim.artifact(v1, platform="android", fmt="onnx")
    sim.publish("clf", [sim.release("1.0", [qnn, cpu])])
    from client_sdk import DeviceProfile

    up = make_updater(device=DeviceProfile("phone", "android", soc="SM8650"),
                      formats=["onnx", "onnx-epcontext"])
    assert up.check_once().outcome is Outcome.UPDATED
    members = up.store.active("clf").members
    assert [(m.role, m.format) for m in members] == [("primary", "onnx-epcontext"),
                                                     ("fallback", "onnx")]


def test_server_built_qnn_release_gets_the_portable_onnx_artifact_of_same_shapes_as_fallback(
        make_updater, sim, v1, v2):
    """The server compiles platform "qnn" (EPContext, per SoC) and platform "onnx" (portable
    CPU) artifacts per shape variant; a QNN device falls back to the portable one of its
    shapes, never to another shape variant's."""
    other_shapes = sim.artifact(v2, platform="onnx", fmt="onnx", variant="720p-fp32",
                                target={"shape_variant": "720p"})
    qnn = sim.artifact(v2, platform="qnn", fmt="onnx-epcontext", variant="fp16-sm8650",
                       target={"soc": "SM8650", "arch": "v75", "shape_variant": "default"})
    cpu = sim.artifact(v1, platform="onnx", fmt="onnx", variant="fp32",
                       target={"shape_variant": "default"})
    sim.publish("clf", [sim.release("1.0", [qnn, other_shapes, cpu])])
    from client_sdk import DeviceProfile

    up = make_updater(device=DeviceProfile("phone", "qnn", soc="SM8650", arch="v75"),
                      formats=["onnx", "onnx-epcontext"])
    assert up.check_once().outcome is Outcome.UPDATED
    members = up.store.active("clf").members
    assert [(m.role, m.format, m.variant) for m in members] == [
        ("primary", "onnx-epcontext", "fp16-sm8650"), ("fallback", "onnx", "fp32")]


def test_two_updaters_on_one_data_dir_do_not_install_concurrently(make_updater, sim, v1):
    import fcntl

    import pytest

    from client_sdk import InstallError

    sim.publish("clf", [sim.release("1.0", [sim.artifact(v1)])])
    up = make_updater()
    lock = up.config.data_dir / ".updater.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a+b") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(InstallError, match="another updater"):
            up.check_once()
    assert up.check_once().outcome is Outcome.UPDATED


def test_stop_during_a_download_aborts_between_chunks_and_the_next_run_resumes(
        make_updater, sim, v1, v2):
    import threading

    sim.publish("clf", [sim.release("1.0", [sim.artifact(v1)])])
    stop = threading.Event()
    seen: list = []

    def on_event(e):
        seen.append(e)
        if e.kind is EventKind.DOWNLOADING and e.done and e.version == "2.0":
            stop.set()  # SIGTERM arrives mid-download

    up = make_updater(on_event=on_event)
    up.check_once()
    art = sim.artifact(v2)
    sim.publish("clf", [sim.release("2.0", [art])])
    results: list = []
    up.run(stop, results.append)  # returns after the interrupted cycle
    (r,) = results
    assert r.models[0].outcome is Outcome.FAILED and "stopped" in r.models[0].reason
    assert up.store.active("clf").version == "1.0"
    part = up.config.data_dir / "downloads" / f"{art.sha256}.part"
    held = part.stat().st_size
    assert 0 < held < art.length
    sim.fetches.clear()
    fresh = make_updater()
    assert fresh.check_once().models[0].version == "2.0"
    assert sim.fetched("/" + art.url)[0].headers["Range"] == f"bytes={held}-"
