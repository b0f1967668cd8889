"""Manifest polls answered inside uvicorn's HTTP protocol (server/api/fastpoll.py), on a real
uvicorn over a real socket: the same bytes and headers as the ASGI path, strong ETag and 304,
404 for unknown channels, a new manifest within the cache time, pipelining and HTTP/1.0."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient

from server.api.fastpoll import ManifestPollProtocol
from server.app import create_app
from server.auth import create_token
from server.blobstore import LocalBlobStore
from server.db import models as db
from server.db.migrate import upgrade
from server.publish import rollouts as ro
from server.publish.keys import KeyPaths
from server.publish.manifest_cache import MANIFEST_CACHE_SECONDS
from server.settings import Settings
from server.wiring import make_publisher
from tests.publish.conftest import version_maker
from tests.support.server_keys import init_test_keys

MANIFEST = "/v1/channels/prod/manifest"


class CountingApp:
    """ASGI wrapper that counts the requests reaching the app (the protocol finds the
    ServingFastAPI under it through `.app`, as it does under uvicorn's own wrappers)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.calls: list[tuple[str, str]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.calls.append((scope["method"], scope["path"]))
        await self.app(scope, receive, send)


@dataclass
class Running:
    port: int
    app: CountingApp

    def raw(self, request: bytes, *, until_close: bool = False) -> bytes:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(request)
            return read_responses(s, 1) if not until_close else read_all(s)


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name), None)


def parse(raw: bytes) -> tuple[Response, bytes]:
    """One HTTP/1.1 response (Content-Length bodies) off the front of `raw`."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = [(k.strip().lower(), v.strip()) for k, v in
               (line.split(":", 1) for line in lines[1:])]
    length = int(next((v for k, v in headers if k == "content-length"), "0"))
    return Response(int(lines[0].split()[1]), headers, rest[:length]), rest[length:]


def complete(buf: bytes, count: int) -> bool:
    """Whether `buf` holds `count` whole responses (Content-Length bodies)."""
    rest = buf
    for _ in range(count):
        if b"\r\n\r\n" not in rest:
            return False
        response, after = parse(rest)
        if len(response.body) < int(response.header("content-length") or 0):
            return False
        rest = after
    return True


def read_responses(s: socket.socket, count: int) -> bytes:
    buf = b""
    while not complete(buf, count):
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    return buf


def read_all(s: socket.socket) -> bytes:
    buf = b""
    while chunk := s.recv(65536):
        buf += chunk
    return buf


def get(path: str = MANIFEST, *extra: str, version: str = "1.1", method: str = "GET") -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: t", *extra, "", ""]
    return "\r\n".join(lines).encode()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    data = tmp_path / "data"
    init_test_keys(data)
    s = Settings(env="development", data_dir=data, public_base_url="http://t",
                 manifest_lifetime_seconds=86_400)
    upgrade(s.resolved_database_url)
    return s


def publish_prod(settings: Settings, version: str) -> None:
    """A rollout on `prod` made the way another process would: straight to the database and
    the blob store, so this server's cache learns of it only by reloading."""
    from server.db.session import make_engine, make_session_factory

    engine = make_engine(settings.resolved_database_url)
    try:
        factory = make_session_factory(engine)
        store = LocalBlobStore(settings.resolved_blob_dir)
        model = "clf-" + version.replace(".", "-")  # one release per model and channel
        version_maker(factory, store)(model, version, platforms=("android",))
        pub = make_publisher(settings, store)
        with factory() as s:
            exists = s.query(db.Channel).filter_by(name="prod").first() is not None
        if not exists:
            ro.create_channel(factory, pub, "prod", actor="test")
        ro.start_rollout(factory, pub, "prod", ro.RolloutSpec(model, version, 50), actor="test")
    finally:
        engine.dispose()


@contextmanager
def serve(settings: Settings, http: Any = ManifestPollProtocol, **config: Any
          ) -> Iterator[Running]:
    app = CountingApp(create_app(settings))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, http=http,
                                           loop="uvloop", log_level="warning", **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield Running(port, app)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_fresh_polls_skip_the_app_and_get_the_stored_bytes_strong_etag_and_304(settings):
    publish_prod(settings, "1.0")
    with serve(settings) as srv:
        first, _ = parse(srv.raw(get()))  # a miss: the route loads and caches the bytes
        assert first.status == 200 and len(srv.app.calls) == 1
        with TestClient(create_app(settings)) as reference:
            stored = reference.get(MANIFEST)
        second, _ = parse(srv.raw(get()))
        assert len(srv.app.calls) == 1, "the second poll reached the app"
        assert second.body == first.body == stored.content
        etag = second.header("etag")
        assert etag == stored.headers["etag"] and etag.startswith('"') and len(etag) == 66
        assert second.header("cache-control") == "public, max-age=60, must-revalidate"
        assert second.header("content-type") == "application/json"
        for inm in (etag, f"W/{etag}", f'"nope", {etag}', "*"):
            r, _ = parse(srv.raw(get(MANIFEST, f"If-None-Match: {inm}")))
            assert (r.status, r.body, r.header("etag")) == (304, b"", etag), inm
            assert r.header("content-length") is None
        r, _ = parse(srv.raw(get(MANIFEST, 'If-None-Match: "0000"')))
        assert r.status == 200 and r.body == stored.content
        assert len(srv.app.calls) == 1


