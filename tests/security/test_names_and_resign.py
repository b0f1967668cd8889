"""Names are validated by full match (a trailing newline is not a name), a channel never
exists without its first signed manifest, and one broken channel cannot stop the re-sign
loop from refreshing the others before they expire on devices."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from client_sdk.errors import ConfigError
from client_sdk.fsutil import check_name
from server.app import create_app
from server.auth import create_token
from server.blobstore import BlobStoreError, InvalidBlobKeyError, LocalBlobStore, validate_key
from server.db import models as db
from server.db.migrate import upgrade
from server.errors import InvalidInputError
from server.publish.keys import KeyPaths
from server.publish.publisher import Publisher, latest_manifest
from server.publish.resign import resign_due
from server.publish.signer import LocalKeySigner
from server.rollouts import channels
from server.services.registry import check_model_name
from server.services.version_metadata import is_semver
from server.settings import Settings
from tests.support.clock import NOW, Clock
from tests.support.server_keys import init_test_keys

ACTOR = "token:1:test"
FAILED_ACTION = "manifest.resign_failed"  # the audit action operators watch



@pytest.fixture
def keys(tmp_path: Path) -> KeyPaths:
    return init_test_keys(tmp_path / "data", now=NOW)


def _publisher(store: LocalBlobStore, keys: KeyPaths, clock: Clock) -> Publisher:
    return Publisher(blob_store=store, signer=LocalKeySigner(keys.release_key_path),
                     base_url="http://mf.test", lifetime_seconds=86_400, clock=clock,
                     content_keys=None)


def _channels(factory: sessionmaker[Session]) -> list[str]:
    with factory() as s:
        return list(s.scalars(select(db.Channel.name).order_by(db.Channel.name)))


def test_trailing_newline_channel_name_is_422_and_leaves_no_row(
        database_url: str, tmp_path: Path) -> None:
    upgrade(database_url)
    data = tmp_path / "data"
    init_test_keys(data)
    app = create_app(Settings(env="development", data_dir=data, database_url=database_url))
    with TestClient(app) as client:
        with app.state.session_factory() as s:
            _, secret = create_token(s, ["rollout", "publish"], name="ops")
            s.commit()
        auth = {"Authorization": f"Bearer {secret}"}
        r = client.post("/v1/channels", json={"name": "prod\n"}, headers=auth)
        assert r.status_code == 422, r.text
        assert r.json()["field"] == "name"
        r = client.post("/v1/models", json={"name": "mobilenet\n"}, headers=auth)
        assert r.status_code == 422, r.text
        assert client.get("/v1/channels/prod%0A/manifest").status_code == 404
        with app.state.session_factory() as s:
            assert s.scalars(select(db.Channel)).all() == []
            assert s.scalars(select(db.Model)).all() == []
        assert client.post("/v1/channels", json={"name": "prod"}, headers=auth).status_code == 201


def test_trailing_newline_is_refused_by_every_name_validator() -> None:
    with pytest.raises(InvalidInputError):
        check_model_name("mobilenet\n")
    with pytest.raises(InvalidBlobKeyError):
        validate_key("manifests/prod\n/1.json")
    with pytest.raises(InvalidBlobKeyError):
        validate_key("artifacts/abc\n")
    assert not is_semver("1.0.0\n")
    with pytest.raises(ConfigError):
        check_name("model", "mobilenet\n")
    assert channels.CHANNEL_NAME.fullmatch("prod\n") is None
    # and the names themselves still pass
    assert check_model_name("mobilenet") == "mobilenet" and is_semver("1.0.0")
    assert check_name("model", "mobilenet") == "mobilenet"


def test_channel_whose_first_manifest_cannot_be_stored_leaves_no_row(
        factory: sessionmaker[Session], keys: KeyPaths, tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    shutil.rmtree(tmp_path / "blobs" / "objects")  # every put now fails (disk gone, say)
    (tmp_path / "blobs" / "objects").write_text("a file where the objects should be")
    pub = _publisher(store, keys, Clock())
    with pytest.raises(BlobStoreError):
        channels.create_channel(factory, pub, "prod", actor=ACTOR)
    assert _channels(factory) == []
    with factory() as s:
        assert s.scalars(select(db.AuditEvent)).all() == []


def test_corrupt_channel_does_not_stop_the_others_being_re_signed(
        factory: sessionmaker[Session], keys: KeyPaths, tmp_path: Path) -> None:
    clock = Clock()
    pub = _publisher(LocalBlobStore(tmp_path / "blobs"), keys, clock)
    for name in ("alpha", "beta", "gamma"):
        channels.create_channel(factory, pub, name, actor=ACTOR)
    with factory() as s:  # the row an earlier bug left behind: a name no manifest may carry
        s.execute(update(db.Channel).where(db.Channel.name == "alpha").values(name="alpha\n"))
        s.commit()
    clock.now = NOW + 13 * 3600  # every channel is now within half its lifetime of expiry

    published = resign_due(factory, pub)

    assert sorted((p.channel, p.serial) for p in published) == [("beta", 2), ("gamma", 2)]
    with factory() as s:
        for name in ("beta", "gamma"):
            ch = s.scalars(select(db.Channel).where(db.Channel.name == name)).one()
            latest = latest_manifest(s, ch.id)
            assert latest is not None and latest.expires == clock.now + 86_400
        failures = s.scalars(select(db.AuditEvent)
                             .where(db.AuditEvent.action == FAILED_ACTION)).all()
    assert [f.target for f in failures] == ["channel:alpha\n"]
    assert failures[0].details["error"]

    clock.now += 60  # the loop's next pass: still failing, audited once, others not due
    assert resign_due(factory, pub) == []
    with factory() as s:
        assert len(s.scalars(select(db.AuditEvent)
                             .where(db.AuditEvent.action == FAILED_ACTION)).all()) == 1


def test_trailing_newline_cannot_slip_past_any_regex_in_the_source() -> None:
    """`re.match`/`.match` with a `$` anchor accepts "name\\n"; validators use fullmatch.
    Flags every `.match(`/`.search(` on a module-level compiled pattern (UPPER_CASE name)
    and every `re.match`/`re.search` call in the server, the SDK and the contract."""
    import ast

    repo = Path(__file__).resolve().parents[2]
    bad = []
    for package in ("server", "client_sdk", "manifests", "modelfleet"):
        for path in sorted((repo / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in ("match", "search")
                        and isinstance(node.func.value, ast.Name)):
                    continue
                owner = node.func.value.id
                if owner == "re" or owner.lstrip("_").isupper():
                    bad.append(f"{path.relative_to(repo)}:{node.lineno}: {owner}.{node.func.attr}")
    assert bad == [], "use fullmatch for validation:\n" + "\n".join(bad)
