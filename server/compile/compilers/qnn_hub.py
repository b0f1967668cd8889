"""`qnn-hub` platform: Qualcomm AI Hub cloud compile through an injected client.

The compiler talks to a `HubClient` — the subset of the `qai_hub` module it uses, with the
same function names and parameters (a contract test checks this against `qai_hub` itself with
`inspect.signature`). Production passes the real module; tests pass a fake. Nothing here
imports `qai_hub` unless a client config exists, because offline `qai_hub` retries for ~46 s
before failing.

Settings (`settings["qnn-hub"]`): `device` (AI Hub device name, e.g. "Samsung Galaxy S24
(Family)") or `chipset` (e.g. "qualcomm-snapdragon-8gen3"), `target_runtime`
"qnn_context_binary" (default) | "qnn_dlc", optional extra `options` string.
"""

from __future__ import annotations

import configparser
import os
from pathlib import Path
from typing import Any, Protocol

from server.compile.compilers.base import Feeds, Outputs, ensure_onnx, settings_for
from server.compile.errors import (
    CompileError,
    CompilerUnavailableError,
    ConversionError,
    InvalidSourceError,
    TransientCompileError,
)
from server.compile.types import CompiledArtifact, CompileRequest, Precision, SourceFormat, Target

RUNTIMES = {"qnn_context_binary": "bin", "qnn_dlc": "dlc"}
NOT_RUN = ("not run: AI Hub artifacts execute on hosted devices only (an inference job), "
           "which this build did not request")


class HubJob(Protocol):
    def wait(self, timeout: int | None = None) -> Any: ...
    def get_target_model(self) -> Any: ...


class HubClient(Protocol):
    """The part of `qai_hub` used here; signatures match the real module's functions."""

    def Device(self, name: str = "", os: str = "", attributes: Any = ...) -> Any: ...

    def submit_compile_job(self, model: Any, device: Any, name: str | None = None,
                           input_specs: Any = None, options: str = "",
                           single_compile: bool = True, calibration_data: Any = None,
                           retry: bool = True, project: Any = None) -> Any: ...


def config_path() -> Path:
    return Path(os.environ.get("QAIHUB_CLIENT_INI", Path.home() / ".qai_hub" / "client.ini"))


def has_config() -> bool:
    path = config_path()
    if not path.is_file():
        return False
    parser = configparser.ConfigParser()
    try:
        parser.read(path)
    except configparser.Error:
        return False
    return any(parser.has_option(s, "api_token") for s in parser.sections())


class QnnHubCompiler:
    platform = "qnn-hub"

    def __init__(self, client: HubClient, *, wait_timeout_s: int = 3600) -> None:
        self._client = client
        self._timeout = wait_timeout_s

    @classmethod
    def from_environment(cls) -> QnnHubCompiler:
        """The real `qai_hub` client, only when a config exists (never probes the network)."""
        if not has_config():
            raise CompilerUnavailableError(
                f"Qualcomm AI Hub is not configured ({config_path()} missing or has no "
                "api_token); run `qai-hub configure --api_token <token>` on the worker or drop "
                "qnn-hub from the version's platforms")
        import qai_hub

        return cls(qai_hub)  # type: ignore[arg-type]  # the module itself is the client

    def compile(self, request: CompileRequest, workdir: Path) -> list[CompiledArtifact]:
        opts = settings_for(request, "qnn-hub")
        runtime = str(opts.get("target_runtime", "qnn_context_binary"))
        if runtime not in RUNTIMES:
            raise InvalidSourceError(f"qnn-hub target_runtime must be one of {list(RUNTIMES)}")
        device_name, chipset = str(opts.get("device", "")), str(opts.get("chipset", ""))
        if not device_name and not chipset:
            raise InvalidSourceError("qnn-hub needs settings `device` (name) or `chipset`")
        if request.source_format is SourceFormat.EXPORTED_PROGRAM:
            model: Any = _load_program(request)
        else:
            model = str(ensure_onnx(request, workdir))
        device = self._client.Device(name=device_name,
                                     attributes=[f"chipset:{chipset}"] if chipset else [])
        options = f"--target_runtime {runtime} {opts.get('options', '')}".strip()
        input_specs = {s.name: (s.shape, s.dtype) for s in request.inputs}
        try:
            job = self._client.submit_compile_job(model=model, device=device,
                                                  name=f"modelfleet-{request.shape_variant}",
                                                  input_specs=input_specs, options=options)
            status = job.wait(timeout=self._timeout)
            if not getattr(status, "success", False):
                raise ConversionError(
                    f"AI Hub compile job failed: {getattr(status, 'message', status)}")
            target_model = job.get_target_model()
            if target_model is None:
                raise ConversionError("AI Hub compile job produced no target model")
            out = workdir / f"model.{RUNTIMES[runtime]}"
            target_model.download(filename=str(out))
        except CompileError:
            raise
        except Exception as e:
            raise _translate(e) from e
        label = device_name or chipset
        variant = f"{runtime}-{label.lower().replace(' ', '-').replace('(', '').replace(')', '')}"
        return [CompiledArtifact(
            path=out,
            target=Target(platform="qnn-hub", variant=variant, format=runtime, soc=chipset,
                          runtime="qnn", runtime_version=str(
                              getattr(self._client, "__version__", ""))),
            precision=Precision.FP16,
            compile_settings={"target_runtime": runtime, "device": device_name,
                              "chipset": chipset, "options": options},
            notes=[NOT_RUN], runnable_here=False, not_runnable_reason=NOT_RUN,
        )]

    def run(self, artifact: CompiledArtifact, feeds: Feeds) -> Outputs:
        raise RuntimeError(NOT_RUN)


def _load_program(request: CompileRequest) -> Any:
    from server.compile.source import load_exported_program

    return load_exported_program(request.source_path, request.source_format, request.inputs)


def _translate(e: Exception) -> CompileError:
    """qai_hub's errors → ours: rate limits / internal / network are worth a retry."""
    name = type(e).__name__
    if name in ("RateLimitedError", "InternalError", "ConnectionError", "Timeout",
                "TimeoutError") or isinstance(e, (ConnectionError, TimeoutError)):
        return TransientCompileError(f"AI Hub unavailable ({name}: {e}); will retry")
    if name == "UserError":
        return ConversionError(f"AI Hub rejected the job: {e}")
    return ConversionError(f"AI Hub compile failed: {name}: {e}")
