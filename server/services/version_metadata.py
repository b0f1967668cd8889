"""The `metadata` field of a version upload: semantic version, target platforms with their
compile settings, and input specs (static shapes, possibly several shape variants).

`parse_metadata(raw)` turns the JSON text into a `VersionMetadata` or raises
`InvalidInputError` whose `field` is the dotted path of the offending value (e.g.
`metadata.inputs[0].shape[2]`) and whose `fix` says what to send instead.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from manifests.cohorts import MAX_COHORTS
from server.errors import InvalidInputError, PayloadTooLargeError
from server.json_depth import depth_error, too_deep

PLATFORMS = ("onnx", "coreml", "qnn", "qnn-hub")
DTYPES = ("float32", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool")
DEFAULT_VARIANT = "default"
MAX_DIM = 1 << 20

# semver.org 2.0.0, the official regular expression.
SEMVER_RE = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.:/-]{0,127}$"
VARIANT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"

SettingValue = StrictStr | StrictInt | StrictBool
CompileSettings = dict[Annotated[str, Field(min_length=1, max_length=64)], SettingValue]
Dim = Annotated[StrictInt, Field(ge=1, le=MAX_DIM)]
Shape = Annotated[list[Dim], Field(max_length=8)]


class InputSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    dtype: Literal[
        "float32", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64", "bool"
    ]
    # Exactly one: `shape` (one static shape) or `shapes` (variant name -> static shape).
    shape: Shape | None = None
    shapes: dict[Annotated[str, Field(pattern=VARIANT_PATTERN)], Shape] | None = Field(
        default=None, min_length=1, max_length=16
    )
    # A scalar input the app always feeds the same value (a sample rate): the build binds it
    # as a constant, so the graph's choices on it fold, and the artifact does not take it.
    value: StrictInt | StrictFloat | None = None


class WatermarkIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cohorts: Annotated[int, Field(ge=2, le=MAX_COHORTS)]


class VersionMetadataIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: str
    platforms: dict[str, CompileSettings] | list[str]
    inputs: Annotated[list[InputSpec], Field(min_length=1, max_length=64)]
    notes: Annotated[str, Field(max_length=4000)] = ""
    # Stored and served sealed; its content key only for devices offered it (security.md).
    protected: bool = False
    # Per-cohort watermarked artifacts (security.md "Per-cohort watermarks"); off: null.
    watermark: WatermarkIn | None = None


class VersionMetadata(BaseModel):
    """Normalised metadata, as stored with the version (`ModelVersion.metadata_json`)."""

    version: str
    platforms: dict[str, dict[str, Any]]
    inputs: list[dict[str, Any]]  # each: name, dtype, shapes {variant: shape}[, value]
    variants: list[str]
    notes: str = ""
    protected: bool = False
    watermark: dict[str, int] | None = None  # {"cohorts": N}


class UndeclaredInputsError(InvalidInputError):
    """metadata has no `inputs`: the registry answers with the model's own inputs (read from
    an ONNX graph) and a template to declare them."""


def is_semver(version: str) -> bool:
    return bool(SEMVER_RE.fullmatch(version))


def semver_key(version: str) -> tuple[Any, ...]:
    """Sort key in semver precedence order (build metadata ignored; pre-releases first)."""
    m = SEMVER_RE.fullmatch(version)
    if m is None:
        return (0, 0, 0, 0, ())
    major, minor, patch, pre = int(m[1]), int(m[2]), int(m[3]), m[4]
    if pre is None:
        return (major, minor, patch, 1, ())
    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
    return (major, minor, patch, 0, parts)


def parse_metadata(raw: str | bytes, *, max_bytes: int = 64 * 1024) -> VersionMetadata:
    if len(raw) > max_bytes:
        raise PayloadTooLargeError(
            f"field 'metadata' is larger than {max_bytes} bytes", field="metadata",
            fix="send only version, platforms, inputs and short notes",
        )
    if too_deep(raw):
        raise InvalidInputError(
            f"field 'metadata': {depth_error()}", field="metadata",
            fix="send a flat object: version, platforms, inputs and notes nest at most 4 deep",
        )
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidInputError(
            f"field 'metadata' is not valid JSON: {e}", field="metadata",
            fix='send a JSON object, e.g. {"version": "1.0.0", "platforms": ["onnx"], '
            '"inputs": [{"name": "x", "dtype": "float32", "shape": [1, 3, 224, 224]}]}',
        ) from None
    if not isinstance(data, dict):
        raise InvalidInputError("field 'metadata' must be a JSON object", field="metadata",
                                fix="wrap the fields in {...}")
    try:
        parsed = VersionMetadataIn.model_validate(data)
    except ValidationError as e:
        raise _first_error(e) from None
    return _normalise(parsed)


def _loc(parts: tuple[Any, ...]) -> str:
    out = "metadata"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _first_error(e: ValidationError) -> InvalidInputError:
    err = e.errors()[0]
    # Drop pydantic's union-branch labels (e.g. 'list[str]') from the location.
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p in
                                                                       ("str", "int", "bool"))))
    field = _loc(loc)
    kind = err["type"]
    fix = None
    if loc == ("inputs",) and kind == "missing":
        return UndeclaredInputsError(
            f"{field}: Field required", field=field,
            fix='declare each model input, e.g. "inputs": [{"name": "x", "dtype": "float32", '
            '"shape": [1, 3, 224, 224]}] ("shape": [] for a scalar)')
    if loc[:1] == ("inputs",) and ("shape" in loc or "shapes" in loc):
        fix = ("shapes must be static: every dimension a positive integer (no -1, null or "
               "names); [] declares a scalar")
    elif loc[:1] == ("inputs",) and "dtype" in loc:
        fix = f"dtype must be one of: {', '.join(DTYPES)}"
    elif loc[:1] == ("platforms",):
        fix = ('platforms is a list of names (["onnx", "coreml"]) or an object of name -> '
               "compile settings whose values are strings, integers or booleans")
    elif kind == "missing":
        fix = f"add the required field {field}"
    elif kind == "extra_forbidden":
        fix = (f"remove {field}; allowed fields: version, platforms, inputs, notes, "
               "protected, watermark")
    return InvalidInputError(f"{field}: {err['msg']}", field=field, fix=fix)


def _normalise(m: VersionMetadataIn) -> VersionMetadata:
    if not is_semver(m.version):
        raise InvalidInputError(
            f"metadata.version {m.version!r} is not a semantic version",
            field="metadata.version", fix="use MAJOR.MINOR.PATCH, e.g. 1.4.0 or 2.0.0-rc.1",
        )
    platforms = {p: {} for p in m.platforms} if isinstance(m.platforms, list) else m.platforms
    if not platforms:
        raise InvalidInputError("metadata.platforms is empty", field="metadata.platforms",
                                fix=f"name at least one of: {', '.join(PLATFORMS)}")
    for name in platforms:
        if name not in PLATFORMS:
            raise InvalidInputError(
                f"metadata.platforms: unknown platform {name!r}",
                field=f"metadata.platforms.{name}",
                fix=f"use one of: {', '.join(PLATFORMS)}",
            )
    names = [i.name for i in m.inputs]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise InvalidInputError(f"metadata.inputs: input {dup!r} is listed twice",
                                field="metadata.inputs", fix="give every input a unique name")
    variant_sets: set[frozenset[str]] = set()
    variants: list[str] = []
    for i, spec in enumerate(m.inputs):
        if (spec.shape is None) == (spec.shapes is None):
            raise InvalidInputError(
                f"metadata.inputs[{i}] ({spec.name}) needs exactly one of 'shape' or 'shapes'",
                field=f"metadata.inputs[{i}].shape",
                fix='give a static shape, e.g. "shape": [1, 3, 224, 224], or variants, e.g. '
                '"shapes": {"360p": [1, 3, 360, 640], "720p": [1, 3, 720, 1280]}',
            )
        if spec.value is not None and any(
                shape for shape in ([spec.shape] if spec.shapes is None else
                                    list(spec.shapes.values()))):
            raise InvalidInputError(
                f"metadata.inputs[{i}] ({spec.name}) declares a value but is not a scalar",
                field=f"metadata.inputs[{i}].value",
                fix='a constant value is for a scalar input: "shape": [] (or drop "value")')
        if spec.value is not None and not math.isfinite(spec.value):
            raise InvalidInputError(
                f"metadata.inputs[{i}] ({spec.name}) value must be a finite number",
                field=f"metadata.inputs[{i}].value", fix="give a finite number")
        if spec.shapes is not None:
            variant_sets.add(frozenset(spec.shapes))
            variants = variants or list(spec.shapes)  # the order the uploader gave
    if len(variant_sets) > 1:
        raise InvalidInputError(
            "metadata.inputs: inputs with 'shapes' name different variants",
            field="metadata.inputs",
            fix="every input with 'shapes' must list the same variant names",
        )
    variants = variants or [DEFAULT_VARIANT]
    inputs = [
        {
            "name": s.name,
            "dtype": s.dtype,
            "shapes": dict(s.shapes) if s.shapes is not None
            else {v: list(s.shape or []) for v in variants},
            **({} if s.value is None else {"value": s.value}),
        }
        for s in m.inputs
    ]
    return VersionMetadata(version=m.version, platforms=platforms, inputs=inputs,
                           variants=variants, notes=m.notes, protected=m.protected,
                           watermark=None if m.watermark is None else m.watermark.model_dump())
