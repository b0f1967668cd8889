"""`modelfleet publish MODEL FILE --version V --platform P… --input NAME:DTYPE:SHAPE… [--wait]`:
upload a version (progress bar), then with --wait follow its builds per platform live and end
with the gate reports.

--input   image:float32:1x3x224x224        one static shape (`1,3,224,224` works too)
          sr:int64:scalar                   a scalar (rank 0; `[]` works too)
          image:float32:360p=1x3x360x640,720p=1x3x720x1280   shape variants
--platform onnx | coreml:compute_precision=fp16 | qnn:soc_model=60,htp_arch=v73
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
from rich.table import Table

from modelfleet.api_client import ApiClient
from modelfleet.clikit import switch
from modelfleet.commands.options import Json, Server, Token
from modelfleet.commands.versions import fail_if_failed, report
from modelfleet.output import EXIT_TIMEOUT, EXIT_USAGE, CommandError, Out, api
from server.commands.buildreport import print_builds

FINAL = ("ready", "failed")


def parse_input(spec: str) -> dict[str, Any]:
    """NAME:DTYPE:SHAPE (or NAME:DTYPE:VARIANT=SHAPE,…) → a metadata `inputs` entry."""
    name, dtype, shape = [*spec.split(":", 2), "", ""][:3]
    if not (name and dtype and shape):
        raise CommandError(f"--input {spec!r} must look like NAME:DTYPE:SHAPE",
                           fix="e.g. --input image:float32:1x3x224x224")
    if "=" in shape:
        shapes = {}
        for part in shape.split(","):
            variant, sep, dims = part.partition("=")
            if not (sep and variant):
                raise CommandError(f"--input {spec!r}: shape variant {part!r} must look like "
                                   "VARIANT=1x3x360x640",
                                   fix="e.g. image:float32:360p=1x3x360x640,720p=1x3x720x1280")
            shapes[variant] = _dims(spec, dims, "x")
        return {"name": name, "dtype": dtype, "shapes": shapes}
    return {"name": name, "dtype": dtype,
            "shape": _dims(spec, shape, "x" if "x" in shape else ",")}


def _dims(spec: str, text: str, sep: str) -> list[int]:
    if text in ("scalar", "[]"):
        return []
    try:
        return [int(d) for d in text.split(sep)]
    except ValueError:
        raise CommandError(f"--input {spec!r}: {text!r} is not a static shape of integers",
                           fix="write dimensions as 1x3x224x224") from None


def parse_platforms(specs: list[str]) -> list[str] | dict[str, dict[str, str]]:
    """`onnx` or `qnn:soc_model=60,htp_arch=v73` → metadata `platforms`."""
    settings: dict[str, dict[str, str]] = {}
    for spec in specs:
        name, _, rest = spec.partition(":")
        values: dict[str, str] = {}
        for item in filter(None, rest.split(",")):
            key, sep, value = item.partition("=")
            if not (sep and key):
                raise CommandError(f"--platform {spec!r}: {item!r} must look like KEY=VALUE",
                                   fix="e.g. --platform qnn:soc_model=60,htp_arch=v73")
            values[key] = value
        settings[name] = values
    if not any(settings.values()):
        return list(settings)
    return settings


def _file(path: Path, option: str) -> Path:
    if not path.is_file():
        raise CommandError(f"{option} {path}: no such file", exit_code=EXIT_USAGE)
    return path


def _upload(client: ApiClient, out: Out, model: str, files: dict[str, Path],
            metadata: dict[str, Any]) -> dict[str, Any]:
    if not out.live:
        doc: dict[str, Any] = client.upload_version(model, files, metadata)
        return doc
    total = sum(p.stat().st_size for p in files.values())
    columns = ("{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, console=out.stderr, transient=True) as progress:
        task = progress.add_task(f"uploading {files['model'].name}", total=total)
        doc = client.upload_version(model, files, metadata,
                                    on_progress=lambda n: progress.advance(task, n))
    return doc


def _status_table(doc: dict[str, Any]) -> Table:
    table = Table("platform", "shape variant", "state", "attempts", box=None,
                  title=f"{doc['model']} {doc['version']}: {doc['state']}")
    for b in doc["builds"]:
        table.add_row(b["platform"], b["variant"], b["state"], str(b["attempts"]))
    return table


def wait_for_builds(client: ApiClient, out: Out, doc: dict[str, Any], timeout: float,
                    interval: float = 1.0) -> dict[str, Any]:
    """Poll the version until ready or failed, drawing per-platform states on a terminal."""
    path = f"/v1/models/{doc['model']}/versions/{doc['version']}"
    deadline = time.monotonic() + timeout
    live = Live(_status_table(doc), console=out.stderr, transient=True, auto_refresh=False) \
        if out.live else None
    try:
        if live is not None:
            live.start()
        while doc["state"] not in FINAL:
            if time.monotonic() > deadline:
                raise CommandError(
                    f"{doc['model']} {doc['version']} still {doc['state']} after {timeout:g}s",
                    fix=f"wait longer (--timeout) or check later with `modelfleet versions show "
                    f"{doc['model']} {doc['version']}`", exit_code=EXIT_TIMEOUT,
                    payload={"error": {"detail": "wait timed out", "code": "timeout"},
                             "version": doc})
            time.sleep(interval)
            doc = client.get(path)
            if live is not None:
                live.update(_status_table(doc), refresh=True)
    finally:
        if live is not None:
            live.stop()
    return report(client, doc["model"], doc["version"])


def _summary(console: Console, doc: dict[str, Any]) -> None:
    console.print(f"{doc['model']} {doc['version']}: {doc['state']}, "
                  f"{len(doc['builds'])} build(s) "
                  f"({', '.join(sorted({b['platform'] for b in doc['builds']}))})",
                  highlight=False)


def register(app: typer.Typer) -> None:
    @app.command()
    def publish(
        model: Annotated[str, typer.Argument(metavar="MODEL", help="model name")],
        file: Annotated[Path, typer.Argument(metavar="FILE",
                                             help="ONNX, .pt2 or TorchScript file")],
        version: Annotated[str, typer.Option("--version", metavar="V",
                                             help="semantic version, e.g. 1.0.0")],
        platform: Annotated[list[str], typer.Option(
            "--platform", metavar="P", help="onnx, coreml, qnn, qnn-hub; settings as "
            "qnn:soc_model=60 (repeat)")],
        inputs: Annotated[list[str], typer.Option(
            "--input", metavar="NAME:DTYPE:SHAPE",
            help="e.g. image:float32:1x3x224x224 (repeat)")],
        reference: Annotated[Path | None, typer.Option(
            metavar="X.npz", help="reference inputs for the numeric gate")] = None,
        calibration: Annotated[Path | None, typer.Option(
            metavar="X.npz", help="calibration inputs for quantizing compilers")] = None,
        model_data: Annotated[Path | None, typer.Option(
            "--model-data", metavar="FILE", help="the ONNX model's external-data file "
            "(e.g. model.onnx.data), when its weights are kept beside the .onnx")] = None,
        notes: Annotated[str, typer.Option(metavar="TEXT")] = "",
        wait: Annotated[bool, switch("--wait", help="follow the builds until ready or "
                                     "failed; exit 1 if failed")] = False,
        timeout: Annotated[float, typer.Option(metavar="SECONDS",
                                               help="how long --wait waits")] = 3600.0,
        server: Server = None, token: Token = None, as_json: Json = False,
    ) -> None:
        """Upload a model version (scope publish) and queue its builds."""
        with api(server, token, as_json) as (client, out):
            files = {"model": _file(file, "FILE")}
            for part, path in (("reference", reference), ("calibration", calibration),
                               ("model_data", model_data)):
                if path is not None:
                    files[part] = _file(path, "--" + part.replace("_", "-"))
            metadata: dict[str, Any] = {"version": version,
                                        "platforms": parse_platforms(platform),
                                        "inputs": [parse_input(s) for s in inputs]}
            if notes:
                metadata["notes"] = notes
            doc = _upload(client, out, model, files, metadata)
            if not wait:
                out.result(doc, lambda c: _summary(c, doc))
                out.note(f"follow the builds with `modelfleet versions show {model} {version}`"
                         " (or publish with --wait)")
                return
            out.note(f"uploaded {model} {version}; compiling …")
            final = wait_for_builds(client, out, doc, timeout)
            out.result(final, lambda c: print_builds(c, final))
            fail_if_failed(out, final)
