"""On-device compilation of bundle members, cached inside the bundle per runtime version.

- ``onnx``: onnxruntime's optimized model (``optimized_model_filepath``), keyed by the
  onnxruntime version because optimized graphs are only valid for the runtime that wrote them.
- ``mlpackage``/``coreml``: a deterministic tar of an ``.mlpackage`` compiled to
  ``.mlmodelc`` with coremltools — only on macOS (Core ML cannot compile or run elsewhere).
- ``qnn``: a plain (e.g. QDQ) ONNX model for the QNN EP, compiled here into an EPContext model
  with the HTP context binary embedded, keyed by the onnxruntime-qnn version;
  ``onnx-epcontext`` models already carry the context binary (built by the server).

Compiled outputs are written to a temp name and renamed, with a sha256 sidecar checked on use,
so a crash or bit rot means "compile again", never "load a torn file".
"""

from __future__ import annotations

import hashlib
import sys
import tarfile
import uuid
from collections.abc import Callable
from pathlib import Path

from client_sdk.errors import BackendUnavailableError, InstallError
from client_sdk.fsutil import atomic_write_bytes, remove_tree, sha256_file
from client_sdk.install import Bundle, Member

# Format names as the server's compilers write them (server/compile/compilers), plus the short
# aliases "qnn" (ONNX for the QNN EP) and "coreml".
FORMAT_ONNX = "onnx"
FORMAT_QNN_CONTEXT = "onnx-epcontext"
FORMAT_QNN_SOURCE = "qnn"
QNN_FORMATS = (FORMAT_QNN_CONTEXT, FORMAT_QNN_SOURCE)
COREML_FORMATS = ("mlpackage", "coreml")
KNOWN_FORMATS = (FORMAT_ONNX, *QNN_FORMATS, *COREML_FORMATS)


def onnxruntime_key() -> str:
    import onnxruntime as ort

    return f"onnxruntime-{ort.__version__}"


def _cached(path: Path) -> Path | None:
    side = path.with_name(path.name + ".sha256")
    if path.is_file() and side.is_file() and side.read_text().strip() == sha256_file(path):
        return path
    return None


def _not_compiled(bundle: Bundle, member: Member) -> BackendUnavailableError:
    return BackendUnavailableError(
        f"{member.file} of {bundle.model} {bundle.version} is not compiled on this device")


def _compile_once(bundle: Bundle, member: Member, out: Path, compile_missing: bool,
                  build: Callable[[Path], None]) -> Path:
    """`out` when a copy matching its sha256 side file is there, else `build(tmp)` writes a
    temporary file that is moved into place before its side file: a crash mid-compile never
    leaves a half model under the cached name."""
    hit = _cached(out)
    if hit is not None:
        return hit
    if not compile_missing:
        raise _not_compiled(bundle, member)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{uuid.uuid4().hex}.onnx")
    try:
        build(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(out)
    atomic_write_bytes(out.with_name(out.name + ".sha256"), sha256_file(out).encode())
    return out


def compiled_onnx(bundle: Bundle, member: Member, *, compile_missing: bool = True) -> Path:
    """The optimized ONNX model for this onnxruntime version, compiling it if missing (else
    ``BackendUnavailableError``: a reader that must not write into the bundle)."""

    def build(tmp: Path) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        # EXTENDED, not ALL: layout-specific rewrites are not worth tying the cache to a CPU
        # model. Warnings about unused initializers are not the app's concern.
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        opts.log_severity_level = 3
        opts.optimized_model_filepath = str(tmp)
        try:
            ort.InferenceSession(
                str(bundle.member_path(member)), opts, providers=["CPUExecutionProvider"]
            )
        except Exception as e:  # onnxruntime raises its own untyped errors
            raise InstallError(
                f"onnxruntime cannot load {member.file} of {bundle.model} {bundle.version}: {e}"
            ) from e

    out = bundle.path / "compiled" / onnxruntime_key() / f"{member.file}.opt.onnx"
    return _compile_once(bundle, member, out, compile_missing, build)


def compiled_qnn(bundle: Bundle, member: Member, *, compile_missing: bool = True) -> Path:
    """The EPContext model for this onnxruntime-qnn version, compiling it if missing (else
    ``BackendUnavailableError``)."""
    if member.format == FORMAT_QNN_CONTEXT:
        return bundle.member_path(member)
    from client_sdk import qnn

    def build(tmp: Path) -> None:
        import onnxruntime as ort

        opts = qnn.session_options(config={
            "ep.context_enable": "1", "ep.context_embed_mode": "1",
            "ep.context_file_path": str(tmp)})
        try:
            ort.InferenceSession(str(bundle.member_path(member)), opts)
        except Exception as e:
            raise BackendUnavailableError(
                f"the QNN EP cannot compile {member.file} of {bundle.model} {bundle.version}: "
                f"{e}") from e
        if not tmp.is_file():
            raise BackendUnavailableError("the QNN EP wrote no context model")

    out = bundle.path / "compiled" / f"onnxruntime-qnn-{qnn.qnn_version()}" / (
        f"{member.file}.ctx.onnx")
    return _compile_once(bundle, member, out, compile_missing, build)


def compiled_coreml(bundle: Bundle, member: Member) -> Path:
    """The ``.mlmodelc`` for this bundle's Core ML member (macOS only)."""
    if sys.platform != "darwin":
        raise BackendUnavailableError("Core ML models compile and run only on macOS")
    import coremltools as ct

    key = f"coremltools-{ct.__version__}"
    out = bundle.path / "compiled" / key / f"{member.file}.mlmodelc"
    marker = out.with_name(out.name + ".done")
    if out.is_dir() and marker.is_file():
        return out
    work = bundle.path / "compiled" / key / f".{uuid.uuid4().hex}"
    work.mkdir(parents=True)
    with tarfile.open(bundle.member_path(member)) as tar:
        tar.extractall(work, filter="data")  # the "data" filter refuses traversal and links
    packages = list(work.glob("*.mlpackage"))
    if len(packages) != 1:
        raise InstallError(f"{member.file} must hold exactly one .mlpackage")
    compiled = Path(ct.utils.compile_model(str(packages[0]), str(work / "out.mlmodelc")))
    remove_tree(out)
    compiled.replace(out)
    remove_tree(work)
    atomic_write_bytes(marker, hashlib.sha256(member.sha256.encode()).hexdigest().encode())
    return out


def compile_bundle(bundle: Bundle) -> None:
    """Compile every member this machine can compile (called while staging)."""
    for member in bundle.members:
        if member.at_rest:
            continue  # a protected model is decrypted into memory at load, never compiled to disk
        if member.format == FORMAT_ONNX:
            compiled_onnx(bundle, member)
        elif member.format == FORMAT_QNN_SOURCE:
            try:
                compiled_qnn(bundle, member)
            except BackendUnavailableError:
                pass  # no HTP here: the runtime reports it and runs the CPU fallback member
        elif member.format in COREML_FORMATS and sys.platform == "darwin":
            compiled_coreml(bundle, member)
