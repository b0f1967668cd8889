"""Durable file operations: atomic writes, fsync of files and directories, hashing, names.

Every file the SDK trusts later is written to a temporary name, fsynced, renamed over the final
name with ``os.replace`` and the directory fsynced, so a crash leaves the old or the new file,
never a torn one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

from client_sdk.errors import ConfigError

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def check_name(kind: str, name: str) -> str:
    """Return ``name`` if it is safe as one path component, else raise ConfigError.

    Model and channel names come from signed documents but still become directory names; a
    name like ``../x`` must never escape the data directory.
    """
    if not _SAFE_NAME.fullmatch(name) or ".." in name:
        raise ConfigError(
            f"{kind} name {name!r} is not allowed: use letters, digits, '.', '_' or '-' "
            "(max 128 characters, no '..')"
        )
    return name


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see either the old or the new content."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fsync_dir(path.parent)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(obj, sort_keys=True, indent=1).encode())


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def remove_tree(path: Path) -> None:
    """Delete a directory tree; first renamed aside so a crash never leaves a half-deleted
    directory under its real name."""
    if not path.exists():
        return
    aside = path.with_name(f".trash-{path.name}-{uuid.uuid4().hex}")
    os.replace(path, aside)
    shutil.rmtree(aside, ignore_errors=True)
