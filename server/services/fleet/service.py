"""The fleet services of one API process: telemetry ingestion, and after each batch the
rollouts' guard (server/rollouts/guard.py) and ramp tick (server/rollouts/ramp.py) it feeds.
server/wiring.py builds it.

`Fleet.receive` is the whole of `POST /v1/telemetry` after the body was read (the route in
server/api/telemetry.py calls it). On PostgreSQL the
checks run on the event loop and the rows go through the process's group commit
(server/services/fleet/groupcommit.py); on any other database (SQLite, the embedded default)
the generic path runs in a worker thread, one transaction per request.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import make_url
from starlette.concurrency import run_in_threadpool

from server.rollouts.guard import FleetGuard
from server.rollouts.ramp import RampTicker
from server.services.fleet.attestation import Attestor
from server.services.fleet.content_keys import KeyGrants
from server.services.fleet.groupcommit import GroupCommitter
from server.services.fleet.ingest import (
    IngestResult,
    TelemetryIngest,
    accepted_reports,
    check_device_header,
    decode_signature,
)


@dataclass
class Fleet:
    ingest: TelemetryIngest
    guard: FleetGuard
    ramp: RampTicker
    committer: GroupCommitter | None = None  # PostgreSQL with group commit on
    # The attestation provider (server/services/fleet/attestation.py); None: off.
    attestor: Attestor | None = None
    # Content keys of protected releases for offered devices (content_keys.py); None: off.
    key_grants: KeyGrants | None = None

    async def receive(self, device_id: str | None, signature: str | None,
                      body: bytes) -> IngestResult:
        """Verifies, stores and judges one signed batch; raises the service error to answer
        otherwise. Returns once the batch's rows are committed."""
        ingest, committer = self.ingest, self.committer
        if committer is None:
            result = await run_in_threadpool(ingest.ingest, device_id, signature, body)
        else:
            check_device_header(device_id)
            assert device_id is not None
            if not ingest.keys.cached(device_id):  # once per device and process
                decode_signature(signature)  # the generic path's order: signature, then key
                await run_in_threadpool(ingest.keys.get, device_id)
            batch, received = ingest.admit(device_id, signature, body)
            release_of = ingest.cached_releases(batch)
            if release_of is None:  # at most once per model version every few seconds
                release_of = await run_in_threadpool(ingest.load_releases, batch)
            standing = ingest.offers.cached(batch, release_of)
            if standing is None:  # once per device, and per release every few seconds
                standing = await run_in_threadpool(ingest.offers.classify, batch, release_of)
            result = await committer.store(batch, release_of, received, standing=standing)
        accepted_reports(result)
        if result.judged:
            await run_in_threadpool(self.guard.evaluate, result.judged)
            await run_in_threadpool(self.ramp.tick, result.judged)
        return result

    async def aclose(self) -> None:
        if self.committer is not None:
            await self.committer.aclose()


def libpq_dsn(database_url: str) -> str | None:
    """The libpq form of a PostgreSQL URL (None for any other database)."""
    url = make_url(database_url)
    if url.get_backend_name() != "postgresql":
        return None
    return url.set(drivername="postgresql").render_as_string(hide_password=False)
