"""`GET /metrics`: the server's Prometheus counters in the text exposition format
(server/observability/metrics.py; summed over every API process under `serve --workers N`).

No token by default — scrapers sit inside the deployment's network and the counters name
no secret; with MODELFLEET_METRICS_TOKEN set it wants `Authorization: Bearer <token>`.
"""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request, Response

from server.api.deps import SettingsDep, StrictQuery
from server.errors import AuthenticationError
from server.observability import metrics

router = APIRouter(tags=["health"], dependencies=[StrictQuery])


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {metrics.CONTENT_TYPE: {}},
                             "description": "Prometheus text exposition"},
                       401: {"description": "MODELFLEET_METRICS_TOKEN is set and the "
                             "bearer token is not it"}})
def get_metrics(request: Request, settings: SettingsDep) -> Response:
    """Request (polls included), job, telemetry and halt counters (Prometheus text format)."""
    wanted = settings.metrics_token
    if wanted:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {wanted}".encode()):
            raise AuthenticationError("GET /metrics needs the metrics token",
                                      fix="send Authorization: Bearer $MODELFLEET_METRICS_TOKEN")
    return Response(metrics.render(), media_type=metrics.CONTENT_TYPE)