def test_fast_path_sends_the_same_status_headers_and_bytes_as_the_asgi_path(settings):
    publish_prod(settings, "1.0")
    answers = {}
    for name, http in (("fast", ManifestPollProtocol), ("asgi", "httptools")):
        with serve(settings, http=http) as srv:
            srv.raw(get())  # fill the cache
            calls = len(srv.app.calls)
            answers[name] = [parse(srv.raw(request))[0] for request in (
                get(), get(MANIFEST, f"If-None-Match: {parse(srv.raw(get()))[0].header('etag')}"),
                get(version="1.0"), get(MANIFEST, "Connection: close"))]
            assert (len(srv.app.calls) == calls) == (name == "fast")
    for fast, asgi in zip(answers["fast"], answers["asgi"], strict=True):
        drop_date = [(k, v) for k, v in fast.headers if k != "date"]
        assert drop_date == [(k, v) for k, v in asgi.headers if k != "date"]
        assert (fast.status, fast.body) == (asgi.status, asgi.body)
        assert fast.header("date") and fast.header("server") == "uvicorn"


def test_unknown_and_odd_channels_go_to_the_app_and_get_404(settings):
    publish_prod(settings, "1.0")
    with serve(settings) as srv:
        srv.raw(get())
        for path in ("/v1/channels/nope/manifest", "/v1/channels/PROD/manifest",
                     "/v1/channels/a/b/manifest", "/v1/channels//manifest"):
            r, _ = parse(srv.raw(get(path)))
            assert r.status == 404, path
        # percent-encoded: decoded by uvicorn, so the app serves `prod` (no shortcut taken)
        r, _ = parse(srv.raw(get("/v1/channels/pr%6Fd/manifest")))
        assert r.status == 200 and len(srv.app.calls) == 6


def test_a_manifest_published_elsewhere_is_served_within_the_cache_time(settings):
    publish_prod(settings, "1.0")
    with serve(settings) as srv:
        old = parse(srv.raw(get()))[0].header("etag")
        publish_prod(settings, "2.0")
        published = time.monotonic()
        while (new := parse(srv.raw(get()))[0].header("etag")) == old:
            assert time.monotonic() - published < MANIFEST_CACHE_SECONDS + 1.0, "stale"
            time.sleep(0.05)
        r, _ = parse(srv.raw(get(MANIFEST, f"If-None-Match: {old}")))
        assert r.status == 200 and r.header("etag") == new


