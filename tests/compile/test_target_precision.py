"""Precision per QNN target: an HTP generation without FP16 is built at INT8 by rule and
refuses FP16 with the fix; `target_precision` gives each named target its own; a request
without either is left alone (the precision search is not decided here)."""

from __future__ import annotations

from pathlib import Path

import pytest

import manifests.capabilities as device_side
from server.compile import InputSpec, SourceFormat
from server.compile.errors import InvalidSourceError
from server.compile.settings_map import pipeline_settings
from server.compile.target_precision import HTP_FP16_SINCE, split
from server.compile.types import CompileRequest


def _request(flat: dict[str, object]) -> CompileRequest:
    return CompileRequest(source_path=Path("m.onnx"), source_format=SourceFormat.ONNX,
                          inputs=(InputSpec("x", (1, 4)),), shape_variant="default",
                          settings=pipeline_settings("qnn", flat))


def _plan(flat: dict[str, object]) -> dict[str, list[str]]:
    return {r.settings["qnn"].get("precision", "version"): [t["name"] for t in
                                                             r.settings["qnn"]["targets"]]
            for r in split(_request(flat))}


def test_generation_without_fp16_is_built_at_int8_and_the_others_as_the_version_says() -> None:
    assert _plan({"targets": "SM8350,SM8650"}) == {"int8": ["SM8350"], "version": ["SM8650"]}
    assert _plan({"targets": "SM8350,SM8650", "target_precision": "SM8650=fp16"}) == {
        "int8": ["SM8350"], "fp16": ["SM8650"]}
    assert _plan({"targets": "SM8550,SM8650", "target_precision": "SM8550=int8"}) == {
        "int8": ["SM8550"], "version": ["SM8650"]}


def test_request_without_per_target_precision_is_unchanged() -> None:
    request = _request({"targets": "SM8550,SM8650"})
    assert split(request) == [request]


def test_fp16_on_a_generation_without_it_is_refused_with_the_fix() -> None:
    with pytest.raises(InvalidSourceError, match="SM8350=int8"):
        split(_request({"targets": "SM8350", "precision": "fp16"}))
    with pytest.raises(InvalidSourceError, match="has no FP16"):
        split(_request({"targets": "SM8350,SM8650", "target_precision": "SM8350=fp16"}))


def test_target_precision_naming_an_unknown_target_or_precision_is_refused() -> None:
    with pytest.raises(InvalidSourceError, match="not among the targets"):
        pipeline_settings("qnn", {"targets": "SM8650", "target_precision": "SM8550=int8"})
    with pytest.raises(InvalidSourceError, match="SOC=precision"):
        pipeline_settings("qnn", {"targets": "SM8650", "target_precision": "SM8650"})
    with pytest.raises(InvalidSourceError, match="fp16 or int8"):
        split(_request({"targets": "SM8650", "target_precision": "SM8650=int4"}))


def test_server_and_device_agree_on_the_first_htp_generation_with_fp16() -> None:
    assert HTP_FP16_SINCE == device_side.HTP_FP16_SINCE
