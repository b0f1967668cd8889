"""`modelfleet tokens` commands (not built yet)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Registers nothing until this area is built."""
