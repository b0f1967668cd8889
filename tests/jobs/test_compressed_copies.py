"""A build's compressed copy end to end: the runner stores it beside the artifact, the
manifest offers it, the server serves it, and a device installs the content from it."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
from sqlalchemy import select

from client_sdk import DeviceProfile, Outcome, Updater, UpdaterConfig, Via, compression
from manifests import Envelope
from server.db import models as db
from server.publish import copies
from tests.client.test_against_server import AppTransport
from tests.jobs.test_inprocess import CONV_INPUTS
from tests.support.inprocess_app import inprocess_app, wait_settled


def _release(client, convnet_files) -> dict:
    r = client.post("/v1/models", json={"name": "conv"})
    assert r.status_code in (200, 201), r.text
    files = {"model": ("m.onnx", convnet_files.onnx.read_bytes()),
             "reference": ("r.npz", convnet_files.reference.read_bytes())}
    meta = {"version": "1.0.0", "platforms": ["onnx"], "inputs": CONV_INPUTS}
    r = client.post("/v1/models/conv/versions", files=files,
                    data={"metadata": json.dumps(meta)})
    assert r.status_code == 201, r.text
    body = wait_settled(client, "conv", "1.0.0", 300)
    assert body["state"] == "ready", [(b["error"], b["log"][-600:]) for b in client.get(
        "/v1/models/conv/versions/1.0.0/builds").json()]
    assert client.post("/v1/channels", json={"name": "prod"}).status_code == 201
    r = client.post("/v1/channels/prod/rollouts",
                    json={"model": "conv", "version": "1.0.0", "percentage": 100})
    assert r.status_code == 201, r.text
    env = Envelope.from_bytes(client.get("/v1/channels/prod/manifest").content, 1 << 20)
    (art,) = json.loads(env.payload)["models"]["conv"]["releases"][0]["artifacts"]
    return dict(art)


def _updater(client, tmp_path: Path) -> Updater:
    return Updater(UpdaterConfig(
        base_url="http://testserver", channel="prod",
        pinned_root=client.get("/v1/root/1.json").content,
        device=DeviceProfile("edge-1", "onnx", arch="x86_64"), data_dir=tmp_path / "device",
        transport=AppTransport(client), formats=["onnx"]))


def test_build_stores_and_serves_a_compressed_copy_the_device_installs_from(
        convnet_files, tmp_path, monkeypatch):
    # The test convnet's random weights barely compress; any saving makes a copy here.
    monkeypatch.setattr(compression, "MIN_SAVING", 0.0)
    with inprocess_app(tmp_path, scopes=("publish", "rollout")) as client:
        art = _release(client, convnet_files)
        copy = art["compressed"]
        # The codec is the content's (`best_codec`; shuffled copies end to end:
        # tests/client/test_protected_agent.py).
        assert copy["codec"] in compression.CODECS and copy["length"] < art["length"]
        with client.app.state.session_factory() as s:
            row = s.scalars(select(db.Artifact)).one()
            assert (row.compressed_sha256, row.compressed_length) == (copy["sha256"],
                                                                      copy["length"])
        # The builds API shows the release engineer the same copy the manifest signs.
        [build] = client.get("/v1/models/conv/versions/1.0.0/builds").json()
        assert build["artifact"]["compressed"] == {
            "codec": copy["codec"], "sha256": copy["sha256"], "length": copy["length"]}
        served = client.get(copy["url"]).content
        assert hashlib.sha256(served).hexdigest() == copy["sha256"]
        content = io.BytesIO()
        assert compression.decompress(io.BytesIO(served), content, art["length"],
                                      copy["codec"]) == art["sha256"]
        assert client.get(art["url"]).content == content.getvalue()  # old SDKs: unchanged

        up = _updater(client, tmp_path)
        result = up.check_once()
        assert result.outcome is Outcome.UPDATED, result
        (m,) = result.models
        assert (m.via, m.nbytes, m.sha256) == (Via.FULL, copy["length"], art["sha256"])
        paths = up.config.transport.paths  # type: ignore[attr-defined]
        assert f"/v1/artifacts/{copy['sha256']}" in paths
        assert f"/v1/artifacts/{art['sha256']}" not in paths


def test_build_whose_copy_saves_too_little_offers_none(convnet_files, tmp_path, monkeypatch):
    monkeypatch.setattr(compression, "MIN_SAVING", 1.0)  # no copy can save 100%
    with inprocess_app(tmp_path, scopes=("publish", "rollout")) as client:
        art = _release(client, convnet_files)
        assert "compressed" not in art
        with client.app.state.session_factory() as s:
            assert s.scalars(select(db.Artifact.compressed_sha256)).one() is None
        [build] = client.get("/v1/models/conv/versions/1.0.0/builds").json()
        assert build["artifact"]["compressed"] is None


def test_copy_is_the_codec_best_codec_picks_byte_for_byte_below_and_above_large(
        tmp_path, monkeypatch):
    """The stored copy is exactly what `compress` makes with the codec `best_codec` picks, at
    either level (below and above ``LARGE``), with nothing else left beside it."""
    monkeypatch.setattr(compression, "LARGE", 1 << 18)
    w = np.random.default_rng(3).standard_normal(300_000)
    int8 = np.clip(np.round(w * 10), -127, 127).astype(np.int8)
    for data, want in ((w.astype(np.float16).tobytes(), "zstd-shuffle2"),
                       (w.astype(np.float32).tobytes(), "zstd-shuffle4"),
                       (int8.tobytes(), "zstd"), (int8.tobytes()[:100_000], "zstd")):
        work = tmp_path / f"{want}-{len(data)}"
        work.mkdir()
        src, out = work / "content", work / "content.zst"
        src.write_bytes(data)
        sha, length, codec = copies.compress_copy(src, out) or ("", 0, "")
        assert (codec, length) == (want, out.stat().st_size)
        assert compression.best_codec(io.BytesIO(data), len(data)) == want
        again = io.BytesIO()
        compression.compress(io.BytesIO(data), again, len(data), codec=want)
        assert out.read_bytes() == again.getvalue()
        assert sha == hashlib.sha256(again.getvalue()).hexdigest()
        assert sorted(p.name for p in work.iterdir()) == ["content", "content.zst"]
