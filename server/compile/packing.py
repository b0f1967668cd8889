"""Reproducible packing of compiler output into one file per artifact.

A directory artifact (Core ML .mlpackage) becomes an uncompressed POSIX tar whose bytes depend
only on the file names and contents: entries sorted, mtime 0, uid/gid 0, empty owner names,
fixed modes, and no padding after the end-of-archive blocks. So identical compiler output
always gives the same sha256, and delta patches between releases see unchanged tensors as
unchanged bytes (no compression inside). Single files are copied as they are.
"""

from __future__ import annotations

import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

from server.hashing import file_sha256

MAX_PACKED_BYTES = 8 * 1024**3  # refuse absurd outputs rather than fill the disk


class PackingError(Exception):
    """The compiler output cannot be packed (symlink escaping, special file, too large)."""


@dataclass(frozen=True)
class PackedArtifact:
    path: Path
    sha256: str
    length: int
    packing: str  # "file" | "tar"


def _entries(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        base = Path(dirpath)
        for name in dirnames + filenames:
            p = base / name
            if p.is_symlink() or not (p.is_dir() or p.is_file()):
                raise PackingError(f"{p.relative_to(root)} is a symlink or special file; "
                                   "artifacts may contain only regular files and directories")
            out.append(p)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def _tarinfo(name: str, *, is_dir: bool, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if is_dir else tarfile.REGTYPE
    info.mode = 0o755 if is_dir else 0o644
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack_directory(src: Path, out: Path) -> PackedArtifact:
    """Archives `src` (its name becomes the top directory) into `out` deterministically.

    Written to a temporary name and renamed, so a crash never leaves a half-written archive.
    """
    top = src.name
    tmp = out.with_name(out.name + ".partial")
    total = 0
    try:
        with tmp.open("wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT,
                                                 encoding="utf-8") as tar:
            tar.addfile(_tarinfo(top, is_dir=True))
            for p in _entries(src):
                name = f"{top}/{p.relative_to(src).as_posix()}"
                if p.is_dir():
                    tar.addfile(_tarinfo(name, is_dir=True))
                    continue
                size = p.stat().st_size
                total += size
                if total > MAX_PACKED_BYTES:
                    raise PackingError(f"{src.name} exceeds {MAX_PACKED_BYTES} bytes")
                with p.open("rb") as f:
                    tar.addfile(_tarinfo(name, is_dir=False, size=size), f)
            # tarfile pads the archive to a 10 KiB record after the end-of-archive blocks;
            # readers stop at those blocks, so the padding is bytes every device downloads
            # for nothing (up to a third of a small Core ML package).
            tar.close()  # writes the two zero blocks, then the padding
            raw.truncate(tar.offset)  # tar.offset counts the blocks, not the padding
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    digest, length = file_sha256(out)
    return PackedArtifact(out, digest, length, "tar")


def pack(src: Path, out_dir: Path) -> PackedArtifact:
    """One file for an artifact: a directory is tarred, a file copied."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        return pack_directory(src, out_dir / f"{src.name}.tar")
    out = out_dir / src.name
    if src.resolve() != out.resolve():
        shutil.copyfile(src, out)
    if out.stat().st_size > MAX_PACKED_BYTES:
        raise PackingError(f"{src.name} exceeds {MAX_PACKED_BYTES} bytes")
    digest, length = file_sha256(out)
    return PackedArtifact(out, digest, length, "file")


def unpack_directory(archive: Path, dest: Path) -> Path:
    """Extracts an archive made by `pack_directory` (refusing unsafe names); returns its root."""
    with tarfile.open(archive, mode="r:") as tar:
        tar.extractall(dest, filter="data")
        top = tar.getnames()[0].split("/")[0]
    return dest / top
