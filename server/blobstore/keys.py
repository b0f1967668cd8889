"""The one naming scheme for what the server stores in its blob store.

    sources/<model>/<version>/<token>/<field>        an uploaded file (model, calibration,
                                                     reference); token: random per upload, so
                                                     a failed upload never collides
    artifacts/<model>/<version>/<platform>/<variant>/<sha256>/<filename>
                                                     a compiled artifact; content-addressed,
                                                     so a worker that lost its build claim
                                                     can never overwrite the new owner's blob
    patches/<sha256>                                 a delta patch (content-addressed)
    manifests/<channel>/<serial>.json                every signed manifest of a channel
    manifests/<channel>.json                         a copy of the channel's current one

Keys are part of the stored data (rows keep them): change them only with a migration.
"""

from __future__ import annotations

import uuid


def source_key(model: str, version: str, field: str, token: str | None = None) -> str:
    return f"sources/{model}/{version}/{token or uuid.uuid4().hex}/{field}"


def artifact_key(model: str, version: str, platform: str, variant: str, sha256: str,
                 filename: str) -> str:
    return f"artifacts/{model}/{version}/{platform}/{variant}/{sha256}/{filename}"


def patch_key(sha256: str) -> str:
    return f"patches/{sha256}"


def manifest_key(channel: str, serial: int) -> str:
    return f"manifests/{channel}/{serial}.json"


def current_manifest_key(channel: str) -> str:
    return f"manifests/{channel}.json"
