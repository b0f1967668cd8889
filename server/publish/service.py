"""Wiring from server settings to the publishing objects (the one place that knows both)."""

from __future__ import annotations

import functools
from pathlib import Path

from manifests import SigningKey
from server.blobstore import BlobStore
from server.publish.keys import KeyPaths, load_release_key
from server.publish.publisher import Publisher
from server.settings import Settings


def key_paths(settings: Settings) -> KeyPaths:
    """Keys under DATA_DIR/keys unless settings (`keys_dir`) or MODELFLEET_KEYS_DIR say else."""
    keys_dir: Path | None = getattr(settings, "keys_dir", None)
    return KeyPaths.for_data_dir(settings.data_dir, keys_dir)


def manifest_base_url(settings: Settings) -> str:
    """MODELFLEET_PUBLIC_BASE_URL when it was set; else "" — manifests then carry URLs
    relative to the server's base URL, which devices resolve against the URL they use. The
    setting's built-in default names one host and port, and would send devices elsewhere
    whenever the server runs on another one."""
    return settings.public_base_url if "public_base_url" in settings.model_fields_set else ""


def make_publisher(settings: Settings, blob_store: BlobStore) -> Publisher:
    """The publisher for this server: the release key is read at each publish, so a rotated
    key (`modelfleet keys rotate --rotate-release`) takes effect without a restart."""
    path = key_paths(settings).release_key_path
    loader: functools.partial[SigningKey] = functools.partial(load_release_key, path)
    return Publisher(blob_store=blob_store, release_key=loader,
                     base_url=manifest_base_url(settings),
                     lifetime_seconds=settings.manifest_lifetime_seconds)
