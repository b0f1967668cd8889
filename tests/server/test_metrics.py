"""GET /metrics: Prometheus text with request, job, telemetry and halt counters; the optional
metrics token; the poll counters' flush."""

from __future__ import annotations

from fastapi.testclient import TestClient

from server.app import create_app
from server.jobs.interface import NullJobQueue
from server.observability import metrics
from server.publish.manifest_cache import PollStats
from server.settings import Settings
from tests.support.metrics import sample


def scrape(client: TestClient, **headers: str) -> str:
    r = client.get("/metrics", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=")
    return r.text


def test_requests_are_counted_by_route_template_and_status(client: TestClient) -> None:
    before = scrape(client)
    client.get("/healthz")
    client.get("/healthz")
    assert client.get("/v1/models/no-such-model").status_code == 404
    assert client.get("/nowhere/at/all").status_code == 404
    after = scrape(client)

    def delta(**labels: str) -> float:
        return (sample(after, "modelfleet_http_requests_total", **labels)
                - sample(before, "modelfleet_http_requests_total", **labels))

    assert delta(method="GET", route="/healthz", status="200") == 2
    # The template, never the raw path (one time series per route, not per model name)…
    assert delta(method="GET", route="/v1/models/{name}", status="404") == 1
    assert "no-such-model" not in after
    # …and unrouted paths share one label value.
    assert delta(method="GET", route="unmatched", status="404") == 1
    assert "/nowhere" not in after


def test_a_client_cannot_mint_method_label_values(client: TestClient) -> None:
    client.request("BREW", "/healthz")
    text = scrape(client)
    assert 'method="BREW"' not in text
    assert sample(text, "modelfleet_http_requests_total", method="other", route="/healthz") >= 1


def test_metrics_need_no_token_by_default_and_the_token_when_one_is_set(
        settings: Settings) -> None:
    with TestClient(create_app(settings, job_queue=NullJobQueue())) as open_client:
        scrape(open_client)
    guarded = settings.model_copy(update={"metrics_token": "scrape-secret-0123456789"})
    with TestClient(create_app(guarded, job_queue=NullJobQueue())) as c:
        assert c.get("/metrics").status_code == 401
        r = c.get("/metrics", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401 and "MODELFLEET_METRICS_TOKEN" in r.json()["fix"]
        scrape(c, Authorization="Bearer scrape-secret-0123456789")


def test_poll_flusher_moves_each_count_into_the_counter_once() -> None:
    stats = PollStats()
    flusher = metrics.PollFlusher(stats)
    child = metrics.MANIFEST_POLLS.labels("shortcut", "304")
    ok = metrics.MANIFEST_POLLS.labels("shortcut", "200")
    start_304, start_200 = child._value.get(), ok._value.get()
    stats.shortcut, stats.shortcut_304 = 5, 3
    flusher.flush()
    flusher.flush()  # nothing new: nothing added twice
    assert child._value.get() - start_304 == 3
    assert ok._value.get() - start_200 == 2
    stats.shortcut, stats.shortcut_304 = 6, 4
    flusher.flush()
    assert child._value.get() - start_304 == 4 and ok._value.get() - start_200 == 2


def test_telemetry_counts_split_accepted_from_duplicates() -> None:
    before = metrics.render().decode()
    metrics.count_telemetry(7, 2)
    metrics.count_telemetry(0, 0)
    after = metrics.render().decode()
    name = "modelfleet_telemetry_reports_total"
    assert sample(after, name, result="accepted") - sample(before, name, result="accepted") == 7
    assert (sample(after, name, result="duplicate")
            - sample(before, name, result="duplicate")) == 2
