"""`modelfleet watermark identify LEAKED_FILE`: which cohort a leaked model file came from.

Reads the file's weights — an ONNX file (also one re-quantized by onnxruntime's quantizers),
a Core ML .mlpackage as a directory, tar or zip, or a QNN EPContext file or its bare
context binary (read in the binary's own layout against the server's copies) — and compares
them with every watermarked artifact's unmarked original (server/services/watermarks.py).
Prints the model, version, platform and cohort with the false-positive bound, or "none"
(an unmarked or foreign file); `--json` for scripts. Exit 0 when a cohort is named, 1 for
"none", 2 when the file cannot be read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

watermark_app = typer.Typer(no_args_is_help=True,
                            help="Per-cohort watermarks: name a leaked file's cohort.")

DataDir = Annotated[Path, typer.Option("--data-dir", help="The server's data directory")]


@watermark_app.command("identify")
def identify(
    leaked: Annotated[Path, typer.Argument(help="The leaked model file (.onnx, .mlpackage "
                                           "directory, tar or zip, QNN .ctx.onnx or .bin)")],
    data_dir: DataDir = Path("data"),
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON")] = False,
) -> None:
    """Name the cohort whose watermark LEAKED carries, with its false-positive bound."""
    from server.compile.weights import WeightsError
    from server.db.migrate import upgrade
    from server.services.watermarks import identify as find
    from server.settings import Settings
    from server.wiring import content_keys, core, watermark_secret

    if not leaked.exists():
        typer.echo(f"error: {leaked} does not exist", err=True)
        raise typer.Exit(2)
    settings = Settings(data_dir=data_dir)
    upgrade(settings.resolved_database_url)
    with core(settings) as c, c.session_factory() as session:
        try:
            found = find(session, c.blob_store, watermark_secret(settings),
                         content_keys(settings), leaked)
        except WeightsError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(found.to_dict()))
    elif found.cohort is None:
        typer.echo(f"none (no watermark at a false-positive probability ≤ 1e-9; best "
                   f"match z = {found.z:.2f}, bound {found.false_positive:.2g})")
    else:
        typer.echo(f"cohort {found.cohort} of {found.model} {found.version} "
                   f"({found.platform}/{found.variant}): false-positive probability ≤ "
                   f"{found.false_positive:.2g} (z = {found.z:.1f} over {found.weights} "
                   "marked weights)")
    raise typer.Exit(0 if found.cohort is not None else 1)


def register(app: typer.Typer) -> None:
    app.add_typer(watermark_app, name="watermark")
