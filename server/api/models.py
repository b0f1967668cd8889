"""`/v1/models`: create, list and get models (the name a release engineer publishes under)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Query, Response
from pydantic import BaseModel, Field

from server.api.deps import PublishPrincipal, SessionDep, StrictQuery
from server.api.errors import AUTH_ERRORS, CONFLICT, INVALID, NOT_FOUND
from server.db.models import Model, TaskType
from server.services import registry

router = APIRouter(prefix="/v1/models", tags=["models"], dependencies=[StrictQuery])

ModelName = Annotated[
    str, Path(min_length=1, max_length=64, pattern=registry.MODEL_NAME_RE.pattern)
]


class ModelCreate(BaseModel):
    name: Annotated[str, Field(min_length=1, max_length=64,
                               pattern=registry.MODEL_NAME_RE.pattern,
                               examples=["mobilenet"])]
    description: Annotated[str, Field(max_length=4000)] = ""
    task: TaskType = TaskType.other
    owner: Annotated[str, Field(max_length=128)] = ""


class ModelPublic(BaseModel):
    name: str
    description: str
    task: TaskType
    owner: str
    created_at: datetime
    created_by: str
    version_count: int


class ModelList(BaseModel):
    models: list[ModelPublic]


def to_public(model: Model, version_count: int) -> ModelPublic:
    return ModelPublic(name=model.name, description=model.description, task=model.task,
                       owner=model.owner, created_at=model.created_at,
                       created_by=model.created_by, version_count=version_count)


@router.post("", status_code=201, responses={
    200: {"model": ModelPublic, "description": "Identical model already existed"},
    **AUTH_ERRORS, **CONFLICT, **INVALID,
})
def create_model(body: ModelCreate, session: SessionDep, principal: PublishPrincipal,
                 response: Response) -> ModelPublic:
    """Creates a model (scope `publish`). Sending the same fields again returns the existing
    model with 200; the same name with different fields is a 409."""
    model, created = registry.create_model(
        session, principal.actor, name=body.name, description=body.description,
        task=body.task, owner=body.owner,
    )
    if not created:
        response.status_code = 200
    return to_public(model, registry.version_counts(session, [model.id]).get(model.id, 0))


@router.get("")
def list_models(
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> ModelList:
    """All models, by name."""
    models = registry.list_models(session, limit=limit, offset=offset)
    counts = registry.version_counts(session, [m.id for m in models])
    return ModelList(models=[to_public(m, counts.get(m.id, 0)) for m in models])


@router.get("/{name}", responses={**NOT_FOUND})
def get_model(name: ModelName, session: SessionDep) -> ModelPublic:
    model = registry.get_model(session, name)
    return to_public(model, registry.version_counts(session, [model.id]).get(model.id, 0))
