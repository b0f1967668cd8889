"""Where the device keeps its secrets for protected releases: a small ``KeyStore`` interface
(``get`` / ``put`` of named 32-byte secrets), with a file store by default — one file per
name under ``<data_dir>/keys``, created 0600 (O_EXCL: the first writer wins), refused when
group or others can read it. The Android Keystore or the iOS Keychain plug in here: pass
your own ``KeyStore`` to ``UpdaterConfig.keystore`` and ``ModelRuntime(keystore=...)``.

Two names are used (client_sdk/protection.py): ``box`` (the device's X25519 private key,
enrolled beside its Ed25519 identity) and ``at-rest`` (the device-local key its protected
models are sealed under on disk).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Protocol

from client_sdk.errors import LocalKeyError

_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")


class KeyStore(Protocol):
    def get(self, name: str) -> bytes | None:
        """The secret stored under ``name``, or None when there is none."""
        ...

    def put(self, name: str, secret: bytes) -> bytes:
        """Stores ``secret`` unless ``name`` already holds one; returns the one stored."""
        ...


class FileKeyStore:
    """One file per secret in ``directory`` (mode 0700), each mode 0600."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def _path(self, name: str) -> Path:
        if not _NAME.fullmatch(name):
            raise LocalKeyError(f"key name {name!r} is not allowed")
        return self.directory / f"{name}.key"

    def get(self, name: str) -> bytes | None:
        path = self._path(name)
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise LocalKeyError(f"{path} is readable by group or others (mode "
                                f"{stat.S_IMODE(st.st_mode):o}); run `chmod 600 {path}`")
        return path.read_bytes()

    def put(self, name: str, secret: bytes) -> bytes:
        path = self._path(name)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            got = self.get(name)
            assert got is not None
            return got
        try:
            os.write(fd, secret)
            os.fsync(fd)
        finally:
            os.close(fd)
        return secret


def default_keystore(data_dir: Path) -> FileKeyStore:
    return FileKeyStore(Path(data_dir) / "keys")
