"""A device as the server sees it over HTTP: its own Ed25519 key, enrolment with an
`enroll` token, and signed telemetry batches exactly as docs/shadow.md specifies (body bytes
signed, standard base64 in X-Device-Signature)."""

from __future__ import annotations

import base64
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from nacl.signing import SigningKey


def report_id() -> str:
    return secrets.token_hex(16)


def shadow_report(model: str, version: str, verdict: str, *, kl: int = 1_000,
                  candidate_p99: int = 2_000, channel: str | None = "prod",
                  at: int | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": report_id(), "kind": "shadow", "at": at or int(time.time()), "model": model,
            "version": version, "artifact_sha256": None, "channel": channel,
            "samples": 200, "dropped": 3, "kl_mean_micro": kl, "kl_max_micro": kl * 4,
            "cosine_min_micro": 999_000, "snr_min_centi_db": 4_000, "active_p50_us": 900,
            "active_p99_us": 1_500, "candidate_p50_us": 1_000,
            "candidate_p99_us": candidate_p99, "verdict": verdict, "reason": None, **extra}


def update_report(model: str, version: str, event: str, *, channel: str | None = "prod",
                  at: int | None = None) -> dict[str, Any]:
    return {"id": report_id(), "kind": "update", "at": at or int(time.time()), "model": model,
            "version": version, "artifact_sha256": None, "channel": channel, "event": event,
            "via": "full", "bytes": 1234, "reason": None}


@dataclass
class FleetDevice:
    device_id: str
    platform: str = "android"
    os_version: str = "14"
    key: SigningKey = field(default_factory=SigningKey.generate)

    @property
    def public_key(self) -> str:
        return bytes(self.key.verify_key).hex()

    def enroll_body(self) -> dict[str, Any]:
        return {"device_id": self.device_id, "public_key": self.public_key,
                "profile": {"platform": self.platform, "soc": None, "arch": "arm64",
                            "os_version": self.os_version, "app_version": "1.0"}}

    def batch(self, reports: list[dict[str, Any]], *, sent_at: int | None = None) -> bytes:
        return json.dumps({"device_id": self.device_id,
                           "sent_at": int(time.time()) if sent_at is None else sent_at,
                           "reports": reports}, separators=(",", ":")).encode()

    def headers(self, body: bytes, key: SigningKey | None = None) -> dict[str, str]:
        signature = (key or self.key).sign(body).signature
        return {"Content-Type": "application/json", "X-Device-Id": self.device_id,
                "X-Device-Signature": base64.b64encode(signature).decode()}
