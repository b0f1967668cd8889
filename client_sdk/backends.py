"""Inference backends behind one interface: onnxruntime CPU, the QNN EP, Core ML (macOS).

``open_backend(bundle, member)`` returns a ready ``Backend`` or raises
``BackendUnavailableError`` when this machine cannot run that member (the runtime then falls
back to the bundle's CPU ONNX member). Backends are safe to call from many threads.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from client_sdk.compile import (
    COREML_FORMATS,
    FORMAT_ONNX,
    FORMAT_QNN_CONTEXT,
    QNN_FORMATS,
    compiled_coreml,
    compiled_onnx,
    compiled_qnn,
)
from client_sdk.errors import BackendError, BackendUnavailableError
from client_sdk.install import Bundle, Member

Arrays = dict[str, np.ndarray[Any, Any]]


class Backend(Protocol):
    name: str

    def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> Arrays: ...


class OrtBackend:
    """An onnxruntime session (CPU, or QNN when built with QNN session options)."""

    def __init__(self, name: str, session: Any) -> None:
        self.name = name
        self._session = session
        self._outputs = [o.name for o in session.get_outputs()]
        # name -> (numpy dtype or None, static shape or None), for `feeds`.
        self._inputs = {i.name: (_ORT_DTYPES.get(i.type), _static(i.shape))
                        for i in session.get_inputs()}

    def feeds(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray[Any, Any]]:
        """The arrays onnxruntime takes: a Python or numpy scalar becomes a 0-d array of the
        input's dtype, and a one-element array is reshaped to a one-element input's shape
        (a scalar saved as [16000], or a [1] input given a scalar). Anything else is passed
        as it is, so onnxruntime names a wrong shape or type."""
        out: dict[str, np.ndarray[Any, Any]] = {}
        for name, value in inputs.items():
            dtype, shape = self._inputs.get(name, (None, None))
            a = value if isinstance(value, np.ndarray) else np.asarray(value, dtype=dtype)
            if shape is not None and a.shape != shape and a.size == 1 == int(np.prod(shape)):
                a = a.reshape(shape)
            out[name] = a
        return out

    def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> Arrays:
        try:
            values = self._session.run(self._outputs, self.feeds(inputs))
        except Exception as e:  # onnxruntime's errors are untyped
            raise BackendError(f"{self.name} inference failed: {e}") from e
        return dict(zip(self._outputs, values, strict=True))


_ORT_DTYPES: dict[str, Any] = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int16)": np.int16,
    "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


def _static(shape: Any) -> tuple[int, ...] | None:
    dims = list(shape or [])
    return tuple(dims) if all(isinstance(d, int) and d > 0 for d in dims) else None


def _one_quiet_thread(opts: Any) -> None:
    """Run each inference on the calling thread alone, and never spin-wait: a shadow candidate
    runs on a low-priority worker thread, and a pool of spinning onnxruntime threads would
    burn the app's cores at normal priority (for the active model it changes nothing: it
    already ran on the app's thread)."""
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")


def _sealed(bundle: Bundle, member: Member) -> Backend:
    """A protected model: decrypted into memory and loaded from bytes (onnxruntime CPU and
    the QNN EP with an embedded context); a runtime that needs a file is not offered it."""
    import onnxruntime as ort

    from client_sdk.install import data_dir_of
    from client_sdk.protection import keystore_for, read_plain

    if member.format not in (FORMAT_ONNX, FORMAT_QNN_CONTEXT):
        raise BackendUnavailableError(
            f"protected {member.format} models are not loaded from memory by this SDK "
            "(the runtime needs a file; docs/security.md)")
    data = read_plain(bundle.member_path(member), member, keystore_for(data_dir_of(bundle)))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    _one_quiet_thread(opts)
    opts.log_severity_level = 3
    try:
        if member.format == FORMAT_ONNX:
            session = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
            return OrtBackend("onnxruntime-cpu", session)
        from client_sdk import qnn

        qopts = qnn.session_options(cpu_nodes=_declares_cpu_nodes(member))
        _one_quiet_thread(qopts)
        return OrtBackend("onnxruntime-qnn", ort.InferenceSession(data, qopts))
    except Exception as e:
        raise BackendUnavailableError(f"onnxruntime cannot load protected {member.file}: {e}"
                                      ) from e
    finally:
        del data


def _cpu(bundle: Bundle, member: Member, compile_missing: bool) -> Backend:
    import onnxruntime as ort

    path = compiled_onnx(bundle, member, compile_missing=compile_missing)
    opts = ort.SessionOptions()
    # The optimized model is already optimized; don't pay for it again on every load.
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    _one_quiet_thread(opts)
    opts.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise BackendUnavailableError(f"onnxruntime cannot load {path}: {e}") from e
    return OrtBackend("onnxruntime-cpu", session)


def _declares_cpu_nodes(member: Member) -> bool:
    """Whether the artifact's build put nodes on the CPU EP on purpose (precision islands,
    an accepted partial offload): its signed compile settings count them."""
    try:
        return int(member.compile_settings.get("cpu_nodes", 0)) > 0
    except (TypeError, ValueError):
        return False


def _qnn(bundle: Bundle, member: Member, compile_missing: bool) -> Backend:
    import onnxruntime as ort

    from client_sdk import qnn

    path = compiled_qnn(bundle, member, compile_missing=compile_missing)
    try:
        opts = qnn.session_options(cpu_nodes=_declares_cpu_nodes(member))
        _one_quiet_thread(opts)  # the HTP does the work (CPU fallback only when declared)
        session = ort.InferenceSession(str(path), opts)
    except Exception as e:
        raise BackendUnavailableError(f"QNN EP cannot load {path.name}: {e}") from e
    return OrtBackend("onnxruntime-qnn", session)


class CoreMLBackend:
    name = "coreml"

    def __init__(self, model: Any) -> None:
        self._model = model

    def run(self, inputs: Mapping[str, np.ndarray[Any, Any]]) -> Arrays:
        try:
            out = self._model.predict(dict(inputs))
        except Exception as e:
            raise BackendError(f"Core ML inference failed: {e}") from e
        return {k: np.asarray(v) for k, v in out.items()}


def _coreml(bundle: Bundle, member: Member) -> Backend:
    if sys.platform != "darwin":
        raise BackendUnavailableError("Core ML runs only on macOS")
    import coremltools as ct

    return CoreMLBackend(ct.models.CompiledMLModel(str(compiled_coreml(bundle, member))))


def open_backend(bundle: Bundle, member: Member, *, compile_missing: bool = True) -> Backend:
    """Load ``member`` of ``bundle`` on the backend its format needs; ``compile_missing=False``
    (the shadow process: the app's process compiled it) raises ``BackendUnavailableError``
    instead of compiling, so that loading never writes into a bundle."""
    if member.at_rest:
        return _sealed(bundle, member)
    if member.format == FORMAT_ONNX:
        return _cpu(bundle, member, compile_missing)
    if member.format in QNN_FORMATS:
        return _qnn(bundle, member, compile_missing)
    if member.format in COREML_FORMATS:
        return _coreml(bundle, member)
    raise BackendUnavailableError(f"no backend for format {member.format!r}")
