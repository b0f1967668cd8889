"""A fake of the part of `qai_hub` the qnn-hub compiler uses (the only allowed fake: the
AI Hub cloud). tests/compile/test_qnn_hub.py checks its signatures against the real module."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class FakeStatus:
    success: bool
    message: str = ""


class FakeModel:
    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def download(self, filename: str, timeout: int | None = None) -> Any:
        Path(filename).write_bytes(self.payload)
        return filename


class FakeJob:
    def __init__(self, hub: FakeHub, ok: bool) -> None:
        self.hub, self.ok = hub, ok

    def wait(self, timeout: int | None = None) -> Any:
        return FakeStatus(self.ok, "" if self.ok else "op GridSample not supported")

    def get_target_model(self) -> Any:
        return FakeModel(b"QNN-CONTEXT-BINARY:" + self.hub.submitted[-1]["model_bytes"][:16])


@dataclass
class FakeHub:
    """Records what would have been sent to AI Hub; can fail or raise on demand."""

    fail: bool = False
    raise_error: Exception | None = None
    submitted: list[dict[str, Any]] = field(default_factory=list)
    __version__: str = "fake"

    def Device(self, name: str = "", os: str = "", attributes: Any = ()) -> Any:
        return {"name": name, "os": os, "attributes": list(attributes)}

    def submit_compile_job(self, model: Any, device: Any, name: str | None = None,
                           input_specs: Any = None, options: str = "",
                           single_compile: bool = True, calibration_data: Any = None,
                           retry: bool = True, project: Any = None) -> Any:
        if self.raise_error is not None:
            raise self.raise_error
        data = Path(model).read_bytes() if isinstance(model, str) else b"<ExportedProgram>"
        self.submitted.append({"model_bytes": data, "device": device, "name": name,
                               "input_specs": input_specs, "options": options})
        return FakeJob(self, not self.fail)
