"""Validating what a sandboxed compile hands back, before anything is stored (issue 9).

The child is untrusted: its `result.json` may be huge, malformed or lying, its artifacts may
be symlinks, hard links, special files or not what they claim. `read_result` accepts only:

- a regular `result.json` of at most `MAX_RESULT_BYTES`, holding either an `error` (kind +
  message) or `outcomes` for exactly the requested platforms;
- per outcome, known fields of the right types with capped text (error, notes, gates, the
  per-layer diff), names
  that are safe in blob keys, a target naming the outcome's own platform;
- per artifact, a regular, singly linked file strictly inside the output directory whose
  sha256 and length the parent recomputes, and whose bytes look like the format it claims
  (ONNX protobuf framing, a tar of regular files for an `.mlpackage`).

An outcome whose artifact fails a check becomes a failed outcome with the reason; a result
document that fails a check is a `CompileError`.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server.compile.errors import CompileError
from server.compile.gates import layerdiff
from server.compile.packing import PackedArtifact
from server.compile.pipeline import BuildOutcome, BuildSpec
from server.compile.protoframe import is_onnx
from server.hashing import file_sha256

RESULT_FILE = "result.json"
MAX_RESULT_BYTES = 1024 * 1024
MAX_ERROR_CHARS = 4000
MAX_NOTES, MAX_NOTE_CHARS = 50, 1000
MAX_GATES_BYTES = 256 * 1024
MAX_LAYER_DIFF_BYTES = 256 * 1024  # ~1000 compact rows (gates/layerdiff.py's cap)
MAX_OUTCOMES = 256
MAX_FIELD_CHARS = 256
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
TARGET_KEYS = ("platform", "variant", "format", "soc", "arch", "runtime", "runtime_version",
               "shape_variant")
ONNX_FORMATS = ("onnx", "onnx-epcontext")
FILE_FORMATS = ("qnn_context_binary", "qnn_dlc", "bin", "dlc")
TAR_FORMATS = ("mlpackage",)


class ResultError(CompileError):
    """The sandboxed compile returned something the parent refuses to store."""


@dataclass
class ChildResult:
    outcomes: list[BuildOutcome] = field(default_factory=list)
    error: str = ""
    transient: bool = False


def _cap(text: object, limit: int = MAX_ERROR_CHARS) -> str:
    if not isinstance(text, str):
        raise ResultError("the sandboxed compile returned a non-text message")
    return text if len(text) <= limit else text[:limit] + "… [truncated]"


def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or not SAFE_NAME.fullmatch(value):
        raise ResultError(f"the sandboxed compile returned an unsafe {what} {str(value)[:80]!r}")
    return value


def _short(value: object, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_FIELD_CHARS:
        raise ResultError(f"the sandboxed compile returned an invalid {what}")
    return value


def read_result(out: Path, spec: BuildSpec) -> ChildResult:
    """The validated result of the child that wrote into `out`; ResultError if unusable."""
    path = out / RESULT_FILE
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise ResultError("the sandboxed compile ended without writing a result") from None
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RESULT_BYTES:
        raise ResultError(f"the sandboxed compile's {RESULT_FILE} is not a regular file of at "
                          f"most {MAX_RESULT_BYTES} bytes")
    try:
        doc = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as e:
        raise ResultError(f"the sandboxed compile's {RESULT_FILE} is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ResultError(f"the sandboxed compile's {RESULT_FILE} is not an object")
    if "error" in doc:
        err = doc["error"]
        if not isinstance(err, dict) or err.get("kind") not in ("transient", "compile",
                                                                 "internal"):
            raise ResultError("the sandboxed compile returned a malformed error")
        return ChildResult(error=_cap(err.get("message", "")),
                           transient=err["kind"] == "transient")
    raw = doc.get("outcomes")
    if not isinstance(raw, list) or len(raw) > MAX_OUTCOMES:
        raise ResultError("the sandboxed compile returned no outcome list")
    outcomes = [_outcome(item, out, spec) for item in raw]
    return ChildResult(outcomes=outcomes)


def _outcome(item: object, out: Path, spec: BuildSpec) -> BuildOutcome:
    if not isinstance(item, dict):
        raise ResultError("the sandboxed compile returned a malformed outcome")
    platform = item.get("platform")
    if platform not in spec.platforms:
        raise ResultError(f"the sandboxed compile returned an outcome for platform "
                          f"{str(platform)[:40]!r}, which was not requested")
    assert isinstance(platform, str)
    state = item.get("state")
    if state not in ("ready", "failed"):
        raise ResultError("the sandboxed compile returned an outcome with an unknown state")
    o = BuildOutcome(platform=platform, variant=_name(item.get("variant"), "variant"),
                     state=state, format=_short(item.get("format", ""), "format"),
                     precision=_short(item.get("precision", ""), "precision"),
                     error=_cap(item.get("error", "")))
    o.target = _target(item.get("target", {}), platform)
    o.compile_settings = _settings(item.get("compile_settings", {}))
    notes = item.get("notes", [])
    if not isinstance(notes, list):
        raise ResultError("the sandboxed compile returned malformed notes")
    o.notes = [_cap(n, MAX_NOTE_CHARS) for n in notes[:MAX_NOTES]]
    gates = item.get("gates", {})
    if not isinstance(gates, dict) or len(json.dumps(gates)) > MAX_GATES_BYTES:
        raise ResultError(f"the sandboxed compile's gate report is not an object of at most "
                          f"{MAX_GATES_BYTES} bytes")
    o.gates = gates
    o.layer_diff = _layer_diff(item.get("layer_diff", {}))
    seconds = item.get("compile_seconds", 0.0)
    o.compile_seconds = float(seconds) if isinstance(seconds, (int, float)) else 0.0
    if o.state == "ready":
        try:
            o.artifact = _artifact(item.get("artifact"), out, o.format)
            o.cohorts = _cohorts(item.get("cohorts", []), out, o.format, spec)
        except ResultError as e:
            o.state, o.artifact, o.cohorts, o.error = "failed", None, [], str(e)
    return o


def _layer_diff(raw: object) -> dict[str, Any]:
    """The per-layer report: an object of capped size whose rows are
    [tensor, node, op, cosine, snr_db] with short strings and numbers (or "inf")."""
    if not isinstance(raw, dict) or len(json.dumps(raw)) > MAX_LAYER_DIFF_BYTES:
        raise ResultError(f"the sandboxed compile's layer diff is not an object of at most "
                          f"{MAX_LAYER_DIFF_BYTES} bytes")
    rows = raw.get("layers", [])
    if not isinstance(rows, list) or len(rows) > layerdiff.MAX_LAYERS or not all(
            isinstance(r, list) and len(r) == len(layerdiff.ROW_FIELDS)
            and all(isinstance(x, str) and len(x) <= MAX_FIELD_CHARS for x in r[:3])
            and all(isinstance(x, (int, float)) or x in ("inf", "-inf") for x in r[3:])
            for r in rows):
        raise ResultError("the sandboxed compile's layer diff rows are malformed")
    return raw


def _cohorts(raw: object, out: Path, fmt: str, spec: BuildSpec) -> list[PackedArtifact]:
    """A watermarked version's per-cohort copies: none, or exactly one per cohort."""
    want = spec.watermark.cohorts if spec.watermark is not None else 0
    if not isinstance(raw, list) or len(raw) not in (0, want):
        got = len(raw) if isinstance(raw, list) else "no"
        raise ResultError(f"the sandboxed compile returned {got} cohort artifacts, not 0 or "
                          f"{want}")
    return [_artifact(item, out, fmt) for item in raw]


