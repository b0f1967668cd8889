"""HTTP API routers. Each area adds its router module here and appends it to ROUTERS;
`server.app.create_app` includes them in this order."""

from __future__ import annotations

from fastapi import APIRouter

from server.api import (
    audit,
    builds,
    devices,
    health,
    metrics,
    models,
    rollouts,
    serving,
    telemetry,
    timeline,
    ui,
    versions,
)

ROUTERS: list[APIRouter] = [
    health.router,
    metrics.router,
    audit.router,
    models.router,
    versions.router,
    builds.router,
    serving.router,
    rollouts.router,
    timeline.router,
    devices.router,
    telemetry.router,
    ui.router,
]
