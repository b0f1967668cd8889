"""An in-memory update repository: a ``Transport`` that signs on fetch and records every fetch.

Like python-tuf's RepositorySimulator: tests change the repository (publish releases, rotate
roots, tamper with bytes, cut or slow connections) and the SDK fetches through this object as
it would over HTTP — ETag/304, Range/206/416 and 404 included.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import manifests
from client_sdk.errors import FetchError
from client_sdk.transport import Response
from manifests import (
    MANIFEST_PAYLOAD_TYPE,
    Artifact,
    Filters,
    Manifest,
    ModelEntry,
    Patch,
    Release,
    Rollout,
    Root,
    SigningKey,
)
from tests.support.signing import make_root, seeded_key, sign_root

BASE = "https://updates.example.test"
DAY = 86400
START = 1_800_000_000  # the fake clock's epoch second


class FakeClock:
    """Wall and monotonic time that only move when told to (``sleep`` advances them)."""

    def __init__(self, now: float = START) -> None:
        self.now = now
        self.mono = 1000.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.mono

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.mono += seconds

    def advance(self, seconds: float) -> None:
        self.sleep(seconds)


@dataclass
class Fetch:
    url: str
    path: str
    headers: dict[str, str]
    status: int = 0


@dataclass
class Faults:
    """Misbehaviour knobs, by URL path."""

    cut_after: dict[str, int] = field(default_factory=dict)   # stop the body after N bytes
    slow_seconds_per_chunk: float = 0.0                        # fake-clock time per chunk
    endless: set[str] = field(default_factory=set)             # body never ends
    ignore_range: bool = False


class RepositorySimulator:
    """Roots, one manifest per channel, and blobs; ``fetch`` serves them like the server."""

    chunk = 4096

    def __init__(self, clock: FakeClock, *, root_keys: int = 2, root_threshold: int = 2,
                 release_keys: int = 2, release_threshold: int = 1) -> None:
        self.clock = clock
        self.root_keys = [seeded_key(f"root-{i}") for i in range(root_keys)]
        self.release_keys = [seeded_key(f"release-{i}") for i in range(release_keys)]
        self.root_threshold = root_threshold
        self.release_threshold = release_threshold
        self.roots: dict[int, bytes] = {}
        self.blobs: dict[str, bytes] = {}
        self.models: dict[str, dict[str, list[Release]]] = {}
        self.serial: dict[str, int] = {}
        self.expires: dict[str, int] = {}
        self.manifest_override: dict[str, bytes] = {}
        self.sign_with: list[SigningKey] | None = None  # None = the release keys
        self.fetches: list[Fetch] = []
        self.faults = Faults()
        self.telemetry = TelemetrySink(clock)
        self.publish_root(1, self.root_keys, self.root_keys)
        self._names = itertools.count(1)

    # -- roots -------------------------------------------------------------------------

    def root_doc(self, version: int, root_keys: list[SigningKey]) -> Root:
        return make_root(version, root_keys, self.root_threshold, self.release_keys,
                         self.release_threshold, expires=START + 365 * DAY)

    def publish_root(self, version: int, root_keys: list[SigningKey],
                     signers: list[SigningKey]) -> bytes:
        data = sign_root(self.root_doc(version, root_keys), signers)
        self.roots[version] = data
        return data

    @property
    def pinned_root(self) -> bytes:
        return self.roots[1]

    # -- releases ------------------------------------------------------------------------

    def add_blob(self, data: bytes, name: str | None = None) -> tuple[str, str]:
        """Store bytes; returns (relative url, sha256)."""
        sha = hashlib.sha256(data).hexdigest()
        path = name or f"blobs/{sha[:16]}-{next(self._names)}"
        self.blobs["/" + path] = data
        return path, sha

    def artifact(self, data: bytes, *, platform: str = "linux", fmt: str = "onnx",
                 variant: str = "", target: dict[str, str] | None = None,
                 patches: list[Patch] | None = None, length: int | None = None,
                 sha256: str | None = None) -> Artifact:
        url, sha = self.add_blob(data)
        return Artifact(platform=platform, variant=variant, format=fmt, url=url,
                        length=len(data) if length is None else length,
                        sha256=sha256 or sha, target=target or {}, patches=patches or [])

    def patch(self, base: bytes, new: bytes, algorithm: str = "bsdiff4",
              data: bytes | None = None) -> Patch:
        import bsdiff4

        body = data if data is not None else bsdiff4.diff(base, new)
        url, sha = self.add_blob(body)
        return Patch(from_sha256=hashlib.sha256(base).hexdigest(), url=url, length=len(body),
                     sha256=sha, algorithm=algorithm)

    def release(self, version: str, artifacts: list[Artifact], *, share_ppm: int = 1_000_000,
                filters: Filters | None = None, mode: str = "active",
                shadow: manifests.ShadowThresholds | None = None) -> Release:
        if mode == "shadow" and shadow is None:
            shadow = manifests.ShadowThresholds(1000, 10_000, 10)
        rollout = Rollout(share_ppm, f"salt-{version}", mode, filters or Filters(),  # type: ignore[arg-type]
                          shadow)
        return Release(version, rollout, artifacts)

    def publish(self, model: str, releases: list[Release], channel: str = "prod",
                *, expires_in: int = DAY) -> int:
        """Set the releases of ``model`` on ``channel`` and bump the serial."""
        self.models.setdefault(channel, {})[model] = releases
        self.serial[channel] = self.serial.get(channel, 0) + 1
        self.expires[channel] = int(self.clock.time()) + expires_in
        self.manifest_override.pop(channel, None)
        return self.serial[channel]

    def manifest_doc(self, channel: str = "prod") -> Manifest:
        models = {m: ModelEntry(r) for m, r in self.models.get(channel, {}).items()}
        return Manifest(channel, self.serial[channel], self.expires[channel], models)

    def manifest_bytes(self, channel: str = "prod") -> bytes:
        if channel in self.manifest_override:
            return self.manifest_override[channel]
        keys = self.sign_with if self.sign_with is not None else self.release_keys
        return manifests.sign_envelope(self.manifest_doc(channel).to_bytes(),
                                       MANIFEST_PAYLOAD_TYPE, keys)

    # -- the Transport -------------------------------------------------------------------

    def fetch(self, url: str, headers: Mapping[str, str], timeout: float) -> Response:
        parts = urllib.parse.urlsplit(url)
        path = parts.path
        rec = Fetch(url, path, dict(headers))
        self.fetches.append(rec)
        if not url.startswith(BASE):
            rec.status = 404
            return self._response(404, b"", {})
        if path.startswith("/v1/root/") and path.endswith(".json"):
            version = int(path[len("/v1/root/"):-len(".json")])
            body = self.roots.get(version)
            rec.status = 200 if body is not None else 404
            return self._response(rec.status, body or b"", {}, path)
        if path.startswith("/v1/channels/") and path.endswith("/manifest"):
            channel = path.split("/")[3]
            if channel not in self.serial and channel not in self.manifest_override:
                rec.status = 404
                return self._response(404, b"", {})
            body = self.manifest_bytes(channel)
            etag = '"' + hashlib.sha256(body).hexdigest() + '"'
            if headers.get("If-None-Match") == etag:
                rec.status = 304
                return self._response(304, b"", {"etag": etag})
            rec.status = 200
            return self._response(200, body, {"etag": etag}, path)
        body = self.blobs.get(path)
        if body is None:
            rec.status = 404
            return self._response(404, b"", {})
        rng = headers.get("Range")
        if rng and not self.faults.ignore_range:
            start = int(rng.removeprefix("bytes=").rstrip("-"))
            if start >= len(body):
                rec.status = 416
                return self._response(416, b"", {"content-range": f"bytes */{len(body)}"})
            rec.status = 206
            return self._response(206, body[start:], {
                "content-range": f"bytes {start}-{len(body) - 1}/{len(body)}"}, path, start)
        rec.status = 200
        return self._response(200, body, {}, path)

    def _response(self, status: int, body: bytes, headers: dict[str, str], path: str = "",
                  offset: int = 0) -> Response:
        return Response(status, headers, self._chunks(body, path, offset))

    def _chunks(self, body: bytes, path: str, offset: int) -> Iterator[bytes]:
        if path in self.faults.endless:
            while True:
                self.clock.sleep(self.faults.slow_seconds_per_chunk)
                yield b"\0" * self.chunk
        cut = self.faults.cut_after.get(path)
        for i in range(0, len(body), self.chunk):
            piece = body[i:i + self.chunk]
            if cut is not None and offset + i + len(piece) > cut:
                keep = cut - (offset + i)
                if keep > 0:
                    yield piece[:keep]
                raise FetchError(f"simulated connection cut at byte {cut}")
            self.clock.sleep(self.faults.slow_seconds_per_chunk)
            yield piece

    def fetch_all(self, path: str, headers: Mapping[str, str]) -> tuple[Response, bytes]:
        """`fetch` of BASE + `path`, its body read up to a simulated cut (what an HTTP front
        for the simulator sends on: the client sees the short body)."""
        resp = self.fetch(BASE + path, headers, 30)
        body = bytearray()
        try:
            for chunk in resp.chunks:
                body += chunk
        except FetchError:
            pass
        return resp, bytes(body)

    def post(self, url: str, body: bytes, headers: Mapping[str, str],
             timeout: float) -> Response:
        status, reply, extra = self.telemetry.handle(urllib.parse.urlsplit(url).path, body,
                                                     {k.lower(): v for k, v in headers.items()})
        return self._response(status, json.dumps(reply).encode(), extra)

    # -- inspection ----------------------------------------------------------------------

    def fetched(self, prefix: str = "") -> list[Fetch]:
        return [f for f in self.fetches if f.path.startswith(prefix)]


class TelemetrySink:
    """The server's side of TELEMETRY_SPEC in miniature: enrolment with a token, signature
    verification over the exact body, staleness, idempotent report ids; knobs to fail."""

    def __init__(self, clock: FakeClock, token: str = "enroll-secret") -> None:
        self.clock = clock
        self.token = token
        self.keys: dict[str, str] = {}          # device_id -> public key hex
        self.reports: dict[str, dict[str, object]] = {}  # report id -> report
        self.bodies: list[bytes] = []           # every telemetry body received
        self.fail_next: list[int] = []          # statuses to answer (then store nothing)
        self.lose_reply_next = 0                # store, but answer 503 (a lost reply)
        self.duplicates = 0

    def handle(self, path: str, body: bytes, headers: dict[str, str]
               ) -> tuple[int, dict[str, object], dict[str, str]]:
        if path == "/v1/devices/enroll":
            if headers.get("authorization") != f"Bearer {self.token}":
                return 401, {"code": "token_invalid"}, {}
            doc = json.loads(body)
            known = self.keys.get(doc["device_id"])
            if known is not None and known != doc["public_key"]:
                return 409, {"code": "device_key_mismatch"}, {}
            self.keys[doc["device_id"]] = doc["public_key"]
            return (200 if known else 201), {"device_id": doc["device_id"]}, {}
        if path != "/v1/telemetry":
            return 404, {}, {}
        self.bodies.append(body)
        if self.fail_next:
            status = self.fail_next.pop(0)
            return status, {"code": "unavailable"}, ({"retry-after": "5"} if status == 429
                                                     else {})
        import nacl.exceptions
        import nacl.signing

        device = headers.get("x-device-id", "")
        key = self.keys.get(device)
        if key is None:
            return 401, {"code": "device_unknown"}, {}
        try:
            nacl.signing.VerifyKey(bytes.fromhex(key)).verify(
                body, base64.b64decode(headers.get("x-device-signature", "")))
        except (nacl.exceptions.BadSignatureError, ValueError):
            return 401, {"code": "device_signature_invalid"}, {}
        doc = json.loads(body)
        if doc["device_id"] != device or abs(doc["sent_at"] - self.clock.time()) > 600:
            return 401, {"code": "device_report_stale"}, {}
        accepted = dups = 0
        for r in doc["reports"]:
            if r["id"] in self.reports:
                dups += 1
            else:
                self.reports[r["id"]] = r
                accepted += 1
        self.duplicates += dups
        if self.lose_reply_next:
            self.lose_reply_next -= 1
            return 503, {}, {}
        return 200, {"accepted": accepted, "duplicates": dups}, {}

    def of_kind(self, kind: str) -> list[dict[str, object]]:
        return [r for r in self.reports.values() if r["kind"] == kind]
