"""The dashboard: `GET /` and `GET /ui` redirect (307) to `/ui/`; `/ui/` is its page and
`/ui/{file}` its stylesheet and JavaScript modules, read once from the package data in
server/ui/static/.
Redirects are relative (`Location: /ui/`): never built from the request's Host header.

Every answer carries a strict Content-Security-Policy: scripts only from this origin (no
inline script, no eval), no plugins, no framing, and fetches only to this origin — a value
that slipped into the page as markup still could not run or send anything elsewhere."""

from __future__ import annotations

import pathlib
from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import RedirectResponse, Response

from server import ui as dashboard
from server.errors import NotFoundError

router = APIRouter(include_in_schema=False)

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    # The files change with the installed package; revalidate rather than serve a stale app.
    "Cache-Control": "no-cache",
}
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
               ".js": "text/javascript; charset=utf-8"}


def _load_files() -> dict[str, tuple[bytes, str]]:
    static = pathlib.Path(dashboard.__file__).parent / "static"
    files = {}
    for entry in sorted(static.iterdir()):
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in MEDIA_TYPES:
            files[entry.name] = (entry.read_bytes(), MEDIA_TYPES[suffix])
    return files


# A fixed set, known at import: a request names one of these files or gets a 404 (no path
# from the URL ever reaches the file system).
FILES = _load_files()


class UiFileNotFoundError(NotFoundError):
    code = "ui_file_not_found"


def _file(name: str) -> Response:
    found = FILES.get(name)
    if found is None:
        raise UiFileNotFoundError(f"no dashboard file {name!r}", fix="open /ui/")
    body, media_type = found
    return Response(body, media_type=media_type, headers=HEADERS)


@router.get("/")
@router.get("/ui")
def root() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


@router.get("/ui/")
def ui() -> Response:
    return _file("index.html")


@router.get("/ui/{name}")
def ui_file(name: Annotated[str, Path(max_length=64)]) -> Response:
    return _file(name)
