"""Device telemetry: reports in a bounded on-disk outbox, signed batches to ``POST /v1/telemetry``.

Only metrics leave the device (update events, shadow summaries, run-time health counters) —
never an input or an output; the report schema is the one of ``TELEMETRY_SPEC`` /
docs/shadow.md. Any part of the SDK adds a report with ``Outbox.add``: one atomically written
file under ``<data_dir>/telemetry/outbox/``; past ``max_reports`` files the oldest are dropped
and counted (``telemetry/dropped.json``). Each report has a random 32-hex id, so a batch sent
twice (a lost reply) is stored once by the server.

``Reporter`` (used by the device agent after each update cycle): ``enroll(token)`` once
(``POST /v1/devices/enroll``, idempotent), ``collect()`` turns changed shadow statistics and
health counters into reports, ``flush()`` sends the outbox in batches of at most 500 reports
and 200 KiB, each body signed by the device key (``X-Device-Signature``), deleting a batch only
once the server accepted it; 429, 5xx, 401 and network errors back off exponentially
(``telemetry/backoff.json``, ``Retry-After`` honoured) and keep the reports for later.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from client_sdk.clock import Clock
from client_sdk.errors import FetchError, TelemetryError
from client_sdk.fsutil import atomic_write_bytes, atomic_write_json
from client_sdk.health import HealthMonitor
from client_sdk.identity import DeviceIdentity
from client_sdk.protection import box_public_hex, keystore_for
from client_sdk.shadow_stats import ShadowStore
from client_sdk.transport import Response, Transport
from manifests import DeviceProfile

MAX_BATCH_REPORTS = 500
MAX_BATCH_BYTES = 200 * 1024  # the server reads at most 256 KiB
MAX_REPLY_BYTES = 64 * 1024
UPDATE_EVENTS = ("downloaded", "verified", "activated", "rolled_back", "failed")
VIA = ("patch", "full", "held")


def new_report(kind: str, model: str, version: str, sha256: str | None, at: int,
               channel: str | None = None, **fields: Any) -> dict[str, Any]:
    return {"id": secrets.token_hex(16), "kind": kind, "at": int(at), "model": model,
            "version": version, "artifact_sha256": sha256 or None, "channel": channel,
            **fields}


def update_report(model: str, version: str, sha256: str | None, event: str, *, at: int,
                  via: str | None = None, nbytes: int | None = None, reason: str | None = None,
                  channel: str | None = None) -> dict[str, Any]:
    """A kind "update" report: ``event`` one of UPDATE_EVENTS, ``via`` one of VIA."""
    if event not in UPDATE_EVENTS or (via is not None and via not in VIA):
        raise ValueError(f"bad update event {event!r} / via {via!r}")
    return new_report("update", model, version, sha256, at, channel, event=event, via=via,
                      bytes=nbytes, reason=None if reason is None else reason[:500])


class Outbox:
    """The bounded on-disk queue of reports not yet accepted by the server."""

    def __init__(self, data_dir: Path, max_reports: int = 2000) -> None:
        self.dir = Path(data_dir) / "telemetry" / "outbox"
        self._dropped = Path(data_dir) / "telemetry" / "dropped.json"
        self.max_reports = max_reports

    def add(self, report: dict[str, Any]) -> None:
        # Named so that sorting lists them oldest first (``at``, then the write time).
        name = f"{report['at']:012d}-{time.time_ns():020d}-{report['id']}.json"
        atomic_write_bytes(self.dir / name, json.dumps(report, sort_keys=True).encode())
        files = self.files()
        excess = len(files) - self.max_reports
        if excess > 0:
            for f in files[:excess]:
                f.unlink(missing_ok=True)
            atomic_write_json(self._dropped, {"dropped": self.dropped() + excess})

    def files(self) -> list[Path]:
        return sorted(self.dir.glob("*.json")) if self.dir.exists() else []

    def dropped(self) -> int:
        try:
            return int(json.loads(self._dropped.read_bytes())["dropped"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0


@dataclass(frozen=True)
class FlushResult:
    sent: int = 0
    duplicates: int = 0
    pending: int = 0
    dropped: int = 0
    status: str = "ok"  # ok | not_enrolled | backing_off | retry_later | refused


class Reporter:
    """Enrols the device and uploads its outbox (see the module docstring)."""

    def __init__(self, data_dir: Path, base_url: str, transport: Transport,
                 device: DeviceProfile, clock: Clock, *, channel: str | None = None,
                 timeout: float = 30.0, backoff_base: float = 30.0,
                 backoff_cap: float = 3600.0) -> None:
        self.data_dir = Path(data_dir)
        self.base_url = base_url
        self.transport = transport
        self.device = device
        self.clock = clock
        self.channel = channel
        self.timeout = timeout
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.outbox = Outbox(self.data_dir)
        self.identity = DeviceIdentity.load_or_create(self.data_dir)
        self._state = self.data_dir / "telemetry"

    # -- enrolment -----------------------------------------------------------------------

    def enrolled(self) -> bool:
        try:
            d = json.loads((self._state / "enrolled.json").read_bytes())
        except (OSError, ValueError):
            return False
        return bool(d.get("keyid") == self.identity.keyid
                    and d.get("device_id") == self.device.device_id)

    def enroll(self, token: str) -> bool:
        """Enrol once (a no-op when already enrolled with the X25519 key too); True when
        this call enrolled. A device enrolled by an older agent enrols again with the same
        Ed25519 key to add its X25519 key (the server keeps the first of each)."""
        box = box_public_hex(keystore_for(self.data_dir))
        if self.enrolled() and self._enrolled_box() == box:
            return False
        d = self.device
        body = json.dumps({"device_id": d.device_id, "public_key": self.identity.public_key_hex,
                           "box_public_key": box,
                           "profile": {"platform": d.platform, "soc": d.soc or None,
                                       "arch": d.arch or None, "os_version": d.os_version or None,
                                       "app_version": d.app_version or None}}).encode()
        status, reply = self._post("v1/devices/enroll", body, {
            "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        if status not in (200, 201):
            raise TelemetryError(f"enrolment of device {d.device_id} refused: HTTP {status} "
                                 f"{_detail(reply)}")
        atomic_write_json(self._state / "enrolled.json", {
            "device_id": d.device_id, "keyid": self.identity.keyid,
            "enrolled_at": int(self.clock.time()), "box_public_key": box})
        return True

    def _enrolled_box(self) -> str | None:
        try:
            d = json.loads((self._state / "enrolled.json").read_bytes())
        except (OSError, ValueError):
            return None
        return d.get("box_public_key") if isinstance(d, dict) else None

    # -- reports -------------------------------------------------------------------------

    def collect(self) -> int:
        """Add reports for shadow statistics and health counters changed since last time."""
        seen_path = self._state / "reported.json"
        try:
            seen: dict[str, Any] = json.loads(seen_path.read_bytes())
        except (OSError, ValueError):
            seen = {}
        shadow_seen = seen.setdefault("shadow", {})
        health_seen = seen.setdefault("health", {})
        now, added = int(self.clock.time()), 0
        for stats in ShadowStore(self.data_dir).all():
            mark = [stats.samples, stats.dropped, stats.verdict]
            if shadow_seen.get(stats.sha256) != mark:
                self.outbox.add(new_report("shadow", stats.model, stats.version, stats.sha256,
                                           now, self.channel, **stats.summary()))
                shadow_seen[stats.sha256] = mark
                added += 1
        for model, r in HealthMonitor(self.data_dir).records().items():
            mark = [r.bundle_id, r.predictions, r.errors, r.rolled_back]
            last = health_seen.get(model)
            if last != mark:
                # Counts since the last health report (all of them for a new bundle).
                same = isinstance(last, list) and len(last) == 4 and last[0] == r.bundle_id
                preds = r.predictions - int(last[1]) if same else r.predictions
                errs = r.errors - int(last[2]) if same else r.errors
                self.outbox.add(new_report("health", model, r.version, r.sha256 or None, now,
                                           self.channel, predictions=max(preds, 0),
                                           errors=max(errs, 0), p99_us=r.p99_us,
                                           rolled_back=r.rolled_back))
                health_seen[model] = mark
                added += 1
        if added:
            atomic_write_json(seen_path, seen)
        return added

    def flush(self) -> FlushResult:
        """Send the outbox (see the module docstring); never raises for network trouble."""
        files = self.outbox.files()
        if not self.enrolled():
            return FlushResult(pending=len(files), dropped=self.outbox.dropped(),
                               status="not_enrolled")
        backoff = self._backoff()
        if backoff.get("next_at", 0) > self.clock.time():
            return FlushResult(pending=len(files), dropped=self.outbox.dropped(),
                               status="backing_off")
        sent = dups = 0
        status = "ok"
        while files:
            batch, reports = _batch(files)
            if not batch:
                break
            body = json.dumps({"device_id": self.device.device_id,
                               "sent_at": int(self.clock.time()), "reports": reports},
                              separators=(",", ":")).encode()
            headers = {"Content-Type": "application/json",
                       "X-Device-Id": self.device.device_id,
                       "X-Device-Signature": self.identity.sign_b64(body)}
            try:
                code, reply, retry_after = self._post_raw("v1/telemetry", body, headers)
            except FetchError:
                code, reply, retry_after = 0, b"", None
            if code == 200:
                ans = _json(reply)
                sent += int(ans.get("accepted", 0))
                dups += int(ans.get("duplicates", 0))
                for f in batch:
                    f.unlink(missing_ok=True)
                files = self.outbox.files()
                self._set_backoff({})
                continue
            if code == 422:  # the server names a field it refuses: these reports never pass
                for f in batch:
                    f.unlink(missing_ok=True)
                files = self.outbox.files()
                status = "refused"
                continue
            n = int(backoff.get("failures", 0)) + 1
            delay = min(self.backoff_cap, self.backoff_base * 2 ** (n - 1))
            if retry_after is not None:
                delay = max(delay, retry_after)
            self._set_backoff({"failures": n, "next_at": self.clock.time() + delay,
                               "last_status": code})
            status = "retry_later"
            break
        return FlushResult(sent, dups, len(self.outbox.files()), self.outbox.dropped(), status)

    # -- plumbing ------------------------------------------------------------------------

    def _backoff(self) -> dict[str, Any]:
        try:
            d = json.loads((self._state / "backoff.json").read_bytes())
            return d if isinstance(d, dict) else {}
        except (OSError, ValueError):
            return {}

    def _set_backoff(self, d: dict[str, Any]) -> None:
        if d or (self._state / "backoff.json").exists():
            atomic_write_json(self._state / "backoff.json", d)

    def _post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        code, reply, _ = self._post_raw(path, body, headers)
        return code, reply

    def _post_raw(self, path: str, body: bytes,
                  headers: dict[str, str]) -> tuple[int, bytes, float | None]:
        url = urllib.parse.urljoin(self.base_url.rstrip("/") + "/", path)
        resp = self.transport.post(url, body, headers,
                                   self.timeout)
        try:
            reply = _read_capped(resp)
        finally:
            resp.close()
        ra = resp.headers.get("retry-after")
        try:
            retry_after = float(ra) if ra is not None else None
        except ValueError:
            retry_after = None
        return resp.status, reply, retry_after


def _read_capped(resp: Response) -> bytes:
    resp.set_time_limit(30.0)
    out = bytearray()
    for chunk in resp.chunks:
        out += chunk
        if len(out) > MAX_REPLY_BYTES:
            raise FetchError(f"reply from {resp.url or 'the server'} over {MAX_REPLY_BYTES} B")
    return bytes(out)


def _json(data: bytes) -> dict[str, Any]:
    try:
        d = json.loads(data)
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


def _detail(reply: bytes) -> str:
    d = _json(reply)
    text = d.get("detail") or d.get("code") or d.get("error") or reply[:200].decode(
        "utf-8", "replace")
    return " ".join(str(text).split())[:300]


def _batch(files: list[Path]) -> tuple[list[Path], list[dict[str, Any]]]:
    batch: list[Path] = []
    reports: list[dict[str, Any]] = []
    size = 0
    for f in files:
        try:
            data = f.read_bytes()
            report = json.loads(data)
        except (OSError, ValueError):
            f.unlink(missing_ok=True)  # a torn file cannot be sent
            continue
        if batch and (len(batch) >= MAX_BATCH_REPORTS or size + len(data) > MAX_BATCH_BYTES):
            break
        batch.append(f)
        reports.append(report)
        size += len(data) + 1
    return batch, reports
