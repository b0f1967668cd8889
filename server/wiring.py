"""The composition root: settings → the services a process runs on. The only module that
knows how the server's parts fit together; `create_app`, `modelfleet worker` and every CLI
command build their objects here, and nothing else constructs them.

- `build_core(settings)`: database engine and session factory, blob store, publisher — what
  every process needs (CLI commands use this alone).
- `build_services(settings)`: the API process — core plus manifest cache (subscribed to the
  publisher's "published" event), job queue (chosen by `settings.job_backend`; a rollout
  start asks it for delta patches) and the fleet (telemetry, the rollouts' guard and ramp).
- `build_worker(settings)`: a `modelfleet worker` process — core plus the build and patch
  runners its procrastinate tasks hand jobs to.
"""

from __future__ import annotations

import functools
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from server import crashpoints
from server.blobstore import BlobStore, make_blob_store
from server.compile.sandbox import Builder, SandboxPolicy, pipeline_factory
from server.db.session import make_engine, make_session_factory
from server.jobs.inprocess import InProcessJobQueue
from server.jobs.interface import JobQueue
from server.jobs.patch_runner import PatchRunner
from server.jobs.runner import BuildRunner
from server.publish.keys import KeyPaths
from server.publish.manifest_cache import ManifestCache
from server.publish.protection import (
    KEK_FILE,
    WATERMARK_KEY_FILE,
    ContentKeys,
    WatermarkSecret,
)
from server.publish.publisher import PublishedManifest, Publisher
from server.publish.signer import LocalKeySigner
from server.rollouts.guard import FleetGuard
from server.rollouts.ramp import RampTicker
from server.services.fleet.content_keys import KeyGrants
from server.services.fleet.groupcommit import GroupCommitter
from server.services.fleet.ingest import TelemetryIngest
from server.services.fleet.service import Fleet, libpq_dsn
from server.services.serving import current_manifest
from server.settings import Settings


def key_paths(settings: Settings) -> KeyPaths:
    """Keys under DATA_DIR/keys unless `keys_dir` (MODELFLEET_KEYS_DIR) says else."""
    return KeyPaths.for_data_dir(settings.data_dir, settings.keys_dir)


def manifest_base_url(settings: Settings) -> str:
    """MODELFLEET_PUBLIC_BASE_URL when it was set; else "" — manifests then carry URLs
    relative to the server's base URL, which devices resolve against the URL they use. The
    setting's built-in default names one host and port, and would send devices elsewhere
    whenever the server runs on another one."""
    return settings.public_base_url if "public_base_url" in settings.model_fields_set else ""


def unix_time() -> int:
    """The publisher's clock: wall-clock Unix seconds (tests inject their own)."""
    return int(time.time())


def make_publisher(settings: Settings, blob_store: BlobStore) -> Publisher:
    """The publisher for this server, signing through a `LocalKeySigner`: the release key is
    read at each publish, so a rotated key (`modelfleet keys rotate --rotate-release`) takes
    effect without a restart, and a process that never publishes never reads it — which is
    why every process can hold one, made here, and none is made lazily."""
    return Publisher(blob_store=blob_store,
                     signer=LocalKeySigner(key_paths(settings).release_key_path),
                     base_url=manifest_base_url(settings),
                     lifetime_seconds=settings.manifest_lifetime_seconds, clock=unix_time,
                     content_keys=content_keys(settings))


@dataclass
class Core:
    """What every process needs."""

    settings: Settings
    engine: Engine
    session_factory: sessionmaker[Session]
    blob_store: BlobStore
    publisher: Publisher

    def close(self) -> None:
        self.engine.dispose()


def content_keys(settings: Settings) -> ContentKeys:
    """Protected versions' content keys, wrapped under KEYS_DIR/content.kek."""
    return ContentKeys(key_paths(settings).keys_dir / KEK_FILE)


def watermark_secret(settings: Settings) -> WatermarkSecret:
    """The watermark secret, KEYS_DIR/watermark.key (created on first use)."""
    return WatermarkSecret(key_paths(settings).keys_dir / WATERMARK_KEY_FILE)


def build_core(settings: Settings, *, blob_store: BlobStore | None = None) -> Core:
    crashpoints.arm(settings.crash_at)  # a no-op unless a crash test set MODELFLEET_CRASH_AT
    engine = make_engine(settings.resolved_database_url)
    store = blob_store if blob_store is not None else make_blob_store(settings)
    return Core(settings, engine, make_session_factory(engine), store,
                make_publisher(settings, store))


@contextmanager
def core(settings: Settings) -> Iterator[Core]:
    """`build_core` for a CLI command: the engine is disposed at the end."""
    made = build_core(settings)
    try:
        yield made
    finally:
        made.close()


@dataclass
class Services(Core):
    """The API process: `create_app` keeps this on `app.state.services`; routes get its
    parts through server/api/deps.py."""

    manifest_cache: ManifestCache
    job_queue: JobQueue  # builds, and the delta patches a rollout start asks for
    fleet: Fleet  # device telemetry, the rollouts' guard and ramp tick it feeds

    def close(self) -> None:
        close = getattr(self.job_queue, "close", None)
        if callable(close):  # stop the in-process worker before the engine goes
            close()
        super().close()


