"""ASGI factories for the serving benchmark: the real app from MODELFLEET_* settings, with every
manifest poll answered by its route (`granian --interface asgi --factory
bench.serve.app:make_app`), and `make_floor`, the same answers from a bare ASGI callable:
what the HTTP server itself costs per request, below any framework.

Builds before issue 21 answered cached polls ahead of routing (`ServingFastAPI`, unless
`log_polls`); there this switches that off and silences the access log the switch turns on,
so the figure is the plain route's on either side of the change. On later builds it does
nothing.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from fastapi import FastAPI

from server.app import create_app
from server.blobstore.keys import channel_manifest_key
from server.publish.manifest_cache import MANIFEST_CACHE_CONTROL
from server.settings import Settings


def make_app() -> FastAPI:
    app = create_app(Settings())
    if hasattr(app, "log_polls"):
        app.log_polls = True
        logging.getLogger("modelfleet.access").setLevel(logging.WARNING)
    return app


def make_floor() -> Any:
    """The `prod` manifest as the bucket holds it, with the route's headers, 304 on a
    matching If-None-Match (compared as bytes): no routing, middleware or framework."""
    objects = Settings().resolved_blob_dir / "objects"  # the local store's published keys
    data = (objects / channel_manifest_key("prod")).read_bytes()
    etag = f'"{hashlib.sha256(data).hexdigest()}"'.encode()
    common = [(b"etag", etag), (b"cache-control", MANIFEST_CACHE_CONTROL.encode())]
    ok = [*common, (b"content-type", b"application/json"),
          (b"content-length", str(len(data)).encode())]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        fresh = any(k == b"if-none-match" and v == etag for k, v in scope["headers"])
        await send({"type": "http.response.start", "status": 304 if fresh else 200,
                    "headers": common if fresh else ok})
        await send({"type": "http.response.body", "body": b"" if fresh else data})

    return app
