"""`GET /v1/channels/{channel}/manifest`, the one poll route over the process's manifest
cache (server/publish/manifest_cache.py): the stored bytes, a strong ETag and 304, 404 for
unknown channels, a manifest published elsewhere within the cache time and one published
here at once, the stale entry served while one slow reload runs, polls in /metrics, the
app's error bodies and OpenAPI operation for the (Starlette) route, and `modelfleet serve`
writing no access line for them unless `--log-polls`."""

from __future__ import annotations

import hashlib
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from server.app import create_app
from server.auth import create_token
from server.blobstore import LocalBlobStore
from server.db import models as db
from server.db.migrate import upgrade
from server.db.session import make_engine, make_session_factory
from server.publish.keys import KeyPaths
from server.publish.manifest_cache import MANIFEST_CACHE_SECONDS
from server.rollouts import channels
from server.rollouts import service as ro
from server.settings import Settings
from server.wiring import make_publisher
from tests.publish.conftest import version_maker
from tests.support.metrics import sample
from tests.support.rollouts import start_rollout
from tests.support.server_keys import init_test_keys

MANIFEST = "/v1/channels/prod/manifest"
REPO = Path(__file__).resolve().parents[2]


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
    the blob store, so a server's cache learns of it only by reloading."""
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
            channels.create_channel(factory, pub, "prod", actor="test")
        start_rollout(factory, pub, "prod", ro.RolloutSpec(model, version, 50), actor="test")
    finally:
        engine.dispose()


def test_polls_get_the_stored_bytes_a_strong_etag_and_304(settings: Settings) -> None:
    publish_prod(settings, "1.0")
    with TestClient(create_app(settings)) as c:
        first, second = c.get(MANIFEST), c.get(MANIFEST)  # a miss, then from the cache
        assert first.status_code == second.status_code == 200
        assert first.content == second.content
        etag = second.headers["etag"]
        assert etag == f'"{hashlib.sha256(second.content).hexdigest()}"'
        assert second.headers["cache-control"] == "public, max-age=60, must-revalidate"
        assert second.headers["content-type"] == "application/json"
        for inm in (etag, f"W/{etag}", f'"nope", {etag}', "*"):
            r = c.get(MANIFEST, headers={"If-None-Match": inm})
            assert (r.status_code, r.content, r.headers["etag"]) == (304, b"", etag), inm
        r = c.get(MANIFEST, headers={"If-None-Match": '"0000"'})
        assert r.status_code == 200 and r.content == first.content
        head = c.head(MANIFEST)
        assert head.status_code == 200 and head.content == b"" and head.headers["etag"] == etag


def test_unknown_and_odd_channels_get_404(settings: Settings) -> None:
    publish_prod(settings, "1.0")
    with TestClient(create_app(settings)) as c:
        for path in ("/v1/channels/nope/manifest", "/v1/channels/PROD/manifest",
                     "/v1/channels/a/b/manifest", "/v1/channels//manifest"):
            assert c.get(path).status_code == 404, path
        assert c.get("/v1/channels/pr%6Fd/manifest").status_code == 200  # decoded: prod


def test_a_manifest_published_elsewhere_is_served_within_the_cache_time(
        settings: Settings) -> None:
    publish_prod(settings, "1.0")
    with TestClient(create_app(settings)) as c:
        old = c.get(MANIFEST).headers["etag"]
        publish_prod(settings, "2.0")
        published = time.monotonic()
        while (new := c.get(MANIFEST).headers["etag"]) == old:
            assert time.monotonic() - published < MANIFEST_CACHE_SECONDS + 1.0, "stale"
            time.sleep(0.05)
        r = c.get(MANIFEST, headers={"If-None-Match": old})
        assert r.status_code == 200 and r.headers["etag"] == new


def test_a_rollout_change_through_this_server_is_served_at_once(settings: Settings) -> None:
    publish_prod(settings, "1.0")
    with TestClient(create_app(settings)) as c:
        old = c.get(MANIFEST).headers["etag"]
        factory = c.app.state.session_factory  # type: ignore[attr-defined]
        with factory() as s:
            _, secret = create_token(s, ["rollout"], name="ops")
            s.commit()
        version_maker(factory, LocalBlobStore(settings.resolved_blob_dir))(
            "clf", "3.0", platforms=("android",))
        r = c.post("/v1/channels/prod/rollouts", headers={"Authorization": f"Bearer {secret}"},
                   json={"model": "clf", "version": "3.0", "percentage": 5})
        assert r.status_code == 201, r.text
        assert c.get(MANIFEST).headers["etag"] != old  # no wait: invalidated


def test_during_a_slow_reload_the_stale_entry_is_served_and_one_reload_runs(
        settings: Settings) -> None:
    publish_prod(settings, "1.0")
    with TestClient(create_app(settings)) as c:
        etag = c.get(MANIFEST).headers["etag"]  # the miss fills the cache
        cache = c.app.state.services.manifest_cache  # type: ignore[attr-defined]
        load = cache.loader
        reloading, release, reloaded = threading.Event(), threading.Event(), threading.Event()

        def slow_load(channel: str) -> tuple[bytes, str]:
            reloading.set()
            release.wait(10)  # a reload that takes as long as the test needs
            try:
                result: tuple[bytes, str] = load(channel)
                return result
            finally:
                reloaded.set()

        cache.loader = slow_load
        cache.ttl = 0.05
        time.sleep(0.1)  # the entry is now older than the cache time
        statuses = [c.get(MANIFEST, headers={"If-None-Match": etag}).status_code
                    for _ in range(20)]
        assert reloading.wait(5), "no reload started"
        assert statuses == [304] * 20 and cache.stats.reloads == 1
        cache.ttl = 30.0
        release.set()
        assert reloaded.wait(5)
        time.sleep(0.05)  # the reload's result is stored on the event loop
        r = c.get(MANIFEST)
        assert r.status_code == 200 and r.headers["etag"] == etag and cache.stats.reloads == 1


