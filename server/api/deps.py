"""FastAPI dependencies: settings, DB session, blob store, job queue, and the caller's
principal with scope checks (`Annotated` aliases, as routes use them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from server import auth
from server.auth import Principal
from server.blobstore import BlobStore
from server.jobs.interface import JobQueue
from server.settings import Settings

# auto_error=False: we answer a missing token ourselves, with a message that says how to fix it.
bearer = HTTPBearer(auto_error=False, description="API token from `modelfleet tokens create`")


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_session(request: Request) -> Iterator[Session]:
    """A session per request. Routes commit explicitly; anything uncommitted rolls back."""
    session: Session = request.app.state.session_factory()
    try:
        yield session
    finally:
        session.close()


def get_blob_store(request: Request) -> BlobStore:
    store: BlobStore = request.app.state.blob_store
    return store


def get_job_queue(request: Request) -> JobQueue:
    queue: JobQueue = request.app.state.job_queue
    return queue


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
BlobStoreDep = Annotated[BlobStore, Depends(get_blob_store)]
JobQueueDep = Annotated[JobQueue, Depends(get_job_queue)]
CredentialsDep = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def reject_unknown_query_params(request: Request) -> None:
    """Router dependency: a query parameter the route does not declare, or a single-valued one
    given several times, is a 422 naming it — a typo (`?limt=5`) or a mistaken repeat is
    reported instead of silently ignored or silently reduced to its last value."""
    from fastapi.routing import APIRoute

    from server.errors import InvalidInputError

    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    multi: dict[str, bool] = {}
    stack = [route.dependant]
    while stack:
        dependant = stack.pop()
        for param in dependant.query_params:
            multi[param.alias] = _is_sequence(param.field_info.annotation)
        stack.extend(dependant.dependencies)
    for name in request.query_params:
        if name not in multi:
            raise InvalidInputError(
                f"unknown query parameter {name!r}", field=name,
                fix=f"remove it; this endpoint takes: {', '.join(sorted(multi)) or 'none'}",
            )
        count = len(request.query_params.getlist(name))
        if count > 1 and not multi[name]:
            raise InvalidInputError(
                f"query parameter {name!r} given {count} times", field=name,
                fix="give it once",
            )


def _is_sequence(annotation: object) -> bool:
    import types
    import typing

    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_is_sequence(arg) for arg in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _is_sequence(typing.get_args(annotation)[0])
    return origin in (list, tuple, set, frozenset)


StrictQuery = Depends(reject_unknown_query_params)


def _header(credentials: HTTPAuthorizationCredentials | None, request: Request) -> str | None:
    if credentials is not None:
        return f"{credentials.scheme} {credentials.credentials}"
    return request.headers.get("authorization")


# Every token dependency and the scope it demands (None: any valid token). The request guard
# (server/api/guard.py) reads this to authenticate before a request body is read.
TOKEN_SCOPES: dict[Callable[..., Principal], str | None] = {}


def require_scope(scope: str) -> Callable[..., Principal]:
    """A dependency that authenticates the bearer token and checks it has `scope`."""

    def dependency(request: Request, session: SessionDep, credentials: CredentialsDep) -> Principal:
        principal = auth.authenticate(session, _header(credentials, request),
                                      pepper=request.app.state.settings.token_pepper)
        auth.require(principal, scope)
        session.commit()  # persists last_used_at
        return principal

    dependency.__name__ = f"require_{scope}"
    TOKEN_SCOPES[dependency] = scope
    return dependency


def any_token(request: Request, session: SessionDep, credentials: CredentialsDep) -> Principal:
    principal = auth.authenticate(session, _header(credentials, request),
                                  pepper=request.app.state.settings.token_pepper)
    session.commit()
    return principal


TOKEN_SCOPES[any_token] = None

PublishPrincipal = Annotated[Principal, Depends(require_scope(auth.Scope.publish.value))]
RolloutPrincipal = Annotated[Principal, Depends(require_scope(auth.Scope.rollout.value))]
AdminPrincipal = Annotated[Principal, Depends(require_scope(auth.Scope.admin.value))]
TokenPrincipal = Annotated[Principal, Depends(any_token)]
