"""What devices fetch, without a token: channel manifests (ETag / 304 / Cache-Control), signed
root versions, and artifact and patch files (Range → 206 / 416 on the local store, a 302 to a
presigned URL on S3).

Manifest bytes are served exactly as signed and stored, by one route over the per-process
cache of server/publish/manifest_cache.py. At fleet scale polls should not reach Python at
all: the publisher writes the same bytes to the bucket, which a CDN or caching proxy serves.

The poll is a plain Starlette route (`POLL_ROUTES`, ahead of every router: create_app passes
them as `FastAPI(routes=...)`), not a FastAPI one: polls are most requests, and FastAPI's
request handling — its included-router matching, dependency solving with query, header and
cookie parsing per request — costs a bare route about 6x the CPU of a Starlette route
(bench/serve/inprocess.py, docs/benchmarks.md "Serving"). Everything around it is the same
app: the middleware (request id, counter, access log, guard), the exception handlers and
error renderer of server/api/errors.py. Its operation is added to the OpenAPI spec by
`document_poll_routes`, which FastAPI does not do for Starlette routes.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Path, Request, Response
from fastapi.responses import RedirectResponse, StreamingResponse
from starlette.routing import Match, Route
from starlette.types import Scope

from server.api.deps import BlobStoreDep, SessionDep, ShortSessionDep, manifest_cache
from server.api.errors import NOT_FOUND
from server.publish.errors import ChannelNotFoundError
from server.publish.httpcache import RangeNotSatisfiable, etag_for, if_none_match, parse_range
from server.publish.manifest_cache import MANIFEST_CACHE_CONTROL
from server.rollouts.channels import CHANNEL_NAME
from server.services import serving

IMMUTABLE = "public, max-age=31536000, immutable"
SHA256_PATTERN = "^[0-9a-f]{64}$"
MANIFEST_PATH = "/v1/channels/{channel}/manifest"


router = APIRouter(prefix="/v1", tags=["serving"])


async def get_manifest(request: Request) -> Response:
    """The channel's current signed manifest (a DSSE envelope). Poll with If-None-Match."""
    channel: str = request.path_params["channel"]
    if not CHANNEL_NAME.fullmatch(channel):
        raise ChannelNotFoundError(f"channel {channel[:80]!r} does not exist")
    cache = manifest_cache(request)
    entry = cache.lookup(channel)
    if entry is None:
        entry = await cache.load(channel)
    headers = {"ETag": entry.etag, "Cache-Control": MANIFEST_CACHE_CONTROL}
    if entry.not_modified(request.headers.get("if-none-match")):
        return Response(status_code=304, headers=headers)
    return Response(entry.data, media_type="application/json", headers=headers)


class LabelledRoute(Route):
    """A Starlette route that puts itself in the scope as `route`, as FastAPI's own routes
    do: FastAPI's router sets it for those only, and the request counter and access log
    (server/api/observe.py) label each request with `scope["route"].path`."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match is not Match.NONE:
            child_scope["route"] = self
        return match, child_scope


# GET, and HEAD with it (Starlette adds HEAD to every GET route).
POLL_ROUTES = [LabelledRoute(MANIFEST_PATH, get_manifest, methods=["GET"], name="get_manifest")]

MANIFEST_OPERATION: dict[str, Any] = {
    "tags": ["serving"],
    "summary": "Get Manifest",
    "description": get_manifest.__doc__,
    "operationId": "get_manifest_v1_channels__channel__manifest_get",
    "parameters": [{"name": "channel", "in": "path", "required": True,
                    "schema": {"type": "string", "title": "Channel"}}],
    "responses": {
        "200": {"description": "The channel's DSSE envelope, exactly as signed",
                "content": {"application/json": {}}},
        "304": {"description": "If-None-Match matched the current ETag"},
        "404": {"description": "Not found", "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/ErrorBody"}}}},
    },
}


def document_poll_routes(app: FastAPI) -> None:
    """Adds the poll's operation to the app's OpenAPI spec (FastAPI documents its own routes
    only), where FastAPI put it when it was one of its routes."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        spec = build()
        spec.setdefault("paths", {}).setdefault(MANIFEST_PATH, {"get": MANIFEST_OPERATION})
        return spec

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented override hook


@router.get("/root", responses={**NOT_FOUND})
def get_root_index(session: SessionDep) -> dict[str, int]:
    """The newest signed root version; fetch each one after yours at /v1/root/{N}.json."""
    return {"latest_version": serving.latest_root_version(session)}


@router.get(
    "/root/{version}.json", response_class=Response,
    responses={200: {"content": {"application/json": {}},
                     "description": "Root version N as a DSSE envelope"}, **NOT_FOUND},
)
def get_root(version: Annotated[int, Path(ge=1, le=1_000_000)], session: SessionDep) -> Response:
    """Signed root version `version` (every version stays served, for rotation)."""
    return Response(serving.root_document(session, version), media_type="application/json",
                    headers={"Cache-Control": IMMUTABLE})


def _serve_blob(request: Request, store: BlobStoreDep, ref: serving.BlobRef,
                sha256: str) -> Response:
    key, length = ref.key, ref.length
    url = store.presigned_url(key)
    if url is not None:
        return RedirectResponse(url, status_code=302)
    headers = {"ETag": etag_for(sha256), "Accept-Ranges": "bytes", "Cache-Control": IMMUTABLE}
    if if_none_match(request.headers.get("if-none-match"), headers["ETag"]):
        return Response(status_code=304, headers=headers)
    try:
        wanted = parse_range(request.headers.get("range"), length)
    except RangeNotSatisfiable:
        return Response(status_code=416, headers={"Content-Range": f"bytes */{length}"})
    if wanted is None:
        headers["Content-Length"] = str(length)
        body = store.iter_range(key) if request.method == "GET" else iter(())
        return StreamingResponse(body, media_type="application/octet-stream", headers=headers)
    headers["Content-Range"] = wanted.content_range(length)
    headers["Content-Length"] = str(wanted.length)
    body = store.iter_range(key, wanted.start, wanted.end) if request.method == "GET" else iter(())
    return StreamingResponse(body, status_code=206, media_type="application/octet-stream",
                             headers=headers)


BLOB_RESPONSES: dict[int | str, dict[str, object]] = {
    200: {"content": {"application/octet-stream": {}}, "description": "The whole file"},
    206: {"description": "The requested byte range"},
    302: {"description": "Redirect to a presigned URL (S3 blob store)"},
    416: {"description": "Range not satisfiable"},
    **NOT_FOUND,
}


@router.head("/artifacts/{sha256}", include_in_schema=False)
@router.get("/artifacts/{sha256}", response_class=Response, responses=BLOB_RESPONSES)
def get_artifact(sha256: Annotated[str, Path(pattern=SHA256_PATTERN)], request: Request,
                 session: ShortSessionDep, store: BlobStoreDep) -> Response:
    """An artifact by its sha256 (as named in the manifest). Supports Range."""
    return _serve_blob(request, store, serving.blob_ref(session, "artifact", sha256), sha256)


@router.head("/patches/{sha256}", include_in_schema=False)
@router.get("/patches/{sha256}", response_class=Response, responses=BLOB_RESPONSES)
def get_patch(sha256: Annotated[str, Path(pattern=SHA256_PATTERN)], request: Request,
              session: ShortSessionDep, store: BlobStoreDep) -> Response:
    """A delta patch by its sha256 (as named in the manifest). Supports Range."""
    return _serve_blob(request, store, serving.blob_ref(session, "patch", sha256), sha256)
