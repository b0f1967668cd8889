"""Server commands of `modelfleet`, composed from one module per area under server/commands/.

Each module exposes `register(app)` and imports only typer at module level; its commands import
what they need when run, so `modelfleet --help` stays fast and device-only installs work.
"""

from __future__ import annotations

import typer

from server.commands import bucket, gc, keys, serve, tokens, watermark, worker


def register(app: typer.Typer) -> None:
    for module in (serve, tokens, keys, worker, bucket, gc, watermark):
        module.register(app)
