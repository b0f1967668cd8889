"""The API docs page, `GET /docs`: swagger-ui over `/openapi.json`, every asset served from
this process, never from a CDN.

The docs share an origin with the dashboard (whose token sits in sessionStorage), so a script
that a third party could change must never run here. The swagger-ui files come from the
fastapi-offline package (installed with the server: a pinned, reviewable copy), are read once
at import into a fixed set (no path from the URL reaches the file system) and are named in
the page with their SHA-256 (`integrity`). Every answer carries a Content-Security-Policy
that allows scripts from this origin only (no inline script: the page's own start-up code
is `/docs/init.js`) and fetches to this origin only. swagger-ui sets inline styles, so
styles may be inline; nothing else is loosened.
"""

from __future__ import annotations

import base64
import hashlib
import pathlib
from typing import Annotated

import fastapi_offline
from fastapi import APIRouter, Path
from fastapi.responses import Response

from server.api import ui
from server.errors import NotFoundError

router = APIRouter(include_in_schema=False)

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
# The dashboard's headers (server/api/ui.py), with swagger-ui's inline styles allowed.
HEADERS = {**ui.HEADERS, "Content-Security-Policy": CONTENT_SECURITY_POLICY}
ASSETS_DIR = pathlib.Path(fastapi_offline.__file__).parent / "static"
INIT_JS = b"""window.ui = SwaggerUIBundle({
  url: "/openapi.json", dom_id: "#swagger-ui", deepLinking: true,
  presets: [SwaggerUIBundle.presets.apis], layout: "BaseLayout"
});
"""
MEDIA_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
               ".png": "image/png"}


def _load_assets() -> dict[str, tuple[bytes, str]]:
    files = {name: ((ASSETS_DIR / name).read_bytes(), MEDIA_TYPES[pathlib.Path(name).suffix])
             for name in ("swagger-ui-bundle.js", "swagger-ui.css", "favicon.png")}
    files["init.js"] = (INIT_JS, MEDIA_TYPES[".js"])
    return files


ASSETS = _load_assets()


def _integrity(name: str) -> str:
    digest = hashlib.sha256(ASSETS[name][0]).digest()
    return "sha256-" + base64.b64encode(digest).decode()


PAGE = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>ModelFleet API</title>
<link rel="icon" type="image/png" href="/docs/favicon.png">
<link rel="stylesheet" href="/docs/swagger-ui.css" integrity="{_integrity('swagger-ui.css')}">
</head>
<body>
<div id="swagger-ui"></div>
<script src="/docs/swagger-ui-bundle.js" integrity="{_integrity('swagger-ui-bundle.js')}">
</script>
<script src="/docs/init.js" integrity="{_integrity('init.js')}"></script>
</body>
</html>
""".encode()


class DocsAssetNotFoundError(NotFoundError):
    code = "docs_asset_not_found"


@router.get("/docs")
def docs_page() -> Response:
    return Response(PAGE, media_type="text/html; charset=utf-8", headers=HEADERS)


@router.get("/docs/{name}")
def docs_asset(name: Annotated[str, Path(max_length=64)]) -> Response:
    found = ASSETS.get(name)
    if found is None:
        raise DocsAssetNotFoundError(f"no docs asset {name!r}", fix="open /docs")
    body, media_type = found
    return Response(body, media_type=media_type, headers=HEADERS)
