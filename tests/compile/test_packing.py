"""Deterministic packing: identical compiler output → identical bytes and sha256."""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path

import pytest

from server.compile.packing import PackingError, pack, pack_directory, unpack_directory


def make_tree(root: Path, *, mtime: int, extra: bool = False) -> Path:
    pkg = root / "model.mlpackage"
    (pkg / "Data" / "com.apple.CoreML" / "weights").mkdir(parents=True)
    (pkg / "Manifest.json").write_text('{"fileFormatVersion": "1.0.0"}')
    (pkg / "Data" / "com.apple.CoreML" / "model.mlmodel").write_bytes(b"spec" * 100)
    (pkg / "Data" / "com.apple.CoreML" / "weights" / "weight.bin").write_bytes(bytes(range(256)))
    if extra:
        (pkg / "Data" / "extra.txt").write_text("x")
    for p in [pkg, *pkg.rglob("*")]:
        os.utime(p, (mtime, mtime))
    return pkg


def test_identical_output_packs_to_identical_sha256_regardless_of_times_and_order(tmp_path):
    a = pack_directory(make_tree(tmp_path / "a", mtime=1_000), tmp_path / "a.tar")
    # Same content created later, in a different order, with other permissions.
    b_root = tmp_path / "b"
    pkg = b_root / "model.mlpackage"
    (pkg / "Data" / "com.apple.CoreML" / "weights").mkdir(parents=True)
    (pkg / "Data" / "com.apple.CoreML" / "weights" / "weight.bin").write_bytes(bytes(range(256)))
    (pkg / "Data" / "com.apple.CoreML" / "model.mlmodel").write_bytes(b"spec" * 100)
    (pkg / "Manifest.json").write_text('{"fileFormatVersion": "1.0.0"}')
    (pkg / "Manifest.json").chmod(0o600)
    for p in [pkg, *pkg.rglob("*")]:
        os.utime(p, (2_000_000_000, 2_000_000_000))
    b = pack_directory(pkg, tmp_path / "b.tar")

    assert a.sha256 == b.sha256 and a.length == b.length
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()


def test_changed_content_changes_sha256(tmp_path):
    a = pack_directory(make_tree(tmp_path / "a", mtime=0), tmp_path / "a.tar")
    b = pack_directory(make_tree(tmp_path / "b", mtime=0, extra=True), tmp_path / "b.tar")
    assert a.sha256 != b.sha256


def test_archive_is_uncompressed_with_fixed_owners_and_sorted_entries(tmp_path):
    packed = pack_directory(make_tree(tmp_path, mtime=123), tmp_path / "m.tar")
    with tarfile.open(packed.path, mode="r:") as tar:  # "r:" refuses compressed input
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names) and names[0] == "model.mlpackage"
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(0, 0, 0, "", "")}
    # Weights are stored as plain bytes, so a delta between releases sees unchanged tensors.
    assert bytes(range(256)) in packed.path.read_bytes()


def test_archive_ends_at_its_end_of_archive_blocks_without_record_padding(tmp_path):
    """tarfile pads to a 10 KiB record; the shipped artifact stops at the two zero blocks."""
    packed = pack_directory(make_tree(tmp_path, mtime=0), tmp_path / "m.tar")
    data = packed.path.read_bytes()
    with tarfile.open(packed.path, mode="r:") as tar:
        members = tar.getmembers()
        last = members[-1]
        end = last.offset_data + -(-last.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    assert packed.length == len(data) == end + 2 * tarfile.BLOCKSIZE
    assert data[end:] == bytes(2 * tarfile.BLOCKSIZE) and packed.length % tarfile.RECORDSIZE
    # Both unpackers (server, and the SDK's plain tarfile.open) read it whole.
    root = unpack_directory(packed.path, tmp_path / "out")
    assert (root / "Data/com.apple.CoreML/weights/weight.bin").read_bytes() == bytes(range(256))
    with tarfile.open(packed.path) as tar:
        assert [m.name for m in tar.getmembers()] == [m.name for m in members]


def test_unpack_round_trips_the_tree(tmp_path):
    src = make_tree(tmp_path / "src", mtime=5)
    packed = pack_directory(src, tmp_path / "m.tar")
    root = unpack_directory(packed.path, tmp_path / "out")
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == \
        sorted(p.relative_to(src).as_posix() for p in src.rglob("*"))
    assert (root / "Data/com.apple.CoreML/weights/weight.bin").read_bytes() == bytes(range(256))


def test_symlink_inside_artifact_is_refused_and_nothing_is_left_behind(tmp_path):
    src = make_tree(tmp_path / "src", mtime=0)
    (src / "link").symlink_to("/etc/passwd")
    with pytest.raises(PackingError, match="symlink"):
        pack_directory(src, tmp_path / "m.tar")
    assert not (tmp_path / "m.tar").exists() and not (tmp_path / "m.tar.partial").exists()


def test_single_file_artifact_is_copied_and_hashed(tmp_path):
    f = tmp_path / "model.onnx"
    f.write_bytes(b"onnx-bytes")
    packed = pack(f, tmp_path / "out")
    assert packed.packing == "file" and packed.length == 10
    assert packed.sha256 == hashlib.sha256(b"onnx-bytes").hexdigest()


def test_real_core_ml_package_packs_reproducibly(convnet, tmp_path):
    """Two independent conversions of the same model give byte-identical archives."""
    from server.compile import CompileRequest, SourceFormat
    from server.compile.compilers.coreml import CoreMLCompiler

    req = CompileRequest(convnet.pt2, SourceFormat.EXPORTED_PROGRAM, convnet.inputs)
    shas = []
    for i in range(2):
        work = tmp_path / f"w{i}"
        work.mkdir()
        (art,) = CoreMLCompiler().compile(req, work)
        shas.append(pack(art.path, work / "packed").sha256)
    assert shas[0] == shas[1]
