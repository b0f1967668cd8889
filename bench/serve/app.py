"""ASGI factory for the serving benchmark: the real app from MODELFLEET_* settings, with every
manifest poll answered by its route (`granian --interface asgi --factory
bench.serve.app:make_app`).

Builds before issue 21 answered cached polls ahead of routing (`ServingFastAPI`, unless
`log_polls`); there this switches that off and silences the access log the switch turns on,
so the figure is the plain route's on either side of the change. On later builds it does
nothing.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI

from server.app import create_app
from server.settings import Settings


def make_app() -> FastAPI:
    app = create_app(Settings())
    if hasattr(app, "log_polls"):
        app.log_polls = True
        logging.getLogger("modelfleet.access").setLevel(logging.WARNING)
    return app
