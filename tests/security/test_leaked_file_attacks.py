"""Hostile "leaked" files handed to `modelfleet watermark identify` (server/compile/weights.py
unpacks an .mlpackage carried as a tar or zip): an archive that unpacks to more than the disk
holds is refused from its headers, before anything is written."""

from __future__ import annotations

import io
import subprocess
import tarfile
import tempfile
from pathlib import Path

import pytest

from server.compile import weights


def _refused_with_nothing_written(bomb: Path, tmp_path: Path, monkeypatch) -> None:
    scratch = tmp_path / "scratch"  # where weights.py unpacks (tempfile's directory)
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with pytest.raises(weights.WeightsError, match="unpacks to more than"):
        weights.read(bomb)
    assert [p for p in scratch.rglob("*") if p.is_file()] == []


def test_sparse_tar_bomb_of_9_gib_is_refused_before_unpacking(tmp_path, monkeypatch):
    # A 200-byte .tar.gz whose sparse member declares 9 GiB (GNU tar -S): Python's tarfile
    # would unpack it into a 9 GiB file (sparse here; a full one on a filesystem without holes).
    pkg = tmp_path / "src" / "leak.mlpackage"
    pkg.mkdir(parents=True)
    (pkg / "Manifest.json").write_text("{}")
    with (pkg / "weight.bin").open("wb") as f:
        f.truncate(9 * 1024**3)
    bomb = tmp_path / "leak.tar.gz"
    subprocess.run(["tar", "-cSzf", str(bomb), "-C", str(pkg.parent), pkg.name], check=True)
    assert bomb.stat().st_size < 4096
    _refused_with_nothing_written(bomb, tmp_path, monkeypatch)


def test_gzip_tar_bomb_is_refused_at_the_first_member_over_the_cap(tmp_path, monkeypatch):
    # Real compressed zeros (64 MiB in ~64 kB) against a cap lowered to 16 MiB: the first
    # member over it stops the walk, so the second member's 64 MiB is never unpacked either.
    monkeypatch.setattr(weights, "MAX_WEIGHT_FILE_BYTES", 16 * 1024**2)
    bomb = tmp_path / "leak.tar.gz"
    with tarfile.open(bomb, "w:gz") as tar:
        for name in ("leak.mlpackage/Data/weights/weight.bin", "leak.mlpackage/more.bin"):
            info = tarfile.TarInfo(name)
            info.size = 64 * 1024**2
            tar.addfile(info, io.BytesIO(bytes(info.size)))
        manifest = tarfile.TarInfo("leak.mlpackage/Manifest.json")
        manifest.size = 2
        tar.addfile(manifest, io.BytesIO(b"{}"))
    assert bomb.stat().st_size < 1024**2
    _refused_with_nothing_written(bomb, tmp_path, monkeypatch)


def test_inode_bomb_tar_with_more_entries_than_the_cap_is_refused(tmp_path):
    # An inode bomb: entries, not bytes. Written uncompressed here (512 bytes a header).
    bomb = tmp_path / "leak.tar"
    with tarfile.open(bomb, "w") as tar:
        for i in range(weights.MAX_ENTRIES + 1):
            tar.addfile(tarfile.TarInfo(f"leak.mlpackage/{i}"))
    with pytest.raises(weights.WeightsError, match="entries"):
        weights.read(bomb)


def test_zstd_bomb_leak_is_refused_mid_stream_with_nothing_left(tmp_path, monkeypatch):
    # A leaked "compressed copy" whose header claims 1 MiB but which inflates to 256 MiB,
    # against a cap of 16 MiB: identify's inflation stops at the declared length and
    # deletes what it wrote; one declaring more than the cap is refused from its header.
    import zstandard

    from server.services import watermarks
    from tests.client.test_compressed_artifacts import _lying_bomb

    monkeypatch.setattr(weights, "MAX_WEIGHT_FILE_BYTES", 16 * 1024**2)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    lying = tmp_path / "leak.onnx.zst"
    lying.write_bytes(_lying_bomb(1 << 20, 256 << 20))
    honest = tmp_path / "big.onnx.zst"
    honest.write_bytes(zstandard.ZstdCompressor(level=1).compress(b"\0" * (32 << 20)))
    for bomb, why in ((lying, "refused mid-stream"), (honest, "over the")):
        with pytest.raises(weights.WeightsError, match=why):
            watermarks._inflated(bomb, scratch)
        assert list(scratch.iterdir()) == []
