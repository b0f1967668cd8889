"""client_sdk.patching.apply_patch: round trips, corruption, caps, atomic output."""

from __future__ import annotations

import struct
from pathlib import Path

import bsdiff4
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client_sdk import patching
from client_sdk.patching import (
    BaseMismatchError,
    CorruptPatchError,
    OutputTooLargeError,
    PatchError,
    UnknownAlgorithmError,
    apply_patch,
)
from server.delta.mfdelta1 import create_mfdelta1

ALGORITHMS = ("bsdiff4", "mfdelta1")
FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def create(algorithm: str, base: Path, new: Path, patch: Path) -> None:
    if algorithm == "bsdiff4":
        bsdiff4.file_diff(str(base), str(new), str(patch))
    else:
        create_mfdelta1(base, new, patch)


def write_files(directory: Path, old: bytes, new: bytes) -> tuple[Path, Path]:
    base, target = directory / "base.bin", directory / "new.bin"
    base.write_bytes(old)
    target.write_bytes(new)
    return base, target


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".part"))


@st.composite
def related_pairs(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(old, new) where new is old with random edits: inserts, deletes, overwrites, nudges."""
    old = draw(st.binary(max_size=3000))
    new = bytearray(old)
    for _ in range(draw(st.integers(0, 6))):
        pos = draw(st.integers(0, len(new)))
        action = draw(st.sampled_from(["insert", "delete", "overwrite", "nudge"]))
        chunk = draw(st.binary(min_size=1, max_size=200))
        if action == "insert":
            new[pos:pos] = chunk
        elif action == "delete":
            del new[pos : pos + len(chunk)]
        elif action == "overwrite":
            new[pos : pos + len(chunk)] = chunk
        else:
            for i in range(pos, min(len(new), pos + len(chunk))):
                new[i] = (new[i] + 1) % 256
    return old, bytes(new)


ANY_PAIR = st.tuples(st.binary(max_size=2000), st.binary(max_size=2000))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@FUZZ
@given(pair=st.one_of(ANY_PAIR, related_pairs()))
def test_apply_of_create_reproduces_new_for_any_byte_pair(
    tmp_path: Path, algorithm: str, pair: tuple[bytes, bytes]
) -> None:
    old, new = pair
    base, target = write_files(tmp_path, old, new)
    create(algorithm, base, target, tmp_path / "patch")
    apply_patch(algorithm, base, tmp_path / "patch", tmp_path / "out", max_output=len(new))
    assert (tmp_path / "out").read_bytes() == new
    assert leftovers(tmp_path) == []


@FUZZ
@given(
    count=st.integers(1, 20000),
    dtype=st.sampled_from(["<f4", "<f2", "i1", "<i8"]),
    scale=st.sampled_from([0.0, 1e-6, 1e-3, 1.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_mfdelta1_round_trips_perturbed_numeric_arrays(
    tmp_path: Path, count: int, dtype: str, scale: float, seed: int
) -> None:
    # Non-ONNX numeric data exercises the generic path (same-offset differences).
    rng = np.random.default_rng(seed)
    old = rng.standard_normal(count) * 50
    new = old * (1 + scale * rng.standard_normal(count))
    base, target = write_files(
        tmp_path, old.astype(dtype).tobytes(), new.astype(dtype).tobytes()
    )
    create_mfdelta1(base, target, tmp_path / "patch")
    apply_patch("mfdelta1", base, tmp_path / "patch", tmp_path / "out", max_output=10**9)
    assert (tmp_path / "out").read_bytes() == target.read_bytes()


@pytest.fixture
def mfdelta1_case(tmp_path: Path) -> tuple[Path, Path, bytes]:
    rng = np.random.default_rng(1)
    old = rng.standard_normal(70_000).astype("<f4")
    new = old.copy()
    new[5000:9000] += 1e-3
    base, target = write_files(tmp_path, b"header" + old.tobytes(), b"header" + new.tobytes())
    patch = tmp_path / "patch"
    create_mfdelta1(base, target, patch)
    return base, patch, target.read_bytes()


@FUZZ
@given(data=st.data())
def test_mfdelta1_any_flipped_byte_never_yields_anything_but_the_exact_target(
    tmp_path: Path, mfdelta1_case: tuple[Path, Path, bytes], data: st.DataObject
) -> None:
    """A damaged patch is refused (PatchError, nothing written) unless the damage is in bits
    the decoder ignores, and then the output is still exactly the target: apply_patch holds
    every output to the target's sha256 in the header. (Hypothesis found such bits: zstd's
    frame header has an unused bit, see the next test.)"""
    base, patch, target = mfdelta1_case
    damaged = bytearray(patch.read_bytes())
    pos = data.draw(st.integers(0, len(damaged) - 1))
    damaged[pos] ^= data.draw(st.integers(1, 255))
    bad = tmp_path / "bad.patch"
    bad.write_bytes(bytes(damaged))
    out = tmp_path / "flipped.out"
    try:
        apply_patch("mfdelta1", base, bad, out, max_output=10**9)
    except PatchError:
        assert not out.exists()
    else:
        assert out.read_bytes() == target
        out.unlink()  # (tmp_path is shared by every example)
    assert leftovers(tmp_path) == []


def test_mfdelta1_flip_of_a_bit_zstd_ignores_still_gives_the_exact_target(
    tmp_path: Path, mfdelta1_case: tuple[Path, Path, bytes]
) -> None:
    base, patch, target = mfdelta1_case
    damaged = bytearray(patch.read_bytes())
    frame = damaged.index(b"\x28\xb5\x2f\xfd")  # the first zstd frame's magic number
    damaged[frame + 4] ^= 0x10  # Frame_Header_Descriptor bit 4: "unused", decoders ignore it
    bad = tmp_path / "bad.patch"
    bad.write_bytes(bytes(damaged))
    apply_patch("mfdelta1", base, bad, tmp_path / "out", max_output=10**9)
    assert (tmp_path / "out").read_bytes() == target


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@FUZZ
@given(cut=st.floats(0, 0.999))
def test_truncated_patch_raises_corrupt_patch_error_and_writes_nothing(
    tmp_path: Path, algorithm: str, cut: float
) -> None:
    rng = np.random.default_rng(2)
    old = rng.integers(0, 256, 20_000, dtype=np.uint8).tobytes()
    new = old[:5000] + b"inserted" + old[5000:]
    base, target = write_files(tmp_path, old, new)
    patch = tmp_path / "patch"
    if not patch.exists():
        create(algorithm, base, target, patch)
    whole = patch.read_bytes()
    truncated = tmp_path / "truncated.patch"
    truncated.write_bytes(whole[: int(len(whole) * cut)])
    out = tmp_path / "truncated.out"
    with pytest.raises(CorruptPatchError):
        apply_patch(algorithm, base, truncated, out, max_output=len(new))
    assert not out.exists()
    assert leftovers(tmp_path) == []


def test_bsdiff4_corrupted_diff_block_raises_corrupt_patch_error(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    old = rng.integers(0, 256, 50_000, dtype=np.uint8).tobytes()
    new = bytes(b ^ 1 if i % 97 == 0 else b for i, b in enumerate(old))
    base, target = write_files(tmp_path, old, new)
    patch = tmp_path / "patch"
    create("bsdiff4", base, target, patch)
    damaged = bytearray(patch.read_bytes())
    (len_control,) = struct.unpack("<q", damaged[8:16])
    damaged[32 + len_control + 40] ^= 0x55  # inside the bz2 diff block
    patch.write_bytes(bytes(damaged))
    with pytest.raises(CorruptPatchError):
        apply_patch("bsdiff4", base, patch, tmp_path / "out", max_output=len(new))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_output_above_max_output_raises_and_writes_nothing(tmp_path: Path, algorithm: str) -> None:
    base, target = write_files(tmp_path, b"a" * 1000, b"a" * 1000 + b"b" * 1000)
    create(algorithm, base, target, tmp_path / "patch")
    with pytest.raises(OutputTooLargeError):
        apply_patch(algorithm, base, tmp_path / "patch", tmp_path / "out", max_output=1999)
    assert not (tmp_path / "out").exists()
    apply_patch(algorithm, base, tmp_path / "patch", tmp_path / "out", max_output=2000)
    assert (tmp_path / "out").read_bytes() == target.read_bytes()


def test_unknown_algorithm_raises_unknown_algorithm_error(tmp_path: Path) -> None:
    base, _ = write_files(tmp_path, b"x", b"y")
    with pytest.raises(UnknownAlgorithmError, match="full artifact"):
        apply_patch("xdelta3", base, base, tmp_path / "out", max_output=10)
    assert not (tmp_path / "out").exists()


def test_mfdelta1_on_a_different_base_raises_base_mismatch(
    tmp_path: Path, mfdelta1_case: tuple[Path, Path, bytes]
) -> None:
    base, patch, _ = mfdelta1_case
    other = tmp_path / "other-base"
    other.write_bytes(base.read_bytes()[:-1] + b"\0")
    with pytest.raises(BaseMismatchError):
        apply_patch("mfdelta1", other, patch, tmp_path / "out", max_output=10**9)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_failed_apply_leaves_an_existing_output_untouched(tmp_path: Path, algorithm: str) -> None:
    base, target = write_files(tmp_path, b"old" * 100, b"new" * 100)
    out = tmp_path / "model.onnx"
    out.write_bytes(b"the running model")
    create(algorithm, base, target, tmp_path / "patch")
    (tmp_path / "patch").write_bytes((tmp_path / "patch").read_bytes()[:-5])
    with pytest.raises(PatchError):
        apply_patch(algorithm, base, tmp_path / "patch", out, max_output=10**6)
    assert out.read_bytes() == b"the running model"
    assert leftovers(tmp_path) == []


def _mfdelta1_with_op(base: Path, record: bytes, streams: bytes, out_length: int) -> bytes:
    """A hand-built patch: one op record, the given data section, a placeholder out hash."""
    import hashlib

    import zstandard

    base_bytes = base.read_bytes()
    table = zstandard.ZstdCompressor().compress(record)
    header = patching.HEADER.pack(
        patching.MAGIC, 0, len(base_bytes), hashlib.sha256(base_bytes).digest(),
        out_length, b"\0" * 32, 1, patching.HEADER.size + len(streams), len(table), len(record),
    )
    return header + streams + table


def test_mfdelta1_op_longer_than_the_format_cap_is_refused_before_decoding(
    tmp_path: Path,
) -> None:
    base, _ = write_files(tmp_path, b"\0" * 64, b"")
    length = patching.MAX_OP_LENGTH + 8
    op = patching.OP_HEADER.pack(patching.OP_PLANES, 4, 0, length, 0, 0) + b"\0" * 16
    patch = tmp_path / "patch"
    patch.write_bytes(_mfdelta1_with_op(base, op, b"", length))
    with pytest.raises(CorruptPatchError, match="cap"):
        apply_patch("mfdelta1", base, patch, tmp_path / "out", max_output=10**9)


def test_mfdelta1_stream_declaring_another_size_than_its_op_is_refused(tmp_path: Path) -> None:
    import zstandard

    base, _ = write_files(tmp_path, b"\0" * 64, b"")
    frame = zstandard.ZstdCompressor().compress(b"\0" * 5000)  # op says 100 bytes
    op = patching.OP_HEADER.pack(patching.OP_ZSTD, 1, 0, 100, 0, 0) + struct.pack("<I", len(frame))
    patch = tmp_path / "patch"
    patch.write_bytes(_mfdelta1_with_op(base, op, frame, 100))
    with pytest.raises(CorruptPatchError, match="declares"):
        apply_patch("mfdelta1", base, patch, tmp_path / "out", max_output=10**9)


def test_mfdelta1_copy_past_the_base_end_is_refused(tmp_path: Path) -> None:
    base, _ = write_files(tmp_path, b"\0" * 64, b"")
    op = patching.OP_HEADER.pack(patching.OP_COPY, 1, 0, 65, 0, 0)
    patch = tmp_path / "patch"
    patch.write_bytes(_mfdelta1_with_op(base, op, b"", 65))
    with pytest.raises(CorruptPatchError, match="past the base"):
        apply_patch("mfdelta1", base, patch, tmp_path / "out", max_output=10**9)


@pytest.fixture
def tiny_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shrink the encoder's piece sizes so small inputs cross many op boundaries."""
    from server.delta import mfdelta1

    monkeypatch.setattr(mfdelta1, "TENSOR_CHUNK", 1024)
    monkeypatch.setattr(mfdelta1, "GAP_CHUNK", 512)
    monkeypatch.setattr(mfdelta1, "REF_SLACK", 128)
    monkeypatch.setattr(mfdelta1, "REF_BUDGET", 1024)
    monkeypatch.setattr(mfdelta1, "GAP_DIFF_MIN", 64)
    monkeypatch.setattr(mfdelta1, "MIN_BIT_PLANE_ELEMENTS", 16)


