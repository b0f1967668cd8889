"""`GET /` redirects to the dashboard at `/ui/`; until the dashboard lands, `/ui/` is a small
static page pointing at the API docs and the CLI."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, RedirectResponse

router = APIRouter(include_in_schema=False)

PLACEHOLDER = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>ModelFleet</title></head>
<body><h1>ModelFleet</h1>
<p>The dashboard is not built yet. Meanwhile: the API reference at <a href="/docs">/docs</a>
and, in a terminal, <code>modelfleet status</code> (see docs/cli.md).</p>
</body></html>
"""


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)


@router.get("/ui/")
def ui() -> HTMLResponse:
    return HTMLResponse(PLACEHOLDER)
