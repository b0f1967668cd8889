"""GET /metrics: Prometheus text with request, job, telemetry and halt counters; the optional
metrics token; manifest polls counted like any request."""

from __future__ import annotations

from fastapi.testclient import TestClient

from server.app import create_app
from server.jobs.interface import NullJobQueue
from server.observability import metrics
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


def test_manifest_polls_are_counted_under_their_route_like_any_request(
        client: TestClient) -> None:
    before = scrape(client)
    for _ in range(3):
        assert client.get("/v1/channels/nowhere/manifest").status_code == 404
    after = scrape(client)
    route = "/v1/channels/{channel}/manifest"
    assert (sample(after, "modelfleet_http_requests_total", method="GET", route=route,
                   status="404")
            - sample(before, "modelfleet_http_requests_total", method="GET", route=route,
                     status="404")) == 3
    assert "modelfleet_manifest_polls" not in after  # one counter for every request


def test_telemetry_counts_split_accepted_from_duplicates() -> None:
    before = metrics.render().decode()
    metrics.count_telemetry(7, 2)
    metrics.count_telemetry(0, 0)
    after = metrics.render().decode()
    name = "modelfleet_telemetry_reports_total"
    assert sample(after, name, result="accepted") - sample(before, name, result="accepted") == 7
    assert (sample(after, name, result="duplicate")
            - sample(before, name, result="duplicate")) == 2
