"""The application factory: `create_app(settings)` wires the database, blob store, job queue,
error mapping and every router in `server.api.ROUTERS`. No module-level app or engine."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from server.api import ROUTERS
from server.api.errors import install_error_handlers
from server.api.guard import install_request_guard
from server.api.serving import ServingFastAPI
from server.blobstore import BlobStore, make_blob_store
from server.db.session import make_engine, make_session_factory
from server.jobs.interface import JobQueue, NullJobQueue
from server.settings import Settings

API_VERSION = "0.1.0"


# The compile area plugs its queue in here: a module with `make_job_queue(app) -> JobQueue`,
# called once app.state holds settings, session_factory and blob_store.
JOB_QUEUE_FACTORY_MODULE = "server.jobs.factory"


def default_job_queue(app: FastAPI) -> JobQueue:
    if importlib.util.find_spec(JOB_QUEUE_FACTORY_MODULE) is None:
        return NullJobQueue()
    factory = importlib.import_module(JOB_QUEUE_FACTORY_MODULE)
    queue: JobQueue = factory.make_job_queue(app)
    return queue


def create_app(
    settings: Settings,
    *,
    blob_store: BlobStore | None = None,
    job_queue: JobQueue | None = None,
) -> FastAPI:
    """Builds the API. The schema must already be migrated (`server.db.migrate.upgrade`;
    `modelfleet serve` does it at start). `blob_store`/`job_queue` override the ones the
    settings choose (tests, embedding)."""
    engine = make_engine(settings.resolved_database_url)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        close = getattr(_app.state.job_queue, "close", None)
        if close is not None:  # stop the in-process compile worker before the engine goes
            close()
        engine.dispose()

    # FastAPI, plus manifest polls answered from a process cache first (server/api/serving.py).
    app = ServingFastAPI(
        title="ModelFleet",
        version=API_VERSION,
        description="Model releases and over-the-air updates. Write endpoints need a bearer "
        "token with the right scope (`modelfleet tokens create --scope …`).",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.session_factory = make_session_factory(engine)
    app.state.blob_store = blob_store if blob_store is not None else make_blob_store(settings)
    app.state.job_queue = job_queue if job_queue is not None else default_job_queue(app)
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    # Authentication and size caps before any request body is read (server/api/guard.py).
    install_request_guard(app, settings, ROUTERS)
    return app