@FUZZ
@given(pair=related_pairs(), numeric=st.booleans())
def test_mfdelta1_round_trips_across_many_small_ops(
    tmp_path: Path, tiny_chunks: None, pair: tuple[bytes, bytes], numeric: bool
) -> None:
    old, new = pair
    if numeric:  # float-like data so the difference encodings win some pieces
        old = np.linspace(0, 1, 1500, dtype="<f4").tobytes() + old
        new = (np.linspace(0, 1, 1500, dtype="<f4") * 1.0001).astype("<f4").tobytes() + new
    base, target = write_files(tmp_path, old, new)
    create_mfdelta1(base, target, tmp_path / "patch")
    apply_patch("mfdelta1", base, tmp_path / "patch", tmp_path / "out", max_output=len(new))
    assert (tmp_path / "out").read_bytes() == new


@pytest.mark.parametrize("width", [1, 2, 4, 8])
@pytest.mark.parametrize("count", [1, 7, 8, 9, 1000, 4097])
def test_bit_planes_match_the_spec_definition_and_join_back(width: int, count: int) -> None:
    from server.delta.mfdelta1 import _bit_planes

    rng = np.random.default_rng(count * width)
    values = rng.integers(0, 2**63, count, dtype=np.uint64).astype(f"<u{width}")
    planes = _bit_planes(values, width)
    # docs/delta.md: plane j = np.packbits(bit j of each element), first element in bit 7.
    spec = [
        np.packbits(((values >> np.array(j, dtype=values.dtype)) & 1).astype(np.uint8))
        for j in range(8 * width)
    ]
    assert [p.tobytes() for p in planes] == [s.tobytes() for s in spec]
    joined = patching.join_bit_planes([p.tobytes() for p in planes], count, width)
    assert np.array_equal(joined, values)