def test_a_rollout_change_through_this_server_is_served_at_once(settings):
    publish_prod(settings, "1.0")
    with serve(settings) as srv:
        old = parse(srv.raw(get()))[0].header("etag")
        parse(srv.raw(get()))
        with srv.app.app.state.session_factory() as s:
            _, secret = create_token(s, ["rollout"], name="ops")
            s.commit()
        version_maker(srv.app.app.state.session_factory,
                      LocalBlobStore(settings.resolved_blob_dir))("clf", "3.0",
                                                                  platforms=("android",))
        body = b'{"model": "clf", "version": "3.0", "percentage": 5}'
        r, _ = parse(srv.raw(
            f"POST /v1/channels/prod/rollouts HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer "
            f"{secret}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"\r\n".encode() + body))
        assert r.status == 201, r.body
        assert parse(srv.raw(get()))[0].header("etag") != old  # no wait: invalidated


def test_pipelined_requests_are_answered_in_order_and_http10_closes(settings):
    publish_prod(settings, "1.0")
    with serve(settings) as srv:
        srv.raw(get())
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.sendall(get("/v1/root") + get() + get("/v1/root/1.json") + get())
            rest = read_responses(s, 4)
        statuses = []
        for _ in range(4):
            r, rest = parse(rest)
            statuses.append((r.status, r.header("content-type")))
        assert statuses == [(200, "application/json")] * 4
        raw = srv.raw(get(version="1.0"), until_close=True)  # the server closes the socket
        r, _ = parse(raw)
        assert r.status == 200 and r.header("connection") == "close"


def test_head_and_logged_polls_go_through_the_app(settings):
    publish_prod(settings, "1.0")
    with serve(settings) as srv:
        srv.raw(get())
        r, _ = parse(srv.raw(get(MANIFEST, "Connection: close", method="HEAD"), until_close=True))
        assert r.status == 200 and r.body == b"" and len(srv.app.calls) == 2
    with serve(settings.model_copy(update={"log_polls": True}), access_log=True) as srv:
        srv.raw(get())
        srv.raw(get())
        assert len(srv.app.calls) == 2


def serve_cli_log(data: Path, *extra: str) -> str:
    """Runs `modelfleet serve` as a user would, polls twice and fetches /v1/root; its log."""
    import subprocess
    import sys
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-c", "from modelfleet.cli import main; main()", "serve",
         "--data-dir", str(data), "--port", str(port), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=Path(__file__).resolve().parents[2])
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(base + "/v1/root", timeout=2).read()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "serve did not start"
                time.sleep(0.2)
        for _ in range(2):
            urllib.request.urlopen(base + MANIFEST, timeout=5).read()
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    return out


def test_modelfleet_serve_answers_polls_unlogged_unless_log_polls(settings):
    publish_prod(settings, "1.0")
    out = serve_cli_log(settings.data_dir)
    assert '"GET /v1/root HTTP/1.1" 200' in out
    assert out.count(f'"GET {MANIFEST} HTTP/1.1" 200') == 1  # the miss only; the hit is not
    out = serve_cli_log(settings.data_dir, "--log-polls")
    assert out.count(f'"GET {MANIFEST} HTTP/1.1" 200') == 2


def test_workers_starting_together_import_the_roots_once_without_failing(settings, monkeypatch):
    """Another worker stores the same root between this one's read and its insert: the
    unique constraint fires, and the retry finds and checks the stored root."""
    import hashlib

    from server.publish import rootstore
    from server.services.serving import import_roots
    from server.wiring import key_paths

    real_chain = rootstore.load_root_chain
    app = create_app(settings)
    raced = []

    def chain_after_another_worker(paths: KeyPaths) -> Any:
        chain = list(real_chain(paths))
        if not raced:
            raced.append(True)
            with app.state.session_factory() as other:
                for root, data in chain:
                    other.add(db.RootDocument(version=root.version, data=data,
                                              sha256=hashlib.sha256(data).hexdigest()))
                other.commit()
        return chain

    monkeypatch.setattr(rootstore, "load_root_chain", chain_after_another_worker)
    # nothing left to add: the other worker did
    assert import_roots(app.state.session_factory, key_paths(settings)) == []
    assert raced
    with app.state.session_factory() as s:
        assert rootstore.latest_root_version(s) == 1
    app.state.engine.dispose()


def test_during_a_slow_reload_the_shortcut_serves_the_stale_entry_and_one_reload_runs(settings):
    """The bench's finding: the shortcut answered only entries younger than the cache time,
    so on slow cores every poll during a reload fell through to the ASGI path. Now the stale
    entry is served by the shortcut while ONE reload runs."""
    publish_prod(settings, "1.0")
    with serve(settings) as srv:
        etag = parse(srv.raw(get()))[0].header("etag")  # the miss fills the cache
        cache = srv.app.app.state.services.manifest_cache
        load = cache.loader
        reloading, release, reloaded = threading.Event(), threading.Event(), threading.Event()

        def slow_load(channel: str) -> tuple[bytes, str]:
            reloading.set()
            release.wait(10)  # a reload that takes as long as the test needs
            try:
                return load(channel)
            finally:
                reloaded.set()

        cache.loader = slow_load
        cache.ttl = 0.05
        time.sleep(0.1)  # the entry is now older than the cache time
        calls, before = len(srv.app.calls), cache.stats.shortcut
        answers = [parse(srv.raw(get(MANIFEST, f"If-None-Match: {etag}")))[0].status
                   for _ in range(20)]
        assert reloading.wait(5), "no reload started"
        assert answers == [304] * 20
        assert len(srv.app.calls) == calls, "polls during the reload reached the app"
        assert cache.stats.shortcut - before == 20 and cache.stats.reloads == 1
        cache.ttl = 30.0
        release.set()
        assert reloaded.wait(5)
        time.sleep(0.05)  # the reload's result is stored on the event loop's executor thread
        r, _ = parse(srv.raw(get()))
        assert r.status == 200 and r.header("etag") == etag and cache.stats.reloads == 1
        assert len(srv.app.calls) == calls


def test_polls_answered_by_the_shortcut_show_in_metrics_with_their_304_share(settings):
    from tests.support.metrics import sample

    publish_prod(settings, "1.0")
    with serve(settings) as srv:
        first, _ = parse(srv.raw(get()))  # the miss: the route answers and fills the cache
        before, _ = parse(srv.raw(get("/metrics")))
        etag = first.header("etag")
        for _ in range(3):
            r, _ = parse(srv.raw(get(MANIFEST, f"If-None-Match: {etag}")))
            assert r.status == 304
        r, _ = parse(srv.raw(get()))
        assert r.status == 200
        after, _ = parse(srv.raw(get("/metrics")))
        assert len(srv.app.calls) == 3  # the miss and two scrapes; no poll reached the app

    def delta(**labels: str) -> float:
        name = "modelfleet_manifest_polls_total"
        return (sample(after.body.decode(), name, **labels)
                - sample(before.body.decode(), name, **labels))

    assert sample(before.body.decode(), "modelfleet_manifest_polls_total", path="route",
                  status="200") >= 1
    assert delta(path="shortcut", status="304") == 3
    assert delta(path="shortcut", status="200") == 1
