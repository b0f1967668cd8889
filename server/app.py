"""The application factory: `create_app(settings)` builds the services (server/wiring.py),
installs error mapping, every router in `server.api.ROUTERS` and the body-size cap, and runs
the background work of an API process (signed-root import, re-signing, ramp steps) for its
lifetime.
No module-level app or engine."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from server.api import ROUTERS
from server.api.body_limits import install_request_guard
from server.api.errors import install_error_handlers
from server.api.observe import RequestObserver
from server.api.serving import POLL_ROUTES, document_poll_routes
from server.blobstore import BlobStore
from server.jobs.interface import JobQueue
from server.publish.errors import PublishError
from server.publish.resign import resign_loop
from server.rollouts.ramp import ramp_loop
from server.services.serving import import_roots
from server.services.source_gc import source_gc_loop
from server.settings import Settings
from server.wiring import Services, build_services, key_paths

API_VERSION = "0.1.0"
log = logging.getLogger("modelfleet.app")


def create_app(
    settings: Settings,
    *,
    blob_store: BlobStore | None = None,
    job_queue: JobQueue | None = None,
) -> FastAPI:
    """Builds the API. The schema must already be migrated (`server.db.migrate.upgrade`;
    `modelfleet serve` does it at start). `blob_store`/`job_queue` override the ones the
    settings choose (tests, embedding)."""
    services = build_services(settings, blob_store=blob_store, job_queue=job_queue)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        async with background(services):
            yield
        await services.fleet.aclose()  # the telemetry group commit's connection
        await run_in_threadpool(services.close)

    app = FastAPI(
        title="ModelFleet",
        version=API_VERSION,
        description="Model releases and over-the-air updates. Write endpoints need a bearer "
        "token with the right scope (`modelfleet tokens create --scope …`).",
        lifespan=lifespan,
        # Manifest polls, ahead of every router: plain Starlette routes (server/api/serving.py).
        routes=list(POLL_ROUTES),
        # No slash redirects: Starlette builds them from the Host header (`Host: evil.example`
        # → `Location: http://evil.example/…`). A path with a stray slash is a 404.
        redirect_slashes=False,
        # The API docs page is served from this package's own copy of swagger-ui
        # (server/api/docs.py), never from a CDN on the dashboard's origin.
        docs_url=None,
        redoc_url=None,
        # FastAPI's OpenTelemetry hooks look up the global providers on every request; this
        # server exports Prometheus counters (server/observability/metrics.py) instead.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    # The one handle on the wiring; routes reach its parts through server/api/deps.py. The
    # plain attributes name the same objects, for tests and embedders that inspect them.
    app.state.services = services
    app.state.settings = services.settings
    app.state.engine = services.engine
    app.state.session_factory = services.session_factory
    app.state.blob_store = services.blob_store
    app.state.job_queue = services.job_queue
    install_error_handlers(app)
    document_poll_routes(app)
    for router in ROUTERS:
        app.include_router(router)
    # Authentication and size caps before any request body is read (server/api/body_limits.py).
    install_request_guard(app, settings, ROUTERS)
    # Outermost: request id, request counter and access log around everything, the guard's
    # own refusals included (server/api/observe.py).
    app.add_middleware(RequestObserver, log_device_requests=settings.log_polls)
    return app


@contextlib.asynccontextmanager
async def background(services: Services) -> AsyncIterator[None]:
    """An API process's own work: import signed roots from DATA_DIR/roots, judge the active
    rollouts once, re-sign manifests before they expire, take due ramp steps of healthy
    rollouts, delete uploaded files no version names (server/services/source_gc.py)."""
    try:
        await run_in_threadpool(import_roots, services.session_factory,
                                key_paths(services.settings))
    except PublishError as e:  # serve anyway: manifests and artifacts do not need the roots
        log.error("signed roots not imported: %s", e.message)
    try:  # decisions a killed process took but did not publish (docs/architecture.md)
        await run_in_threadpool(services.fleet.guard.evaluate_active)
    except Exception:  # e.g. the database is down at start: the next report re-judges
        log.exception("judging the active rollouts at start failed")
    tasks = [asyncio.create_task(resign_loop(services.session_factory, services.publisher)),
             asyncio.create_task(ramp_loop(services.fleet.ramp,
                                           services.settings.ramp_check_seconds))]
    if services.settings.source_gc_interval_seconds > 0:
        tasks.append(asyncio.create_task(source_gc_loop(
            services.session_factory, services.blob_store,
            grace_seconds=services.settings.source_gc_grace_seconds,
            interval_seconds=services.settings.source_gc_interval_seconds)))
    # Everything loaded at start lives as long as the process: moving it out of the cyclic
    # GC's generations stops full collections from rescanning it under load (p99 spikes).
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()  # let a process that builds many apps (tests) collect them again
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
