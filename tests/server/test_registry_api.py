"""Registry API end to end over HTTP (TestClient), on SQLite and PostgreSQL: models, version
uploads, idempotency, clear 4xx for bad input, nothing half-written, auth and audit."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from server.blobstore import BlobBackendError, LocalBlobStore
from server.db.models import ModelVersion, SourceUpload
from tests.server.server_testdata import make_onnx_bytes, npz_bytes

# Pure input validation does not depend on the database: run those cases on SQLite only.
sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)

META: dict[str, Any] = {
    "version": "1.0.0",
    "platforms": {"onnx": {}, "coreml": {"compute_precision": "fp16"}},
    "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 3, 8, 8]}],
}


def meta(**changes: Any) -> str:
    return json.dumps({**META, **changes})


def create_model(client: TestClient, headers: dict[str, str], name: str = "resnet") -> None:
    r = client.post("/v1/models", json={"name": name, "task": "classification"}, headers=headers)
    assert r.status_code == 201, r.text


def upload(client: TestClient, headers: dict[str, str], data: bytes, metadata: str,
           name: str = "resnet", **extra: bytes) -> Any:
    files: dict[str, Any] = {"model": ("model.onnx", data, "application/octet-stream")}
    for field, content in extra.items():
        files[field] = (f"{field}.npz", content, "application/octet-stream")
    return client.post(f"/v1/models/{name}/versions", files=files, data={"metadata": metadata},
                       headers=headers)


def blob_keys(client: TestClient) -> list[str]:
    return list(client.app.state.services.blob_store.list_keys())  # type: ignore[attr-defined]


def count(factory: sessionmaker[Session], model: type) -> int:
    with factory() as s:
        return int(s.scalar(select(func.count()).select_from(model)) or 0)


# --------------------------------------------------------------------------- models


def test_create_model_then_get_and_list(client: TestClient, publish_headers) -> None:
    r = client.post("/v1/models", json={"name": "resnet", "description": "d",
                                        "task": "classification", "owner": "vision"},
                    headers=publish_headers)
    assert r.status_code == 201
    assert r.json()["name"] == "resnet" and r.json()["created_by"].startswith("token:")
    assert client.get("/v1/models/resnet").json()["task"] == "classification"
    assert [m["name"] for m in client.get("/v1/models").json()["models"]] == ["resnet"]


def test_creating_the_same_model_again_is_idempotent_and_different_is_409(
    client: TestClient, publish_headers
) -> None:
    body = {"name": "resnet", "description": "same"}
    assert client.post("/v1/models", json=body, headers=publish_headers).status_code == 201
    assert client.post("/v1/models", json=body, headers=publish_headers).status_code == 200
    r = client.post("/v1/models", json={**body, "description": "other"}, headers=publish_headers)
    assert r.status_code == 409 and r.json()["field"] == "name"


@sqlite_only
def test_bad_model_name_is_422_naming_the_field(client: TestClient, publish_headers) -> None:
    r = client.post("/v1/models", json={"name": "Bad Name!"}, headers=publish_headers)
    assert r.status_code == 422
    assert "name" in json.dumps(r.json())


def test_unknown_model_is_404(client: TestClient) -> None:
    r = client.get("/v1/models/nope/versions/1.0.0")
    assert r.status_code == 404 and "does not exist" in r.json()["detail"]


# --------------------------------------------------------------------------- auth


def test_write_without_token_is_401_with_the_fix(client: TestClient) -> None:
    r = client.post("/v1/models", json={"name": "resnet"})
    assert r.status_code == 401
    assert r.json()["detail"] == "missing API token"
    assert "modelfleet tokens create" in r.json()["fix"]


@sqlite_only
def test_unknown_and_malformed_tokens_are_401(client: TestClient) -> None:
    for header in ["Bearer mf_not_a_real_token", "Basic abc", "Bearer"]:
        r = client.post("/v1/models", json={"name": "resnet"}, headers={"Authorization": header})
        assert r.status_code == 401, header


def test_token_without_the_scope_is_403_naming_the_scope(
    client: TestClient, make_token: Callable[..., str]
) -> None:
    headers = {"Authorization": f"Bearer {make_token('rollout')}"}
    r = client.post("/v1/models", json={"name": "resnet"}, headers=headers)
    assert r.status_code == 403
    assert "'publish'" in r.json()["detail"] and "--scope publish" in r.json()["fix"]


@sqlite_only
def test_admin_token_may_publish(client: TestClient, make_token: Callable[..., str]) -> None:
    headers = {"Authorization": f"Bearer {make_token('admin')}"}
    assert client.post("/v1/models", json={"name": "m"}, headers=headers).status_code == 201


def test_revoked_token_is_401(client: TestClient, make_token, session_factory) -> None:
    from server.auth import list_tokens, revoke_token

    secret = make_token("publish")
    with session_factory() as s:
        revoke_token(s, list_tokens(s)[-1].id)
        s.commit()
    r = client.post("/v1/models", json={"name": "m"}, headers={"Authorization": f"Bearer {secret}"})
    assert r.status_code == 401 and "revoked" in r.json()["detail"]


def test_tokens_are_stored_as_peppered_hashes(make_token, session_factory, settings) -> None:
    import hashlib

    from server.auth import hash_token, list_tokens

    secret = make_token("publish")
    with session_factory() as s:
        row = list_tokens(s)[-1]
    assert row.token_hash == hash_token(secret, settings.token_pepper)
    assert row.token_hash != hashlib.sha256(secret.encode()).hexdigest()


def test_token_hashed_under_another_pepper_is_refused(client: TestClient, session_factory) -> None:
    from server.auth import create_token

    with session_factory() as s:
        _row, secret = create_token(s, ["admin"], pepper="some-other-pepper-value")
        s.commit()
    r = client.post("/v1/models", json={"name": "m"}, headers={"Authorization": f"Bearer {secret}"})
    assert r.status_code == 401 and r.json()["detail"] == "unknown API token"


# --------------------------------------------------------------------------- uploads


def test_upload_onnx_version_records_sha_state_builds_and_enqueues(
    client: TestClient, publish_headers, onnx_bytes: bytes, job_queue
) -> None:
    import hashlib

    create_model(client, publish_headers)
    r = upload(client, publish_headers, onnx_bytes, meta())
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["state"] == "uploaded"
    assert body["source_format"] == "onnx"
    assert body["sha256"] == hashlib.sha256(onnx_bytes).hexdigest()
    assert body["length"] == len(onnx_bytes)
    assert {(b["platform"], b["variant"]) for b in body["builds"]} == {
        ("onnx", "default"), ("coreml", "default")}
    got = client.get("/v1/models/resnet/versions/1.0.0").json()
    assert got["state"] == "uploaded" and got["sha256"] == body["sha256"]
    assert [v["version"] for v in client.get("/v1/models/resnet/versions").json()["versions"]] \
        == ["1.0.0"]
    assert len(job_queue.enqueued) == 1
    # The stored blob is the uploaded file, byte for byte.
    (key,) = blob_keys(client)
    with client.app.state.services.blob_store.open(key) as f:  # type: ignore[attr-defined]
        assert f.read() == onnx_bytes


@sqlite_only
def test_shape_variants_make_one_build_per_platform_and_variant(
    client: TestClient, publish_headers, onnx_bytes: bytes
) -> None:
    create_model(client, publish_headers)
    shapes = {"360p": [1, 3, 360, 640], "720p": [1, 3, 720, 1280], "1080p": [1, 3, 1080, 1920]}
    dynamic = make_onnx_bytes(extra_inputs=("t",), dims=(1, 3, "height", "width"))
    r = upload(client, publish_headers, dynamic, meta(
        platforms=["onnx", "qnn"],
        inputs=[{"name": "x", "dtype": "float32", "shapes": shapes},
                # The graph's `t` is float32: a declared int64 is a 422 since issue 19.
                {"name": "t", "dtype": "float32", "shape": [1]}]))
    assert r.status_code == 201, r.text
    assert r.json()["variants"] == ["360p", "720p", "1080p"]
    assert len(r.json()["builds"]) == 6
    assert r.json()["inputs"][1]["shapes"] == {"360p": [1], "720p": [1], "1080p": [1]}


@sqlite_only
@pytest.mark.parametrize(
    ("inputs", "field", "detail"),
    [
        ([{"name": "x", "dtype": "float32", "shape": [1, 3, 16, 8]}],
         "metadata.inputs[0].shape[2]", "dim 2: declared 16, but the ONNX input 'x' is "
         "[1, 3, 8, 8]"),
        ([{"name": "x", "dtype": "float32",
           "shapes": {"small": [1, 3, 8, 8], "big": [2, 3, 8, 8]}}],
         "metadata.inputs[0].shapes.big[0]", "dim 0: declared 2, but the ONNX input 'x' is "
         "[1, 3, 8, 8] (shape variant 'big')"),
        ([{"name": "x", "dtype": "float32", "shape": [1, 3, 8]}],
         "metadata.inputs[0].shape", "has rank 3 but the ONNX input has rank 4"),
    ],
)
def test_declared_shape_contradicting_a_static_onnx_dim_is_422_at_upload(
    client: TestClient, publish_headers, onnx_bytes: bytes, inputs: list[dict[str, Any]],
    field: str, detail: str, session_factory: sessionmaker[Session],
) -> None:
    # Before: 201, and every build of that variant failed later with "fixed at (1, 3, 8, 8)".
    create_model(client, publish_headers)
    r = upload(client, publish_headers, onnx_bytes, meta(inputs=inputs))
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field and detail in r.json()["detail"], r.json()
    assert blob_keys(client) == [] and count(session_factory, ModelVersion) == 0


@sqlite_only
def test_a_symbolic_onnx_dim_takes_any_declared_size(
        client: TestClient, publish_headers) -> None:
    create_model(client, publish_headers)
    data = make_onnx_bytes(extra_inputs=(), dims=("n", 3, 8, 8))
    ok = upload(client, publish_headers, data, meta(
        inputs=[{"name": "x", "dtype": "float32", "shape": [4, 3, 8, 8]}]))
    assert ok.status_code == 201, ok.text  # a symbolic dim takes any declared size


def test_identical_reupload_returns_existing_version_with_200(
    client: TestClient, publish_headers, onnx_bytes: bytes, session_factory
) -> None:
    create_model(client, publish_headers)
    first = upload(client, publish_headers, onnx_bytes, meta())
    again = upload(client, publish_headers, onnx_bytes, meta())
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["created_at"] == first.json()["created_at"]
    assert len(blob_keys(client)) == 1
    assert count(session_factory, ModelVersion) == 1


def test_different_file_under_existing_version_is_409_and_changes_nothing(
    client: TestClient, publish_headers, onnx_bytes: bytes, session_factory
) -> None:
    create_model(client, publish_headers)
    upload(client, publish_headers, onnx_bytes, meta())
    r = upload(client, publish_headers, make_onnx_bytes(3.0), meta())
    assert r.status_code == 409
    assert "different model file" in r.json()["detail"]
    assert "new version" in r.json()["fix"]
    assert len(blob_keys(client)) == 1
    assert count(session_factory, SourceUpload) == 1


def test_different_metadata_under_existing_version_is_409(
    client: TestClient, publish_headers, onnx_bytes: bytes
) -> None:
    create_model(client, publish_headers)
    upload(client, publish_headers, onnx_bytes, meta())
    r = upload(client, publish_headers, onnx_bytes, meta(platforms=["onnx"]))
    assert r.status_code == 409 and "metadata" in r.json()["detail"]


@sqlite_only
@pytest.mark.parametrize("fmt", ["pt2", "torchscript"])
def test_torch_sources_are_recognised(client: TestClient, publish_headers, torch_files,
                                      fmt: str) -> None:
    create_model(client, publish_headers)
    r = upload(client, publish_headers, torch_files[fmt], meta())
    assert r.status_code == 201, r.text
    assert r.json()["source_format"] == fmt


def test_calibration_and_reference_npz_are_stored(client: TestClient, publish_headers,
                                                  onnx_bytes: bytes) -> None:
    create_model(client, publish_headers)
    data = npz_bytes(x=np.zeros((4, 1, 3, 8, 8), dtype=np.float32))
    r = upload(client, publish_headers, onnx_bytes, meta(), calibration=data, reference=data)
    assert r.status_code == 201, r.text
    assert sorted(u["kind"] for u in r.json()["uploads"]) == ["calibration", "model", "reference"]
    assert len(blob_keys(client)) == 3


BAD_FILES = {
    "text": b"this is not a model\n" * 10,
    "zip_without_torch_layout": npz_bytes(a=np.zeros(3)),
    "empty": b"",
    "truncated_onnx": make_onnx_bytes()[:-7],
}


@sqlite_only
@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_wrong_model_file_type_is_415_naming_the_model_field(
    client: TestClient, publish_headers, kind: str, session_factory
) -> None:
    create_model(client, publish_headers)
    r = upload(client, publish_headers, BAD_FILES[kind], meta())
    assert r.status_code == 415, r.text
    assert r.json()["field"] == "model" and ".onnx" in r.json()["fix"]
    assert blob_keys(client) == [] and count(session_factory, ModelVersion) == 0


@sqlite_only
def test_onnx_with_external_weights_is_415_with_the_export_fix(
    client: TestClient, publish_headers, tmp_path
) -> None:
    import onnx

    model = onnx.load_model_from_string(make_onnx_bytes())
    onnx.save_model(model, tmp_path / "m.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="m.onnx.data", size_threshold=0)
    create_model(client, publish_headers)
    r = upload(client, publish_headers, (tmp_path / "m.onnx").read_bytes(), meta())
    assert r.status_code == 415, r.text
    assert "external-data" in r.json()["detail"] and "external_data=False" in r.json()["fix"]
    assert blob_keys(client) == []


@sqlite_only
def test_non_npz_calibration_is_415_naming_the_field(client: TestClient, publish_headers,
                                                     onnx_bytes: bytes) -> None:
    create_model(client, publish_headers)
    r = upload(client, publish_headers, onnx_bytes, meta(), calibration=b"nope")
    assert r.status_code == 415 and r.json()["field"] == "calibration"
    assert blob_keys(client) == []


@sqlite_only
@pytest.mark.parametrize(
    ("changes", "field", "fix_words"),
    [
        ({"version": "1.0"}, "metadata.version", "MAJOR.MINOR.PATCH"),
        ({"version": "v1.0.0"}, "metadata.version", "MAJOR.MINOR.PATCH"),
        ({"platforms": ["onnx", "tpu"]}, "metadata.platforms.tpu", "coreml"),
        ({"platforms": []}, "metadata.platforms", "at least one"),
        ({"inputs": [{"name": "x", "dtype": "float32"}]}, "metadata.inputs[0].shape", "static"),
        ({"inputs": [{"name": "x", "dtype": "float32", "shape": [1, -1]}]},
         "metadata.inputs[0].shape[1]", "static"),
        ({"inputs": [{"name": "x", "dtype": "float32", "shape": [1, None]}]},
         "metadata.inputs[0].shape[1]", "static"),
        ({"inputs": [{"name": "x", "dtype": "complex64", "shape": [1]}]},
         "metadata.inputs[0].dtype", "float32"),
        ({"inputs": []}, "metadata.inputs", None),
        ({"inputs": [{"name": "a", "dtype": "float32", "shapes": {"s": [1]}},
                     {"name": "b", "dtype": "float32", "shapes": {"m": [1]}}]},
         "metadata.inputs", "same variant names"),
        ({"platform": ["onnx"]}, "metadata.platform", "remove"),
    ],
)
def test_bad_metadata_is_422_naming_the_field_and_fix(
    client: TestClient, publish_headers, onnx_bytes: bytes, changes: dict[str, Any], field: str,
    fix_words: str | None, session_factory,
) -> None:
    create_model(client, publish_headers)
    r = upload(client, publish_headers, onnx_bytes, meta(**changes))
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field
    if fix_words:
        assert fix_words in r.json()["fix"]
    assert blob_keys(client) == [] and count(session_factory, ModelVersion) == 0


@sqlite_only
@pytest.mark.parametrize(
    ("inputs", "field", "fix_words"),
    [
        ([{"name": "image", "dtype": "float32", "shape": [1]}], "metadata.inputs[0].name",
         "model's input names: x"),
        ([{"name": "x", "dtype": "float32", "shape": [1]},
          {"name": "extra", "dtype": "float32", "shape": [1]}], "metadata.inputs[1].name", "x"),
    ],
)
def test_metadata_input_names_must_match_the_onnx_inputs(
    client: TestClient, publish_headers, onnx_bytes: bytes, inputs: list[dict[str, Any]],
    field: str, fix_words: str,
) -> None:
    create_model(client, publish_headers)
    r = upload(client, publish_headers, onnx_bytes, meta(inputs=inputs))
    assert r.status_code == 422, r.text
    assert (r.json()["field"], fix_words in r.json()["fix"]) == (field, True)
    assert blob_keys(client) == []


@sqlite_only
def test_onnx_input_without_a_spec_is_422(client: TestClient, publish_headers) -> None:
    create_model(client, publish_headers)
    r = upload(client, publish_headers, make_onnx_bytes(extra_inputs=("mask",)), meta())
    assert r.status_code == 422 and r.json()["field"] == "metadata.inputs"
    assert "'mask'" in r.json()["detail"]


@sqlite_only
def test_metadata_not_json_is_422(client: TestClient, publish_headers, onnx_bytes) -> None:
    create_model(client, publish_headers)
    r = upload(client, publish_headers, onnx_bytes, "{version: 1")
    assert r.status_code == 422 and r.json()["field"] == "metadata"


def test_oversize_model_is_413_and_leaves_nothing(client: TestClient, publish_headers,
                                                  onnx_bytes: bytes, session_factory) -> None:
    create_model(client, publish_headers)
    cap = client.app.state.settings.max_model_bytes  # type: ignore[attr-defined]
    big = onnx_bytes + b"\x00" * (cap + 1 - len(onnx_bytes))
    r = upload(client, publish_headers, big, meta())
    assert r.status_code == 413 and r.json()["field"] == "model"
    assert blob_keys(client) == [] and count(session_factory, ModelVersion) == 0


@sqlite_only
def test_request_body_over_the_whole_request_cap_is_413(client: TestClient, publish_headers,
                                                        onnx_bytes: bytes) -> None:
    create_model(client, publish_headers)
    s = client.app.state.settings  # type: ignore[attr-defined]
    huge = b"\x00" * (s.max_model_bytes + 2 * s.max_npz_bytes + s.max_metadata_bytes + 2**21)
    r = upload(client, publish_headers, huge, meta())
    assert r.status_code == 413 and r.json()["code"] == "payload_too_large"


class FailOnField(LocalBlobStore):
    """A real local store whose write of one file field fails like a full disk would."""

    def __init__(self, root, field: str) -> None:  # type: ignore[no-untyped-def]
        super().__init__(root)
        self.field = field

    def put(self, key, source, **kw):  # type: ignore[no-untyped-def,override]
        if key.endswith("/" + self.field):
            raise BlobBackendError("No space left on device")
        return super().put(key, source, **kw)


def test_storage_failure_midway_leaves_no_blob_and_no_version(
    client: TestClient, publish_headers, onnx_bytes: bytes, tmp_path, session_factory
) -> None:
    create_model(client, publish_headers)
    store = FailOnField(tmp_path / "failing", "reference")
    client.app.state.services.blob_store = store  # type: ignore[attr-defined]
    data = npz_bytes(x=np.ones((2, 1, 3, 8, 8), dtype=np.float32))
    r = upload(client, publish_headers, onnx_bytes, meta(), calibration=data, reference=data)
    assert r.status_code == 503 and "No space left" in r.json()["detail"]
    assert list(store.list_keys()) == []  # model + calibration blobs were removed again
    assert count(session_factory, ModelVersion) == 0
    assert count(session_factory, SourceUpload) == 0


def test_upload_to_s3_store_over_http(client: TestClient, publish_headers, onnx_bytes: bytes,
                                      s3_bucket) -> None:
    from server.blobstore.s3 import S3BlobStore

    client.app.state.services.blob_store = S3BlobStore(  # type: ignore[attr-defined]
        s3_bucket.bucket, endpoint_url=s3_bucket.endpoint_url, access_key="testing",
        secret_key="testing")
    create_model(client, publish_headers)
    assert upload(client, publish_headers, onnx_bytes, meta()).status_code == 201
    listed = s3_bucket.client().list_objects_v2(Bucket=s3_bucket.bucket)["Contents"]
    (obj,) = listed
    body = s3_bucket.client().get_object(Bucket=s3_bucket.bucket, Key=obj["Key"])["Body"].read()
    assert body == onnx_bytes


def test_s3_bucket_missing_is_503_and_no_version(client: TestClient, publish_headers,
                                                 onnx_bytes: bytes, s3_server: str,
                                                 session_factory) -> None:
    from server.blobstore.s3 import S3BlobStore

    client.app.state.services.blob_store = S3BlobStore(  # type: ignore[attr-defined]
        "missing-bucket", endpoint_url=s3_server, access_key="testing", secret_key="testing")
    create_model(client, publish_headers)
    r = upload(client, publish_headers, onnx_bytes, meta())
    assert r.status_code == 503 and "NoSuchBucket" in r.json()["detail"]
    assert count(session_factory, ModelVersion) == 0


def test_versions_list_newest_semver_first(client: TestClient, publish_headers) -> None:
    create_model(client, publish_headers)
    for i, v in enumerate(["1.2.0", "1.10.0", "1.10.0-rc.1", "0.9.0"]):
        r = upload(client, publish_headers, make_onnx_bytes(float(i + 2)), meta(version=v))
        assert r.status_code == 201, r.text
    got = [v["version"] for v in client.get("/v1/models/resnet/versions").json()["versions"]]
    assert got == ["1.10.0", "1.10.0-rc.1", "1.2.0", "0.9.0"]


# --------------------------------------------------------------------------- audit


def test_every_write_is_audited_with_the_actor(client: TestClient, publish_headers,
                                               onnx_bytes: bytes) -> None:
    create_model(client, publish_headers)
    upload(client, publish_headers, onnx_bytes, meta())
    upload(client, publish_headers, make_onnx_bytes(5.0), meta())  # 409: not a write
    events = client.get("/v1/audit", headers=publish_headers).json()["events"]
    assert [(e["action"], e["target"]) for e in events] == [
        ("version.upload", "resnet/1.0.0"), ("model.create", "resnet")]
    assert all(e["actor"].startswith("token:") for e in events)


def test_audit_needs_a_token(client: TestClient) -> None:
    assert client.get("/v1/audit").status_code == 401


class CompetingUploadOnFirstPut(LocalBlobStore):
    """A real local store; on its first write, another client's upload of the same version
    commits first (the race the unique constraint settles)."""

    def __init__(self, root, compete) -> None:  # type: ignore[no-untyped-def]
        super().__init__(root)
        self.compete = compete

    def put(self, key, source, **kw):  # type: ignore[no-untyped-def,override]
        compete, self.compete = self.compete, None
        if compete is not None:
            compete()
        return super().put(key, source, **kw)


@pytest.mark.parametrize("same_file", [True, False])
def test_losing_a_concurrent_upload_race_leaves_no_trace(
    client: TestClient, publish_headers, onnx_bytes: bytes, tmp_path, session_factory,
    same_file: bool,
) -> None:
    create_model(client, publish_headers)
    winner_store = LocalBlobStore(tmp_path / "winner")

    def competing_upload() -> None:
        with TestClient(client.app) as other:  # type: ignore[arg-type]
            other.app.state.services.blob_store = winner_store  # type: ignore[attr-defined]
            r = upload(other, publish_headers, onnx_bytes, meta())
            assert r.status_code == 201

    loser_store = CompetingUploadOnFirstPut(tmp_path / "loser", competing_upload)
    client.app.state.services.blob_store = loser_store  # type: ignore[attr-defined]
    data = onnx_bytes if same_file else make_onnx_bytes(7.0)
    r = upload(client, publish_headers, data, meta())
    assert r.status_code == (200 if same_file else 409), r.text
    assert list(loser_store.list_keys()) == []  # the loser's blob was removed again
    assert len(list(winner_store.list_keys())) == 1
    assert count(session_factory, ModelVersion) == 1
    assert count(session_factory, SourceUpload) == 1


@sqlite_only
def test_unknown_or_repeated_query_parameters_are_named(client: TestClient,
                                                        publish_headers) -> None:
    r = client.get("/v1/models?limt=5")
    assert r.status_code == 422 and r.json()["field"] == "limt" and "limit" in r.json()["fix"]
    r = client.get("/v1/audit?action=a&action=b", headers=publish_headers)
    assert r.status_code == 422 and r.json()["field"] == "action"
    assert client.get("/v1/models?limit=5").status_code == 200
