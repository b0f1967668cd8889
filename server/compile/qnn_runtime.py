"""onnxruntime sessions on the QNN execution provider (HTP backend; emulated on x86).

onnxruntime-qnn 2.x is a plugin EP: it must be registered with
`onnxruntime.register_execution_provider_library` and attached to a session with
`SessionOptions.add_provider_for_devices`. The older `providers=["QNNExecutionProvider"]`
form silently runs everything on the CPU, so it is never used here, and every session sets
`session.disable_cpu_ep_fallback=1` so an operator the HTP cannot take fails loudly instead.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from server.compile.errors import CompilerUnavailableError

EP_NAME = "QNNExecutionProvider"
_LOCK = threading.Lock()
_REGISTERED = False


def qnn_version() -> str:
    try:
        import onnxruntime_qnn
    except ImportError:
        return ""
    return str(onnxruntime_qnn.__version__)


def _devices() -> tuple[Any, list[Any], Any]:
    """(onnxruntime, its QNN EP devices, onnxruntime_qnn), registering the EP once."""
    global _REGISTERED
    try:
        import onnxruntime as ort
        import onnxruntime_qnn
    except ImportError as e:
        raise CompilerUnavailableError(
            f"onnxruntime-qnn is not installed ({e}); `pip install onnxruntime-qnn` (x86_64 "
            "Linux/Windows compiles offline with HTP emulation)") from e
    with _LOCK:
        if not _REGISTERED:
            try:
                ort.register_execution_provider_library(EP_NAME,
                                                        onnxruntime_qnn.get_library_path())
            except Exception as e:
                if "already" not in str(e).lower():
                    raise CompilerUnavailableError(f"cannot register the QNN EP: {e}") from e
            _REGISTERED = True
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]
    if not devices:
        raise CompilerUnavailableError("the QNN EP registered but exposes no device")
    return ort, devices, onnxruntime_qnn


def session(model: Path, *, provider_options: dict[str, str] | None = None,
            context_out: Path | None = None) -> Any:
    """A session whose whole graph runs on the QNN HTP backend (CPU fallback disabled).

    With `context_out`, the session also writes an EPContext model there with the compiled
    QNN context binary embedded (`ep.context_enable=1`, embed mode 1).
    """
    return open_session(model, provider_options=provider_options, context_out=context_out)


def open_session(model: Path, *, provider_options: dict[str, str] | None = None,
                 context_out: Path | None = None, allow_cpu_fallback: bool = False,
                 record_assignment: bool = False, log_level: int = 3) -> Any:
    """`session` with the knobs the HTP probe needs: CPU fallback allowed (nodes the HTP
    rejects go to the CPU EP instead of failing) and the node assignment recorded."""
    ort, devices, qnn = _devices()
    opts = ort.SessionOptions()
    opts.log_severity_level = log_level
    if not allow_cpu_fallback:
        opts.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    if record_assignment:
        opts.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    if context_out is not None:
        context_out.unlink(missing_ok=True)  # ORT refuses to overwrite an existing one
        opts.add_session_config_entry("ep.context_enable", "1")
        opts.add_session_config_entry("ep.context_embed_mode", "1")
        opts.add_session_config_entry("ep.context_file_path", str(context_out))
    ep_options = {"backend_path": qnn.get_qnn_htp_path(), **(provider_options or {})}
    opts.add_provider_for_devices(devices, ep_options)
    return ort.InferenceSession(str(model), sess_options=opts)
