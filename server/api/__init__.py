"""HTTP API routers. Each area adds its router module here and appends it to ROUTERS;
`server.app.create_app` includes them in this order. Device traffic (manifest polls and
telemetry) comes first: routing tries routes in order, and those are most requests."""

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
    telemetry.router,
    serving.router,
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