def _target(raw: object, platform: str) -> dict[str, str]:
    if not isinstance(raw, dict) or set(raw) - set(TARGET_KEYS):
        raise ResultError("the sandboxed compile returned a malformed target")
    target = {k: _short(v, f"target {k}") for k, v in raw.items()}
    if target and target.get("platform") != platform:
        raise ResultError("the sandboxed compile returned a target for another platform")
    return target


def _settings(raw: object) -> dict[str, Any]:
    if not isinstance(raw, dict) or len(raw) > 64:
        raise ResultError("the sandboxed compile returned malformed compile settings")
    for k, v in raw.items():
        _short(k, "compile setting name")
        if not isinstance(v, (str, int, float, bool)) or (isinstance(v, str)
                                                          and len(v) > MAX_FIELD_CHARS):
            raise ResultError(f"the sandboxed compile returned compile setting {k[:40]!r} "
                              "of an invalid type")
    return dict(raw)


def _artifact(raw: object, out: Path, fmt: str) -> PackedArtifact:
    if not isinstance(raw, dict) or not isinstance(raw.get("path"), str):
        raise ResultError("a ready outcome came back without an artifact")
    rel = raw["path"]
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or ".." in parts:
        raise ResultError(f"artifact path {rel[:80]!r} is not inside the output directory")
    _name(parts[-1], "artifact file name")
    path = out / rel
    real_out = os.path.realpath(out)
    if not os.path.realpath(path).startswith(real_out + os.sep):
        raise ResultError(f"artifact {rel[:80]!r} resolves outside the output directory")
    st = os.lstat(path) if os.path.lexists(path) else None
    if st is None or not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        raise ResultError(f"artifact {rel[:80]!r} is not a regular, singly linked file")
    sha, length = file_sha256(path)
    if sha != raw.get("sha256") or length != raw.get("length"):
        raise ResultError(f"artifact {rel[:80]!r} does not match the sha256/length the "
                          "sandboxed compile reported")
    packing = raw.get("packing")
    _sniff(path, fmt, packing)
    assert isinstance(packing, str)
    return PackedArtifact(path=path, sha256=sha, length=length, packing=packing)


def _sniff(path: Path, fmt: str, packing: object) -> None:
    if fmt in TAR_FORMATS:
        if packing != "tar":
            raise ResultError(f"a {fmt} artifact must be packed as tar")
        _check_tar(path, fmt)
    elif fmt in ONNX_FORMATS or fmt in FILE_FORMATS:
        if packing != "file":
            raise ResultError(f"a {fmt} artifact must be a single file")
        if fmt in ONNX_FORMATS:
            with path.open("rb") as f:
                if not is_onnx(f):
                    raise ResultError(f"the {fmt} artifact is not an ONNX model")
    else:
        raise ResultError(f"the sandboxed compile returned unknown artifact format "
                          f"{fmt[:40]!r}")


def _check_tar(path: Path, fmt: str) -> None:
    try:
        with tarfile.open(path, mode="r:") as tar:
            members = tar.getmembers()
    except (tarfile.TarError, OSError) as e:
        raise ResultError(f"the {fmt} artifact is not a tar archive: {e}") from None
    if not members or not members[0].name.endswith(f".{fmt}"):
        raise ResultError(f"the {fmt} artifact's archive does not hold a .{fmt}")
    top = members[0].name
    for m in members:
        if not (m.isfile() or m.isdir()) or ".." in Path(m.name).parts or \
                not (m.name == top or m.name.startswith(top + "/")):
            raise ResultError(f"the {fmt} archive holds an unsafe entry {m.name[:80]!r}")