def test_polls_are_counted_in_metrics_with_their_304s(settings: Settings) -> None:
    publish_prod(settings, "1.0")
    with TestClient(create_app(settings)) as c:
        etag = c.get(MANIFEST).headers["etag"]
        before = c.get("/metrics").text
        for _ in range(3):
            assert c.get(MANIFEST, headers={"If-None-Match": etag}).status_code == 304
        assert c.get(MANIFEST).status_code == 200
        after = c.get("/metrics").text

    def delta(status: str) -> float:
        labels = {"method": "GET", "route": "/v1/channels/{channel}/manifest",
                  "status": status}
        return (sample(after, "modelfleet_http_requests_total", **labels)
                - sample(before, "modelfleet_http_requests_total", **labels))

    assert (delta("304"), delta("200")) == (3, 1)


def test_poll_errors_have_the_apps_one_error_body_and_request_id(settings: Settings) -> None:
    """The poll is a plain Starlette route (server/api/serving.py), ahead of FastAPI's
    routing: its refusals and failures still go through the app's exception handlers and
    the one renderer (server/api/errors.py), inside the request observer."""
    publish_prod(settings, "1.0")
    shape = {"detail", "code", "field", "fix", "errors"}
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        before = c.get("/metrics").text  # the counters are the process's
        r = c.get("/v1/channels/nope/manifest", headers={"X-Request-Id": "poll-404"})
        assert (r.status_code, r.headers["content-type"]) == (404, "application/json")
        assert set(r.json()) == shape and r.json()["code"] == "channel_not_found"
        assert r.headers["x-request-id"] == "poll-404"
        for method in ("POST", "PUT", "DELETE"):
            r = c.request(method, MANIFEST, content=b"{}",
                          headers={"Content-Type": "application/json"})
            assert r.status_code == 405, (method, r.text)
            assert set(r.json()) == shape and r.json()["code"] == "http_405"
            assert set(r.headers["allow"].split(", ")) == {"GET", "HEAD"}
        cache = c.app.state.services.manifest_cache  # type: ignore[attr-defined]

        def broken(channel: str) -> tuple[bytes, str]:
            raise RuntimeError("a bug in the loader")

        cache.loader = broken
        cache.invalidate("prod")
        r = c.get(MANIFEST, headers={"X-Request-Id": "poll-500"})
        assert r.status_code == 500 and r.json()["code"] == "internal_error"
        assert set(r.json()) == shape and "a bug" not in r.text
        # The body says "report it with the X-Request-Id of the response": it must be there.
        assert r.headers["x-request-id"] == "poll-500"
        after = c.get("/metrics").text

    def counted(method: str, status: str) -> float:
        labels = {"method": method, "route": "/v1/channels/{channel}/manifest",
                  "status": status}
        return (sample(after, "modelfleet_http_requests_total", **labels)
                - sample(before, "modelfleet_http_requests_total", **labels))

    assert (counted("GET", "404"), counted("GET", "500"), counted("DELETE", "405")) == (1, 1, 1)


def test_the_poll_is_documented_in_the_openapi_spec(settings: Settings) -> None:
    """FastAPI documents its own routes only; the poll's operation is added where FastAPI
    put it (server/api/serving.py `document_poll_routes`), every status it answers."""
    publish_prod(settings, "1.0")
    with TestClient(create_app(settings)) as c:
        spec = c.get("/openapi.json").json()
        again = c.get("/openapi.json").json()
    assert spec == again  # the hook does not grow the spec per call
    item = spec["paths"]["/v1/channels/{channel}/manifest"]
    assert set(item) == {"get"}
    op = item["get"]
    assert op["tags"] == ["serving"] and op["description"].startswith("The channel's current")
    assert [(p["name"], p["in"], p["required"]) for p in op["parameters"]] == [
        ("channel", "path", True)]
    assert set(op["responses"]) == {"200", "304", "404"}
    ref = op["responses"]["404"]["content"]["application/json"]["schema"]["$ref"]
    assert ref.rsplit("/", 1)[1] in spec["components"]["schemas"]
    operation_ids = [o["operationId"] for path in spec["paths"].values() for o in path.values()]
    assert len(operation_ids) == len(set(operation_ids))


def test_workers_starting_together_import_the_roots_once_without_failing(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another worker stores the same root between this one's read and its insert: the
    unique constraint fires, and the retry finds and checks the stored root."""
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


def serve_cli_log(data: Path, *extra: str) -> str:
    """Runs `modelfleet serve` as a user would, polls twice and fetches /v1/root; its log."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "modelfleet", "serve", "--data-dir", str(data),
         "--port", str(port), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(base + "/v1/root", timeout=2).read()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "serve did not start"
                time.sleep(0.2)
        for _ in range(2):
            urllib.request.urlopen(base + MANIFEST, timeout=5).read()
        assert urllib.request.urlopen(base + "/metrics", timeout=5).status == 200
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    return out


def test_modelfleet_serve_writes_no_access_line_for_polls_unless_log_polls(
        settings: Settings) -> None:
    publish_prod(settings, "1.0")
    out = serve_cli_log(settings.data_dir)
    assert '"GET /v1/root HTTP/1.1" 200' in out
    assert f'"GET {MANIFEST} HTTP/1.1"' not in out
    out = serve_cli_log(settings.data_dir, "--log-polls")
    assert out.count(f'"GET {MANIFEST} HTTP/1.1" 200') == 2
