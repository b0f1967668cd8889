"""`GET /v1/models/{name}/versions/{version}/layers`: the per-layer diff of every built
artifact against the FP32 source (cosine and SNR per intermediate tensor), paged by layer.
An open read, like the builds it comes from."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel

from server.api.deps import SessionDep, StrictQuery
from server.api.errors import NOT_FOUND
from server.api.models import ModelName
from server.services.layerdiff import MAX_PAGE, layer_page

router = APIRouter(prefix="/v1/models/{name}/versions/{version}/layers", tags=["builds"],
                   dependencies=[StrictQuery])


class LayerColumnPublic(BaseModel):
    platform: str
    variant: str
    precision: str
    state: str
    basis: str
    total: int
    truncated: bool
    thresholds: dict[str, Any] | None
    first_below: dict[str, Any] | None
    unavailable: str


class LayerRowPublic(BaseModel):
    tensor: str
    node: str
    op: str
    cells: list[list[float | str] | None]


class LayerPagePublic(BaseModel):
    model: str
    version: str
    columns: list[LayerColumnPublic]
    layers: list[LayerRowPublic]
    offset: int
    limit: int
    total: int
    next_offset: int | None


@router.get("", responses={**NOT_FOUND})
def list_layers(
    name: ModelName,
    version: Annotated[str, Path(min_length=1, max_length=64)],
    session: SessionDep,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
) -> LayerPagePublic:
    """One page of layers × artifacts: per column (platform, variant, precision) what it was
    compared with, its thresholds and the first layer below them; per row (a tensor of the
    source, in node order) the cells [cosine, SNR dB] or null where not compared. Follow
    `next_offset` for the next page; each artifact's report is capped at 1000 tensors
    (`truncated`, `total`)."""
    p = layer_page(session, name, version, offset, limit)
    return LayerPagePublic(
        model=p.model, version=p.version,
        columns=[LayerColumnPublic(**vars(c)) for c in p.columns],
        layers=[LayerRowPublic(**vars(r)) for r in p.rows],
        offset=p.offset, limit=p.limit, total=p.total, next_offset=p.next_offset)
