"""HTTP API routers. Each area adds its router module here and appends it to ROUTERS;
`server.app.create_app` includes them in this order. Device traffic comes first, polls
before telemetry: routing tries routers and their routes in order (FastAPI matches into an
included router twice per request), and polls are most requests."""

from __future__ import annotations

from fastapi import APIRouter

from server.api import (
    audit,
    builds,
    devices,
    docs,
    layers,
    metrics,
    models,
    readiness,
    rollouts,
    serving,
    telemetry,
    timeline,
    ui,
    versions,
)

ROUTERS: list[APIRouter] = [
    serving.router,
    telemetry.router,
    readiness.router,
    metrics.router,
    audit.router,
    models.router,
    versions.router,
    builds.router,
    layers.router,
    rollouts.router,
    timeline.router,
    devices.router,
    ui.router,
    docs.router,
]
