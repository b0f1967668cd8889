"""Local-directory blob store (the embedded default).

Layout under `root`: `objects/<key>` holds published blobs, `tmp/` holds in-flight writes on
the same filesystem so publishing is one `os.replace` (atomic on POSIX); the file is fsynced
first so a crash never leaves a published prefix. `objects/` is what an HTTP server serves to
devices (its `v1/` keys are the read API, server/blobstore/keys.py); content type and cache
headers are that server's (server/publish/nginxconf.py), so `put` ignores them here. A
replacement's mtime is set past the old file's by at least a second: nginx's ETag is
mtime-plus-length, and two manifests of one length published within a second must not share
it (a device would be told 304 and keep the older one).
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from server.blobstore.interface import (
    CHUNK_SIZE,
    BlobBackendError,
    BlobInfo,
    BlobNotFoundError,
    BlobStorageFullError,
    BlobStoreError,
    HashingCounter,
    Source,
    check_range,
    iter_source,
    validate_key,
)


class LocalBlobStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._objects = self.root / "objects"
        self._tmp = self.root / "tmp"
        try:
            self._objects.mkdir(parents=True, exist_ok=True)
            self._tmp.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise BlobBackendError(f"cannot create blob directory {self.root}: {e}") from e

    def __repr__(self) -> str:
        return f"LocalBlobStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        return self._objects / validate_key(key)

    def put(
        self,
        key: str,
        source: Source,
        *,
        max_bytes: int | None = None,
        expected_sha256: str | None = None,
        content_type: str = "application/octet-stream",
        cache_control: str | None = None,
    ) -> BlobInfo:
        path = self._path(key)
        counter = HashingCounter(key, max_bytes)
        try:
            fd, tmp_name = tempfile.mkstemp(dir=self._tmp, prefix="put-")
        except OSError as e:
            raise self._write_error(key, e) from e
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in iter_source(source):
                    counter.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            digest = counter.check(expected_sha256)
            path.parent.mkdir(parents=True, exist_ok=True)
            _advance_mtime(tmp_name, path)
            os.replace(tmp_name, path)
        except BlobStoreError:
            _unlink_quietly(tmp_name)
            raise
        except OSError as e:
            _unlink_quietly(tmp_name)
            raise self._write_error(key, e) from e
        except BaseException:
            _unlink_quietly(tmp_name)
            raise
        return BlobInfo(key=key, length=counter.length, sha256=digest)

    def _write_error(self, key: str, e: OSError) -> BlobBackendError:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            # The partial temp file is gone already (the caller unlinks it): say so, so an
            # operator knows the store needs space, not repair.
            return BlobStorageFullError(
                f"cannot write blob {key!r}: no space left in the blob directory {self.root} "
                f"({e.strerror}); nothing was stored")
        return BlobBackendError(f"cannot write blob {key!r}: {e}")

    def open(self, key: str) -> BinaryIO:
        path = self._path(key)
        try:
            return path.open("rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise BlobNotFoundError(key) from e
        except OSError as e:
            raise BlobBackendError(f"cannot read blob {key!r}: {e}") from e

    def iter_range(
        self, key: str, start: int = 0, end: int | None = None, chunk_size: int = CHUNK_SIZE
    ) -> Iterator[bytes]:
        f = self.open(key)
        try:
            stop = check_range(os.fstat(f.fileno()).st_size, start, end)
        except BaseException:
            f.close()
            raise
        return _read_range(f, start, stop, chunk_size)

    def stat(self, key: str) -> BlobInfo:
        path = self._path(key)
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError) as e:
            raise BlobNotFoundError(key) from e
        if not path.is_file():
            raise BlobNotFoundError(key)
        return BlobInfo(key=key, length=st.st_size, modified=st.st_mtime)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as e:
            raise BlobBackendError(f"cannot delete blob {key!r}: {e}") from e

    def list_keys(self, prefix: str = "") -> Iterator[str]:
        keys = []
        for dirpath, _dirs, files in os.walk(self._objects):
            for name in files:
                rel = (Path(dirpath) / name).relative_to(self._objects).as_posix()
                if rel.startswith(prefix):
                    keys.append(rel)
        return iter(sorted(keys))

    def presigned_url(self, key: str, expires_in: int = 3600) -> str | None:
        validate_key(key)
        return None

    def check_ready(self) -> None:
        # Both directories a put needs, present and writable (a volume mounted read-only or
        # removed under a running server shows here, not at the next upload).
        for path in (self._objects, self._tmp):
            if not path.is_dir():
                raise BlobBackendError(f"blob directory {path} is missing")
            if not os.access(path, os.W_OK | os.X_OK):
                raise BlobBackendError(f"blob directory {path} is not writable")


def _read_range(f: BinaryIO, start: int, stop: int, chunk_size: int) -> Iterator[bytes]:
    with f:
        f.seek(start)
        remaining = stop - start
        while remaining > 0:
            chunk = f.read(min(chunk_size, remaining))
            if not chunk:
                return
            remaining -= len(chunk)
            yield chunk


def _advance_mtime(new: str, old: Path) -> None:
    """Give `new` (about to replace `old`) an mtime in a later whole second than `old`'s."""
    try:
        before = int(old.stat().st_mtime)
    except FileNotFoundError:
        return
    now = os.stat(new).st_mtime
    if int(now) <= before:
        later = before + 1
        os.utime(new, (later, later))


def _unlink_quietly(name: str) -> None:
    try:
        os.unlink(name)
    except OSError:
        pass
