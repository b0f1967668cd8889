"""The onnxruntime-qnn plugin: registration and session options for the QNN HTP backend.

onnxruntime-qnn 2.x is an execution-provider *plugin*: it must be registered with
``register_execution_provider_library`` and attached with ``add_provider_for_devices`` — the
old ``providers=[...]`` form silently falls back to CPU. CPU fallback inside the session is
disabled so an operator the HTP cannot run is an error here, not a silent slowdown — except
for an artifact whose signed compile settings declare its CPU nodes (``cpu_nodes``).
"""

from __future__ import annotations

import threading
from typing import Any

from client_sdk.errors import BackendUnavailableError

_lock = threading.Lock()
# Registration is process-wide inside onnxruntime itself; this only mirrors that fact so it
# happens once (onnxruntime refuses a second registration under the same name).
_registered: set[str] = set()


def qnn_version() -> str:
    try:
        import onnxruntime_qnn
    except ImportError as e:
        raise BackendUnavailableError("onnxruntime-qnn is not installed") from e
    return str(onnxruntime_qnn.__version__)


def session_options(cpu_nodes: bool = False, config: dict[str, str] | None = None
                    ) -> Any:
    """``onnxruntime.SessionOptions`` targeting the QNN HTP backend, plus extra config
    entries (e.g. ``ep.context_enable``). ``cpu_nodes``: the artifact's build report says some
    of its nodes run on the CPU EP (a partial offload, or precision islands kept at FP32 —
    the manifest's ``cpu_nodes`` compile setting), so CPU fallback stays on for it alone."""
    try:
        import onnxruntime as ort
        import onnxruntime_qnn
    except ImportError as e:
        raise BackendUnavailableError("onnxruntime-qnn is not installed") from e
    ep = str(onnxruntime_qnn.get_ep_name())
    with _lock:
        if ep not in _registered:
            try:
                ort.register_execution_provider_library(ep, onnxruntime_qnn.get_library_path())
            except Exception as e:  # onnxruntime's errors are untyped
                # The registry is per process: the app (or a server component sharing the
                # process) may have registered the library first; that is not a failure.
                if "already registered" not in str(e).lower():
                    raise BackendUnavailableError(f"cannot register the QNN EP: {e}") from e
            _registered.add(ep)
    devices = [d for d in ort.get_ep_devices() if d.ep_name == ep]
    if not devices:
        raise BackendUnavailableError("the QNN EP found no device on this machine")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.add_provider_for_devices(devices, {"backend_path": onnxruntime_qnn.get_qnn_htp_path()})
    if not cpu_nodes:
        opts.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    for key, value in (config or {}).items():
        opts.add_session_config_entry(key, value)
    return opts
