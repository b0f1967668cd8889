"""FastAPI dependencies: the services `create_app` wired (server/wiring.py) — settings, DB
session (or its factory), blob store, job queue, publisher, manifest cache — and the caller's
principal with scope checks (`Annotated` aliases, as routes use them).

The one server.api module that touches SQLAlchemy: it opens the request's session."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from server import auth
from server.auth import Principal
from server.blobstore import BlobStore
from server.db.session import close_request_session
from server.jobs.interface import JobQueue
from server.publish.manifest_cache import ManifestCache
from server.publish.publisher import Publisher
from server.services.fleet.service import Fleet
from server.settings import Settings
from server.wiring import Services

# The dependencies that only hand over a wired object are `async def`: FastAPI runs a plain
# `def` dependency in the thread pool, a thread hop per dependency per request.

# auto_error=False: we answer a missing token ourselves, with a message that says how to fix it.
bearer = HTTPBearer(auto_error=False, description="API token from `modelfleet tokens create`")


async def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


async def get_settings(services: ServicesDep) -> Settings:
    return services.settings


def get_session(services: ServicesDep) -> Iterator[Session]:
    """A session per request. Routes commit explicitly; anything uncommitted rolls back."""
    session = services.session_factory()
    try:
        yield session
    finally:
        close_request_session(session)


async def get_blob_store(services: ServicesDep) -> BlobStore:
    return services.blob_store


async def get_job_queue(services: ServicesDep) -> JobQueue:
    return services.job_queue


async def get_publisher(services: ServicesDep) -> Publisher:
    return services.publisher


def manifest_cache(request: Request) -> ManifestCache:
    """The poll route's cache, read by the route itself rather than injected: polls are most
    requests, and FastAPI resolves each dependency per request (its query, header and cookie
    parameters, its cache key) — about a third of a poll's CPU time (bench/serve/inprocess.py)."""
    services: Services = request.app.state.services
    return services.manifest_cache


async def get_session_factory(services: ServicesDep) -> sessionmaker[Session]:
    """For services that run their own transactions (rollout changes retry lost races)."""
    return services.session_factory


async def get_fleet(request: Request) -> Fleet:
    # Straight from the request, not through ServicesDep: each nested dependency costs a
    # resolution per request.
    services: Services = request.app.state.services
    return services.fleet


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
# Closed when the route returns, before a streamed body is sent (file downloads): a long
# download does not hold a pooled connection.
ShortSessionDep = Annotated[Session, Depends(get_session, scope="function")]
BlobStoreDep = Annotated[BlobStore, Depends(get_blob_store)]
JobQueueDep = Annotated[JobQueue, Depends(get_job_queue)]
PublisherDep = Annotated[Publisher, Depends(get_publisher)]
SessionFactoryDep = Annotated[sessionmaker[Session], Depends(get_session_factory)]
FleetDep = Annotated[Fleet, Depends(get_fleet)]
CredentialsDep = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


async def reject_unknown_query_params(request: Request) -> None:
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
# (server/api/body_limits.py) reads this to authenticate before a request body is read.
TOKEN_SCOPES: dict[Callable[..., Principal], str | None] = {}

# Where a request's principal is kept once its token was looked up: by the request guard for
# a write (before the body is read), else by the first token dependency. Every later check
# reads it from here, so a request is authenticated once (one token lookup).
PRINCIPAL_KEY = "modelfleet.principal"


def principal_of(request: Request, session: Session, credentials: HTTPAuthorizationCredentials
                 | None, settings: Settings) -> Principal:
    """The request's principal: the one the guard authenticated, else the token looked up now
    (its last_used_at committed)."""
    principal = request.scope.get(PRINCIPAL_KEY)
    if isinstance(principal, Principal):
        return principal
    principal = auth.authenticate(session, _header(credentials, request),
                                  pepper=settings.token_pepper)
    session.commit()  # persists last_used_at
    request.scope[PRINCIPAL_KEY] = principal
    return principal


def require_scope(scope: str) -> Callable[..., Principal]:
    """A dependency that hands the route the request's principal, checked for `scope`."""

    def dependency(request: Request, session: SessionDep, credentials: CredentialsDep,
                   settings: SettingsDep) -> Principal:
        principal = principal_of(request, session, credentials, settings)
        auth.require(principal, scope)
        return principal

    dependency.__name__ = f"require_{scope}"
    TOKEN_SCOPES[dependency] = scope
    return dependency


def any_token(request: Request, session: SessionDep, credentials: CredentialsDep,
              settings: SettingsDep) -> Principal:
    """Read routes: any valid token except an `enroll`-only one (`auth.require_reader`)."""
    principal = principal_of(request, session, credentials, settings)
    auth.require_reader(principal)
    return principal


TOKEN_SCOPES[any_token] = None

PublishPrincipal = Annotated[Principal, Depends(require_scope(auth.Scope.publish.value))]
RolloutPrincipal = Annotated[Principal, Depends(require_scope(auth.Scope.rollout.value))]
EnrollPrincipal = Annotated[Principal, Depends(require_scope(auth.Scope.enroll.value))]
AdminPrincipal = Annotated[Principal, Depends(require_scope(auth.Scope.admin.value))]
TokenPrincipal = Annotated[Principal, Depends(any_token)]