def test_bsdiff4_block_inflating_past_the_output_size_is_refused(tmp_path: Path) -> None:
    import bz2

    from bsdiff4.core import encode_int64

    base, _ = write_files(tmp_path, b"\0" * 100, b"")
    control = bz2.compress(encode_int64(100) + encode_int64(0) + encode_int64(0))
    bomb = bz2.compress(b"\0" * (8 * 1024 * 1024))  # 8 MiB of diff for a 100-byte output
    header = b"BSDIFF40" + encode_int64(len(control)) + encode_int64(len(bomb)) + encode_int64(100)
    patch = tmp_path / "patch"
    patch.write_bytes(header + control + bomb + bz2.compress(b""))
    with pytest.raises(CorruptPatchError, match="larger than the output"):
        apply_patch("bsdiff4", base, patch, tmp_path / "out", max_output=10**9)
    assert not (tmp_path / "out").exists()


def test_mfdelta1_op_table_above_the_cap_is_refused(tmp_path: Path) -> None:
    import hashlib

    base, _ = write_files(tmp_path, b"\0" * 64, b"")
    header = patching.HEADER.pack(
        patching.MAGIC, 0, 64, hashlib.sha256(b"\0" * 64).digest(), 1, b"\0" * 32, 1,
        patching.HEADER.size, 10, patching.MAX_TABLE_LENGTH + 1,
    )
    patch = tmp_path / "patch"
    patch.write_bytes(header + b"\0" * 10)
    with pytest.raises(CorruptPatchError, match="exceeds cap"):
        apply_patch("mfdelta1", base, patch, tmp_path / "out", max_output=10**9)
