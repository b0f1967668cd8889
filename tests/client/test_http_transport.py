"""UrllibTransport over real loopback HTTP: full cycle through 302-to-presigned blobs, ETag/304,
Range resume, refused schemes, unreachable servers."""

from __future__ import annotations

import random

import pytest

from client_sdk import FetchError, Outcome, UrllibTransport
from tests.client.http_repo import serve


def test_update_over_http_with_redirects_etag_and_range(make_updater, sim, v1, v2):
    sim.publish("clf", [sim.release("1.0", [sim.artifact(v1)])])
    with serve(sim, redirect_blobs=True) as base:
        up = make_updater(base_url=base, transport=UrllibTransport())
        assert up.check_once().outcome is Outcome.UPDATED
        sim.fetches.clear()
        assert up.check_once().outcome is Outcome.UP_TO_DATE
        assert [f.status for f in sim.fetched("/v1/channels/")] == [304]

        art = sim.artifact(v2)
        cut = random.Random(3).randrange(1, art.length)
        sim.faults.cut_after["/" + art.url] = cut
        sim.publish("clf", [sim.release("2.0", [art])])
        assert up.check_once().models[0].error == "FetchError"
        del sim.faults.cut_after["/" + art.url]
        sim.fetches.clear()
        assert up.check_once().outcome is Outcome.UPDATED
        (blob,) = sim.fetched("/" + art.url)
        assert blob.headers["Range"] == f"bytes={cut}-" and blob.status == 206


def test_file_urls_are_refused():
    with pytest.raises(FetchError, match="non-HTTP"):
        UrllibTransport().fetch("file:///etc/passwd", {}, 1.0)


def test_unreachable_server_is_a_fetch_error():
    with pytest.raises(FetchError, match="cannot reach"):
        UrllibTransport().fetch("http://127.0.0.1:9/nothing", {}, 1.0)