def build_services(settings: Settings, *, blob_store: BlobStore | None = None,
                   job_queue: JobQueue | None = None) -> Services:
    """`blob_store` / `job_queue` override the ones the settings choose (tests, embedding)."""
    base = build_core(settings, blob_store=blob_store)
    cache = ManifestCache(functools.partial(current_manifest, base.session_factory,
                                            base.blob_store))

    def drop_cached(published: PublishedManifest) -> None:
        cache.invalidate(published.channel)

    base.publisher.subscribe(drop_cached)
    queue = job_queue if job_queue is not None else make_job_queue(base)
    return Services(base.settings, base.engine, base.session_factory, base.blob_store,
                    base.publisher, cache, queue,
                    make_fleet(base.settings, base.session_factory, base.publisher))


def make_fleet(settings: Settings, factory: sessionmaker[Session],
               publisher: Publisher) -> Fleet:
    """Telemetry ingestion (group commit on PostgreSQL when enabled), the guard that halts
    and promotes from it (POSTing halts to MODELFLEET_HALT_WEBHOOK_URL), the ramp tick, and
    content-key grants when the publisher holds content keys."""
    ingest = TelemetryIngest(factory, rate_per_s=settings.telemetry_rate_per_second,
                             burst=settings.telemetry_burst,
                             max_skew_s=settings.telemetry_max_skew_seconds)
    publisher.subscribe(lambda _published: ingest.forget())
    guard = FleetGuard(factory, publisher, webhook_url=settings.halt_webhook_url)
    dsn = libpq_dsn(settings.resolved_database_url) if settings.telemetry_group_commit else None
    grants = None if publisher.content_keys is None else KeyGrants(
        factory, ingest.keys, publisher.content_keys,
        max_skew_s=settings.telemetry_max_skew_seconds)
    return Fleet(ingest, guard, RampTicker(factory, publisher),
                 GroupCommitter(dsn) if dsn is not None else None, key_grants=grants)


def make_job_queue(base: Core) -> JobQueue:
    """inprocess (embedded default): a worker thread in the API process, started here.
    procrastinate (production): the API only defers jobs; `modelfleet worker` runs them."""
    if base.settings.job_backend == "procrastinate":
        from server.jobs.procrastinate_queue import ProcrastinateJobQueue, queued_build_ids

        return ProcrastinateJobQueue(base.settings.resolved_database_url,
                                     queued_build_ids(base.session_factory),
                                     base.session_factory)
    worker_id = InProcessJobQueue.worker_name()
    runner = BuildRunner(base.session_factory, base.blob_store, worker_id=worker_id,
                         pipeline_factory=sandboxed_builds(base.settings),
                         content_keys=base.publisher.content_keys,
                         watermark=watermark_secret(base.settings))
    patches = PatchRunner(base.session_factory, base.publisher, worker_id=worker_id)
    queue = InProcessJobQueue(runner, patches)
    queue.start()  # picks up builds left queued or abandoned by an earlier process
    return queue


@dataclass
class Worker:
    """A `modelfleet worker` process: the runners its procrastinate tasks call (None for the
    kind of job its role does not run)."""

    core: Core
    runner: BuildRunner | None
    patch_runner: PatchRunner | None


WORKER_ROLES = ("all", "compile", "publish")


def worker_id(role: str = "all") -> str:
    return f"worker:{role}:{socket.gethostname()}:{os.getpid()}"


def sandboxed_builds(settings: Settings) -> Callable[[Callable[[str], None]], Builder]:
    """Every build of this deployment runs in the compile sandbox with its limits, hiding its
    data, keys and blob directories (`MODELFLEET_SANDBOX=off`: in-process, development)."""
    hidden = [settings.data_dir, settings.resolved_blob_dir, key_paths(settings).keys_dir]
    return pipeline_factory(SandboxPolicy.from_settings(settings, hidden=hidden))


def build_worker(settings: Settings, *, heartbeat_s: float = 10.0,
                 stalled_after_s: float = 30.0, role: str = "all") -> Worker:
    """`role` splits the trust: "compile" runs sandboxed builds only and never takes a job
    that signs (give it no key mount), "publish" runs delta-patch jobs and re-signing (needs
    the release key), "all" both (one machine)."""
    if role not in WORKER_ROLES:
        raise ValueError(f"unknown worker role {role!r}; use one of {', '.join(WORKER_ROLES)}")
    base = build_core(settings)
    name = worker_id(role)
    runner = BuildRunner(base.session_factory, base.blob_store, worker_id=name,
                         heartbeat_s=heartbeat_s, stale_after_s=stalled_after_s,
                         pipeline_factory=sandboxed_builds(settings),
                         content_keys=base.publisher.content_keys,
                         watermark=watermark_secret(base.settings)) \
        if role in ("all", "compile") else None
    patches = PatchRunner(base.session_factory, base.publisher, worker_id=name,
                          heartbeat_s=heartbeat_s, stale_after_s=stalled_after_s) \
        if role in ("all", "publish") else None
    return Worker(base, runner, patches)
