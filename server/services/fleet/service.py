"""The fleet services of one API process: telemetry ingestion, the guard it feeds and the
ramp schedules that step healthy rollouts."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from server.publish.publisher import Publisher
from server.services.fleet.guard import FleetGuard
from server.services.fleet.ingest import TelemetryIngest
from server.services.fleet.ramp import RampTicker
from server.settings import Settings


@dataclass
class Fleet:
    ingest: TelemetryIngest
    guard: FleetGuard
    ramp: RampTicker


def make_fleet(settings: Settings, factory: sessionmaker[Session],
               publisher: Publisher) -> Fleet:
    ingest = TelemetryIngest(factory, rate_per_s=settings.telemetry_rate_per_second,
                             burst=settings.telemetry_burst,
                             max_skew_s=settings.telemetry_max_skew_seconds)
    guard = FleetGuard(factory, publisher, webhook_url=settings.halt_webhook_url)
    return Fleet(ingest, guard, RampTicker(factory, publisher))
