"""The dashboard's files over HTTP: every one served with the strict Content-Security-Policy,
the right media type and nosniff; names outside the shipped set are 404s; the scripts never
turn data into markup (no innerHTML & co.) and never put the token in a URL; the wheel ships
the files."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from server.api.ui import CONTENT_SECURITY_POLICY, FILES
from tests.support.inprocess_app import inprocess_app

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "server" / "ui" / "static"


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    with inprocess_app(tmp_path_factory.mktemp("ui")) as c:
        yield c


def test_every_dashboard_file_is_served_with_a_strict_csp(client: TestClient) -> None:
    assert {"index.html", "app.js", "app.css", "charts.js", "dom.js", "api.js"} <= set(FILES)
    for name in ["", *FILES]:
        r = client.get(f"/ui/{name}")
        assert r.status_code == 200, name
        csp = r.headers["content-security-policy"]
        assert csp == CONTENT_SECURITY_POLICY
        directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
        assert directives["script-src"] == "'self'"  # no inline script, no eval
        assert directives["default-src"] == "'none'"
        assert directives["frame-ancestors"] == "'none'"
        assert r.headers["x-content-type-options"] == "nosniff"
    assert client.get("/ui/").headers["content-type"] == "text/html; charset=utf-8"
    assert client.get("/ui/app.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/ui/app.css").headers["content-type"].startswith("text/css")


def test_page_has_no_inline_script_and_loads_only_same_origin_files(client: TestClient) -> None:
    page = client.get("/ui/").text
    assert re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page) is None  # every script has a src
    assert re.search(r"\son[a-z]+=", page) is None  # no inline event handlers
    for url in re.findall(r'(?:src|href)="([^"#]+)"', page):
        assert url.startswith("/"), url  # nothing from a CDN
        assert client.get(url).status_code == 200, url


@pytest.mark.parametrize("name", ["missing.js", "..%2Fapi%2Fui.py", "__init__.py",
                                  "%2Fetc%2Fpasswd"])
def test_path_traversal_to_files_outside_the_dashboard_is_404(client: TestClient,
                                                              name: str) -> None:
    r = client.get(f"/ui/{name}")
    assert r.status_code == 404
    assert "import" not in r.text


def test_stored_xss_sinks_are_absent_from_the_dashboard_scripts() -> None:
    """Data reaches the page only as text nodes (server/ui/static/dom.js); a model name or an
    audit reason can never be parsed as HTML. The browser test shows it for real."""
    sinks = re.compile(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|"
                       r"new Function|createContextualFragment|DOMParser")
    for script in STATIC.glob("*.js"):
        text = script.read_text()
        assert not sinks.search(text), f"{script.name}: {sinks.search(text)}"


def test_token_leak_via_url_is_impossible_the_token_goes_only_in_the_header() -> None:
    api = (STATIC / "api.js").read_text()
    assert "sessionStorage" in api and "localStorage" not in api
    assert "Authorization = `Bearer ${secret}`" in api
    for script in STATIC.glob("*.js"):
        text = script.read_text()
        assert not re.search(r"[?&]token=|access_token", text), script.name


def test_the_wheel_ships_the_dashboard_files() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["server.ui"]
    shipped = {p.name for pattern in patterns for p in (ROOT / "server" / "ui").glob(pattern)}
    assert shipped == set(FILES) == {p.name for p in STATIC.iterdir()}
