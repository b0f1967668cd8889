"""The one naming scheme for what the server stores in its blob store.

What devices read lives under `v1/`, at the very paths of the API's read routes, so the
bucket (or a directory, behind nginx or a CDN) answers a device exactly as the API does:

    v1/channels/<channel>/manifest                   the channel's current signed manifest
    v1/root/<version>.json                           every signed root version
    v1/artifacts/<sha256>                            a compiled artifact (content-addressed)
    v1/patches/<sha256>                              a delta patch (content-addressed)

Content-addressed keys are stored once: a worker that lost its build claim can never
overwrite the new owner's blob (same bytes land on the same key, other bytes elsewhere), and
two versions with one artifact share it. Private to the server:

    sources/<model>/<version>/<token>/<field>        an uploaded file (model, calibration,
                                                     reference); token: random per upload, so
                                                     a failed upload never collides
    manifests/<channel>/<serial>.json                every signed manifest of a channel
    unmarked/<sha256>                                a watermarked artifact's unmarked
                                                     original (for `watermark identify`)

Keys are part of the stored data (rows keep them): change them only with a migration. Rows
made before the `v1/` layout name older keys (`artifacts/<model>/…/<sha256>/<file>`,
`patches/<sha256>`) and stay readable through them; publishing copies each blob it offers to
its `v1/` key and points the row there, `modelfleet bucket sync` does it for all of them
(server/publish/bucket.py). The old blobs are left in place.
"""

from __future__ import annotations

import uuid

READ_API_PREFIX = "v1/"
ROOTS_PREFIX = "v1/root/"


SOURCES_PREFIX = "sources/"


def source_key(model: str, version: str, field: str, token: str | None = None) -> str:
    return f"{SOURCES_PREFIX}{model}/{version}/{token or uuid.uuid4().hex}/{field}"


def unmarked_key(sha256: str) -> str:
    """A watermarked artifact's unmarked original (private: identification compares leaks
    with it; never under v1/, never served)."""
    return f"unmarked/{sha256}"


def artifact_key(sha256: str) -> str:
    return f"v1/artifacts/{sha256}"


def patch_key(sha256: str) -> str:
    return f"v1/patches/{sha256}"


def channel_manifest_key(channel: str) -> str:
    return f"v1/channels/{channel}/manifest"


def root_key(version: int) -> str:
    return f"{ROOTS_PREFIX}{version}.json"


def manifest_key(channel: str, serial: int) -> str:
    return f"manifests/{channel}/{serial}.json"


# The read keys as regular expressions (whole key), for an HTTP server in front of the bucket:
# it serves these and nothing else (sources/ and manifests/ stay private).
CHANNEL_MANIFEST_PATTERN = r"v1/channels/[a-z0-9][a-z0-9._-]{0,63}/manifest"
ROOT_PATTERN = r"v1/root/[1-9][0-9]{0,6}\.json"
ARTIFACT_PATTERN = r"v1/artifacts/[0-9a-f]{64}"
PATCH_PATTERN = r"v1/patches/[0-9a-f]{64}"
