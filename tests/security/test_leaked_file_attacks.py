"""Hostile "leaked" files handed to `modelfleet watermark identify` (server/compile/weights.py
unpacks an .mlpackage carried as a tar or zip): an archive that unpacks to more than the disk
holds is refused from its headers, before anything is written. A forged model inside — a cut
spec, a blob header that points past its file, scales or block sizes shaped to broadcast
into gigabytes (server/compile/requantized.py) — is refused with a WeightsError naming the
part, which the command prints; never a traceback, never the allocation."""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
import tarfile
import tempfile
from pathlib import Path

import numpy as np
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


# ---- a forged .mlpackage: its spec, weight file and op shapes are the attacker's ------------

@pytest.fixture(scope="module")
def block_quantized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 1024 × 1024 linear layer, re-quantized by coremltools per block (iOS18)."""
    from tests.publish.test_watermark_files import coreml_package, requantized_by_coremltools

    tmp = tmp_path_factory.mktemp("forged")
    float16 = coreml_package(tmp / "fp16.mlpackage", target="iOS18")
    return requantized_by_coremltools(float16, tmp / "int8.mlpackage", mode="linear",
                                      granularity="per_block", block_size=32)


def _forged(src: Path, tmp_path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    pkg = shutil.copytree(src, tmp_path / "leak.mlpackage")
    edit(pkg / "Data" / "com.apple.CoreML")
    return pkg


def _identify_refuses(pkg: Path, why: str) -> None:
    from server.compile import requantized

    for read in (weights.read, requantized.leaked_copy):
        with pytest.raises(weights.WeightsError, match=why):
            read(pkg)


def test_leak_whose_blob_claims_more_bytes_than_its_weight_file_is_refused(
        block_quantized, tmp_path):
    # The first blob's header (after the file's 64-byte header: sentinel, dtype, size,
    # offset) declares 4 EiB: coremltools' reader checks the bound; the refusal names it.
    def edit(data: Path) -> None:
        blob = data / "weights" / "weight.bin"
        raw = bytearray(blob.read_bytes())
        assert raw[64:68] == b"\xef\xbe\xad\xde"
        raw[72:80] = struct.pack("<Q", 1 << 62)
        blob.write_bytes(bytes(raw))

    _identify_refuses(_forged(block_quantized, tmp_path, edit),
                      "blob at offset 64 cannot be read from weight.bin .*index out of bounds")


def test_leak_with_a_cut_spec_is_refused(block_quantized, tmp_path):
    def edit(data: Path) -> None:
        spec = data / "model.mlmodel"
        spec.write_bytes(spec.read_bytes()[:200])

    _identify_refuses(_forged(block_quantized, tmp_path, edit), "not a Core ML model spec")


@pytest.mark.parametrize("content", [b"", b"\xff" * 300], ids=["empty", "garbage"])
def test_leak_whose_weight_file_is_not_one_is_refused(block_quantized, tmp_path, content):
    def edit(data: Path) -> None:
        (data / "weights" / "weight.bin").write_bytes(content)

    _identify_refuses(_forged(block_quantized, tmp_path, edit), "cannot be read from weight.bin")


def test_leak_whose_scale_shape_would_broadcast_past_its_weights_is_refused(
        block_quantized, tmp_path):
    # The block scales (1024, 32) re-declared (32768, 1): coremltools' decompress would
    # repeat them 1,024 times along the last axis, 32M scales for 1M weights (a memory bomb
    # grows with the square of the claimed length).
    from coremltools.proto import Model_pb2

    def edit(data: Path) -> None:
        spec = Model_pb2.Model()
        spec.ParseFromString((data / "model.mlmodel").read_bytes())
        block = spec.mlProgram.functions["main"].block_specializations["CoreML8"]
        op = next(o for o in block.operations if o.type == "constexpr_blockwise_shift_scale")
        dims = op.inputs["scale"].arguments[0].value.type.tensorType.dimensions
        assert [d.constant.size for d in dims] == [1024, 32]
        dims[0].constant.size, dims[1].constant.size = 32768, 1
        (data / "model.mlmodel").write_bytes(spec.SerializeToString())

    from server.compile import requantized

    with pytest.raises(weights.WeightsError, match="does not fit weights of shape"):
        requantized.leaked_copy(_forged(block_quantized, tmp_path, edit))


# ---- a forged ONNX file ---------------------------------------------------------------

def _block_quantized_onnx(path: Path, *, block: int, scale_dims: tuple[int, ...],
                          forged_dims: tuple[int, ...] = ()) -> Path:
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(3)
    q = helper.make_tensor("W_quantized", TensorProto.INT8, (64, 64),
                           rng.integers(-127, 128, 64 * 64, dtype=np.int8).tobytes(), raw=True)
    if forged_dims:  # after make_tensor, which checks them
        q.dims[:] = forged_dims
    scale = helper.make_tensor("W_scale", TensorProto.FLOAT, scale_dims,
                               np.full(int(np.prod(scale_dims)), 0.01, np.float32))
    dq = helper.make_node("DequantizeLinear", ["W_quantized", "W_scale"], ["W"], axis=0,
                          block_size=block)
    mm = helper.make_node("MatMul", ["x", "W"], ["y"])
    graph = helper.make_graph(
        [dq, mm], "leak", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [q, scale])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), path)
    return path


def test_onnx_leak_whose_block_size_claims_a_trillion_is_read_without_allocating_it(tmp_path):
    # ⌈64 / 2^40⌉ = one block along axis 0: the scales are (1, 64), one per column. Repeating
    # them block_size times (how a reader might spread them) would ask for 2^46 floats.
    from server.compile import requantized

    leak = _block_quantized_onnx(tmp_path / "leak.onnx", block=1 << 40, scale_dims=(1, 64))
    copy, grids = requantized.leaked_copy(leak)
    assert copy["W"].shape == (64 * 64,)
    assert np.allclose(grids["W"].step, 0.01)


def test_onnx_leak_whose_initializer_dims_outgrow_its_data_is_refused(tmp_path):
    leak = _block_quantized_onnx(tmp_path / "leak.onnx", block=16, scale_dims=(4, 64),
                                 forged_dims=(1 << 20, 1 << 20))
    with pytest.raises(weights.WeightsError, match="W_quantized: its data does not fit"):
        weights.read(leak)
