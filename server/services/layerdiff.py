"""A version's per-layer diffs (one per built artifact, made by the compile pipeline:
server/compile/gates/layerdiff.py) as one paged table: rows are the source's tensors in node
order, columns the artifacts (platform × variant × precision), cells (cosine, SNR dB)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from server.services.builds import version_builds

MAX_PAGE = 500  # layers per page


@dataclass(frozen=True)
class LayerColumn:
    platform: str
    variant: str
    precision: str
    state: str  # the build outcome's: ready | failed
    basis: str = ""
    total: int = 0
    truncated: bool = False
    thresholds: dict[str, Any] | None = None
    first_below: dict[str, Any] | None = None
    unavailable: str = ""


@dataclass(frozen=True)
class LayerRow:
    tensor: str
    node: str
    op: str
    cells: list[list[Any] | None]  # per column: [cosine, snr_db], or None (not compared)


@dataclass(frozen=True)
class LayerPage:
    model: str
    version: str
    columns: list[LayerColumn]
    rows: list[LayerRow]
    offset: int
    limit: int
    total: int  # rows across every page
    next_offset: int | None


def _columns(session: Session, model: str, version: str
             ) -> tuple[str, list[LayerColumn], list[list[list[Any]]]]:
    found = version_builds(session, model, version)
    columns, tables = [], []
    for item in found.builds:
        for o in (item.build.gates_report or {}).get("outcomes", []):
            diff = o.get("layer_diff") or {}
            if not diff:
                continue
            columns.append(LayerColumn(
                platform=str(o.get("platform", item.build.platform)),
                variant=str(o.get("variant", "")), precision=str(o.get("precision", "")),
                state=str(o.get("state", "")), basis=str(diff.get("basis", "")),
                total=int(diff.get("total", 0) or 0), truncated=bool(diff.get("truncated")),
                thresholds=diff.get("thresholds"), first_below=diff.get("first_below"),
                unavailable=str(diff.get("unavailable", ""))))
            tables.append(list(diff.get("layers") or []))
    return found.version.version, columns, tables


def layer_page(session: Session, model: str, version: str, offset: int, limit: int
               ) -> LayerPage:
    """NotFoundError if the model or version does not exist. Rows are the union of every
    column's tensors, in the order they first appear (each column keeps the source's order)."""
    name, columns, tables = _columns(session, model, version)
    order: dict[str, tuple[str, str]] = {}
    cells: list[dict[str, list[Any]]] = []
    for rows in tables:
        mine = {}
        for tensor, node, op, cos, snr in rows:
            order.setdefault(tensor, (node, op))
            mine[tensor] = [cos, snr]
        cells.append(mine)
    names = list(order)
    page = [LayerRow(t, *order[t], [c.get(t) for c in cells])
            for t in names[offset:offset + limit]]
    after = offset + limit
    return LayerPage(model, name, columns, page, offset, limit, len(names),
                     after if after < len(names) else None)
