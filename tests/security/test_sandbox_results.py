"""What a compromised compile child can hand back, and what the trusted parent stores of it:
`read_result` must refuse lies about artifacts (symlinks and hard links to host files, paths
out of the output directory, wrong hashes, wrong formats), unsafe names that would become
blob keys, and oversized documents."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from server.compile import BuildSpec, InputSpec, SourceFormat
from server.compile.cohorts import WatermarkSpec
from server.compile.sandbox_result import (
    MAX_ERROR_CHARS,
    MAX_RESULT_BYTES,
    RESULT_FILE,
    ResultError,
    read_result,
)

SPEC = BuildSpec(source_path=Path("/job/in/model.onnx"), source_format=SourceFormat.ONNX,
                 variants={"default": (InputSpec("x", (1, 4)),)}, platforms=("onnx",))


def onnx_bytes() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    return helper.make_model(graph).SerializeToString()


def outcome(path: str, data: bytes, **changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "platform": "onnx", "variant": "fp32", "state": "ready", "format": "onnx",
        "precision": "fp32", "target": {"platform": "onnx", "variant": "fp32",
                                        "format": "onnx"},
        "compile_settings": {}, "gates": {}, "notes": [], "error": "",
        "compile_seconds": 0.1,
        "artifact": {"path": path, "sha256": hashlib.sha256(data).hexdigest(),
                     "length": len(data), "packing": "file"}}
    doc.update(changes)
    return doc


def write(out: Path, *outcomes: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULT_FILE).write_text(json.dumps({"outcomes": list(outcomes)}))


def test_honest_result_is_accepted_with_recomputed_hash(tmp_path: Path) -> None:
    data = onnx_bytes()
    (tmp_path / "model.onnx").write_bytes(data)
    write(tmp_path, outcome("model.onnx", data))
    (o,) = read_result(tmp_path, SPEC).outcomes
    assert o.state == "ready" and o.artifact is not None
    assert o.artifact.sha256 == hashlib.sha256(data).hexdigest()


def test_artifact_symlink_to_a_host_file_is_not_stored(tmp_path: Path) -> None:
    secret = tmp_path.parent / "host-secret.key"
    secret.write_bytes(b"seed")
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(secret, out / "model.onnx")
    write(out, outcome("model.onnx", b"seed"))
    (o,) = read_result(out, SPEC).outcomes
    assert o.state == "failed" and o.artifact is None
    assert "outside the output directory" in o.error or "regular" in o.error


def test_hard_linked_artifact_is_not_stored(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    data = onnx_bytes()
    (tmp_path / "elsewhere.onnx").write_bytes(data)
    os.link(tmp_path / "elsewhere.onnx", out / "model.onnx")
    write(out, outcome("model.onnx", data))
    (o,) = read_result(out, SPEC).outcomes
    assert o.state == "failed" and "singly linked" in o.error


@pytest.mark.parametrize("path", ["../outside.onnx", "/etc/hostname", "a/../../x.onnx"])
def test_artifact_path_traversal_is_refused(tmp_path: Path, path: str) -> None:
    out = tmp_path / "out"
    data = onnx_bytes()
    (tmp_path / "outside.onnx").write_bytes(data)
    write(out, outcome(path, data))
    (o,) = read_result(out, SPEC).outcomes
    assert o.state == "failed" and o.artifact is None


def test_artifact_whose_reported_hash_lies_is_refused(tmp_path: Path) -> None:
    data = onnx_bytes()
    (tmp_path / "model.onnx").write_bytes(data)
    write(tmp_path, outcome("model.onnx", data + b"other"))
    (o,) = read_result(tmp_path, SPEC).outcomes
    assert o.state == "failed" and "sha256" in o.error


def test_artifact_that_is_not_the_format_it_claims_is_refused(tmp_path: Path) -> None:
    data = b"#!/bin/sh\nrm -rf /\n"
    (tmp_path / "model.onnx").write_bytes(data)
    write(tmp_path, outcome("model.onnx", data))
    (o,) = read_result(tmp_path, SPEC).outcomes
    assert o.state == "failed" and "not an ONNX model" in o.error


@pytest.mark.parametrize("variant", ["../../manifests/prod", "a/b", "", "x" * 300])
def test_variant_name_that_would_escape_the_blob_key_is_refused(tmp_path: Path,
                                                                variant: str) -> None:
    data = onnx_bytes()
    (tmp_path / "model.onnx").write_bytes(data)
    write(tmp_path, outcome("model.onnx", data, variant=variant))
    with pytest.raises(ResultError, match="unsafe variant"):
        read_result(tmp_path, SPEC)


def test_outcome_for_a_platform_not_requested_is_refused(tmp_path: Path) -> None:
    data = onnx_bytes()
    (tmp_path / "model.onnx").write_bytes(data)
    write(tmp_path, outcome("model.onnx", data, platform="coreml"))
    with pytest.raises(ResultError, match="not requested"):
        read_result(tmp_path, SPEC)


def test_oversized_result_document_is_refused(tmp_path: Path) -> None:
    (tmp_path / RESULT_FILE).write_text(json.dumps({"outcomes": [], "pad": "x" *
                                                    MAX_RESULT_BYTES}))
    with pytest.raises(ResultError, match="at most"):
        read_result(tmp_path, SPEC)


def test_result_document_nested_to_exhaust_the_parser_is_refused(tmp_path: Path) -> None:
    (tmp_path / RESULT_FILE).write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ResultError):
        read_result(tmp_path, SPEC)


def test_error_text_coming_back_is_capped(tmp_path: Path) -> None:
    (tmp_path / RESULT_FILE).write_text(json.dumps(
        {"error": {"kind": "compile", "message": "A" * 500_000}}))
    result = read_result(tmp_path, SPEC)
    assert len(result.error) < MAX_ERROR_CHARS + 50 and result.error.endswith("[truncated]")


def _cohort_entries(out: Path, n: int) -> list[dict[str, Any]]:
    entries = []
    for c in range(n):
        model = onnx.load_from_string(onnx_bytes())
        model.producer_name = f"cohort {c}"  # distinct bytes per cohort
        data = model.SerializeToString()
        (out / f"c{c}").mkdir(parents=True, exist_ok=True)
        (out / f"c{c}" / "model.onnx").write_bytes(data)
        entries.append({"path": f"c{c}/model.onnx", "sha256": hashlib.sha256(data).hexdigest(),
                        "length": len(data), "packing": "file"})
    return entries


WATERMARKED = replace(SPEC, watermark=WatermarkSpec(3, b"k" * 32))


def test_cohort_artifacts_come_back_validated_one_per_cohort(tmp_path: Path) -> None:
    data = onnx_bytes()
    (tmp_path / "model.onnx").write_bytes(data)
    write(tmp_path, outcome("model.onnx", data, cohorts=_cohort_entries(tmp_path, 3)))
    (o,) = read_result(tmp_path, WATERMARKED).outcomes
    assert o.state == "ready" and [c.path.parent.name for c in o.cohorts] == ["c0", "c1", "c2"]


def test_a_wrong_number_of_cohort_artifacts_is_refused(tmp_path: Path) -> None:
    data = onnx_bytes()
    (tmp_path / "model.onnx").write_bytes(data)
    write(tmp_path, outcome("model.onnx", data, cohorts=_cohort_entries(tmp_path, 2)))
    (o,) = read_result(tmp_path, WATERMARKED).outcomes
    assert o.state == "failed" and o.cohorts == [] and "not 0 or 3" in o.error


def test_cohort_artifact_symlink_to_a_host_file_is_not_stored(tmp_path: Path) -> None:
    data = onnx_bytes()
    (tmp_path / "model.onnx").write_bytes(data)
    entries = _cohort_entries(tmp_path, 3)
    (tmp_path / "c1" / "model.onnx").unlink()
    (tmp_path / "c1" / "model.onnx").symlink_to("/etc/passwd")
    write(tmp_path, outcome("model.onnx", data, cohorts=entries))
    (o,) = read_result(tmp_path, WATERMARKED).outcomes
    assert o.state == "failed" and o.artifact is None and o.cohorts == []
