"""Compressed artifact copies (manifests/compressed.py, client_sdk/compression.py): a device
downloads the smaller copy, inflates it capped at the signed content length, keeps the
content (so patches between contents still apply) and refuses bombs mid-stream."""

from __future__ import annotations

import hashlib
import io
import tracemalloc
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import zstandard

from client_sdk import Outcome, compression
from client_sdk.downloads import Downloader
from client_sdk.errors import IntegrityError
from client_sdk.fetcher import Deadline
from manifests import Artifact, Compressed, Sealed, sealed
from tests.client.onnx_models import check_whole, scaled_model
from tests.client.simulator import RepositorySimulator

X = np.arange(4, dtype=np.float32).reshape(1, 4)


def _zstd(data: bytes, level: int | None = None, codec: str = compression.CODEC) -> bytes:
    out = io.BytesIO()
    compression.compress(io.BytesIO(data), out, len(data), level, codec)
    return out.getvalue()


def _with_copy(sim: RepositorySimulator, art: Artifact, body: bytes,
               codec: str = compression.CODEC) -> Artifact:
    url, sha = sim.add_blob(body)
    return replace(art, compressed=Compressed(codec, url, len(body), sha))


def _inflate(copy: bytes, size: int, codec: str) -> bytes:
    out = io.BytesIO()
    compression.decompress(io.BytesIO(copy), out, size, codec)
    return out.getvalue()


B = compression.BLOCK


@pytest.mark.parametrize("codec", compression.CODECS)
@pytest.mark.parametrize("size", [1, 3, 4099, B - 1, B, B + 1, 2 * B + 3])
def test_every_codec_round_trips_around_block_and_element_edges(codec, size) -> None:
    """A shuffled copy is each BLOCK transposed, the tail shorter than an element left as
    it is: lengths at and around those edges inflate to the same bytes, reproducibly, and
    the output arrives in pieces of at most PIECE (what a device holds at once)."""
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    copy = _zstd(data, codec=codec)
    assert copy == _zstd(data, codec=codec)
    assert _inflate(copy, size, codec) == data
    pieces = list(compression.decompress_chunks(io.BytesIO(copy), size, codec))
    assert b"".join(pieces) == data and max(map(len, pieces)) <= compression.PIECE
    if codec != compression.CODEC and size >= 4:  # the transform is really applied
        assert zstandard.ZstdDecompressor().decompress(copy) != data


def test_a_source_with_short_reads_gives_the_same_shuffled_copy() -> None:
    """The blocks a device unshuffles are BLOCK bytes of content however the server's source
    returns them (a pipe, a socket: short reads)."""
    data = np.random.default_rng(5).standard_normal(B // 2 + 7).astype(np.float32).tobytes()

    class Trickle(io.BytesIO):
        def read(self, n: int | None = -1) -> bytes:
            return super().read(min(n, 4093) if n is not None and n >= 0 else 4093)

    for codec in compression.SHUFFLED:
        out = io.BytesIO()
        compression.compress(Trickle(data), out, len(data), codec=codec)
        assert out.getvalue() == _zstd(data, codec=codec)
        assert _inflate(out.getvalue(), len(data), codec) == data


def test_shuffle_is_the_byte_transpose_and_its_own_inverse() -> None:
    block = bytes(range(10))
    assert compression.shuffle(block, 2) == bytes([0, 2, 4, 6, 8, 1, 3, 5, 7, 9])
    assert compression.shuffle(block, 4) == bytes([0, 4, 1, 5, 2, 6, 3, 7, 8, 9])
    for element in (2, 4):
        assert compression.unshuffle(compression.shuffle(block, element), element) == block


def test_best_codec_follows_the_content_float_weights_shuffled_and_bytes_plain() -> None:
    """Float weights' sign-and-exponent bytes compress together once transposed: FP16
    weights take shuffle2, FP32 shuffle4; content without such a layout (INT8 weights,
    random bytes) keeps plain zstd, which every SDK reads."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal(200_000)
    int8 = np.clip(np.round(w * 127 / np.abs(w).max()), -127, 127).astype(np.int8)
    cases = {w.astype(np.float16).tobytes(): "zstd-shuffle2",
             w.astype(np.float32).tobytes(): "zstd-shuffle4", int8.tobytes(): "zstd",
             rng.integers(0, 256, 400_000, dtype=np.uint8).tobytes(): "zstd"}
    for data, want in cases.items():
        assert compression.best_codec(io.BytesIO(data), len(data)) == want
        if want != "zstd":
            assert len(_zstd(data, codec=want)) < 0.97 * len(_zstd(data))


def test_unknown_codec_is_refused_by_name_before_inflating() -> None:
    with pytest.raises(compression.DecompressionError, match="unknown codec 'zstd-shuffle3'"):
        _inflate(_zstd(b"abcd"), 4, "zstd-shuffle3")


def test_compression_is_reproducible_and_round_trips() -> None:
    data = scaled_model(1.0, padding=40_000)
    first, second = _zstd(data), _zstd(data)
    assert first == second and len(first) < len(data)
    out = io.BytesIO()
    digest = compression.decompress(io.BytesIO(first), out, len(data))
    assert out.getvalue() == data and digest == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("size", [compression.LARGE - 1, compression.LARGE])
def test_the_level_follows_the_size_and_large_content_stays_reproducible(size) -> None:
    """Level 19 below `LARGE` (small quantized packages gain from it), the fast level from it
    on (level 19 cost a MiniLM build 62 s of server CPU for nothing); both within the window
    a device accepts, and the same bytes every time."""
    rng = np.random.default_rng(0)
    weights = rng.standard_normal(size // 4 + 1).astype(np.float32).tobytes()
    data = (scaled_model(1.0) + weights)[:size]
    copy = _zstd(data)
    assert copy == _zstd(data)
    level = compression.LEVEL if size < compression.LARGE else compression.LARGE_LEVEL
    assert compression.level_for(size) == level
    assert copy == _zstd(data, level) != _zstd(data, 19 if level != 19 else 3)
    assert zstandard.get_frame_parameters(copy).window_size <= compression.MAX_WINDOW
    out = io.BytesIO()
    compression.decompress(io.BytesIO(copy), out, size)
    assert out.getvalue() == data


@pytest.mark.parametrize("codec", compression.CODECS)
def test_device_downloads_the_compressed_copy_and_keeps_the_content(make_updater, sim, runtime,
                                                                    codec):
    v1 = scaled_model(1.0, padding=40_000)
    art = _with_copy(sim, sim.artifact(v1), _zstd(v1, codec=codec), codec)
    sim.publish("clf", [sim.release("1.0", [art])])
    up = make_updater(runtime=runtime)
    assert up.check_once().outcome is Outcome.UPDATED
    paths = [f.path for f in sim.fetched("/blobs/")]
    assert paths == ["/" + art.compressed.url], "only the compressed copy is downloaded"
    bundle = up.store.active("clf")
    assert bundle.members[0].sha256 == art.sha256 and up.store.verify(bundle)
    assert bundle.member_path(bundle.members[0]).read_bytes() == v1
    assert check_whole(runtime.predict("clf", {"x": X}).outputs, X) == 1.0
    assert not list((up.config.data_dir / "downloads").glob("*")), "no leftovers"


def test_patch_applies_to_content_inflated_from_a_compressed_copy(make_updater, sim):
    v1 = scaled_model(1.0, padding=40_000)
    v2 = scaled_model(2.0, padding=40_000, tweak=10)
    a1 = _with_copy(sim, sim.artifact(v1), _zstd(v1))
    sim.publish("clf", [sim.release("1.0", [a1])])
    up = make_updater()
    up.check_once()
    patch = sim.patch(v1, v2)  # between the contents, not the compressed copies
    a2 = _with_copy(sim, sim.artifact(v2, patches=[patch]), _zstd(v2))
    sim.publish("clf", [sim.release("2.0", [a2]), sim.release("1.0", [a1])])
    sim.fetches.clear()
    assert up.check_once().outcome is Outcome.UPDATED
    assert [f.path for f in sim.fetched("/blobs/")] == ["/" + patch.url]
    assert up.store.verify(up.store.active("clf"))


def test_unknown_codec_downloads_the_content(make_updater, sim):
    v1 = scaled_model(1.0, padding=4000)
    art = sim.artifact(v1)
    url, sha = sim.add_blob(b"a codec this SDK does not know")
    art = replace(art, compressed=Compressed("brotli", url, 31, sha))
    sim.publish("clf", [sim.release("1.0", [art])])
    up = make_updater()
    assert up.check_once().outcome is Outcome.UPDATED
    assert [f.path for f in sim.fetched("/blobs/")] == ["/" + art.url]


def test_decompression_bomb_with_undeclared_size_is_refused_before_inflating() -> None:
    bomb = zstandard.ZstdCompressor(level=1, write_content_size=False).compress(
        b"\0" * (64 << 20))
    sink = io.BytesIO()
    with pytest.raises(compression.DecompressionError, match="declares"):
        compression.decompress(io.BytesIO(bomb), sink, 1000)
    assert sink.tell() == 0


def _lying_bomb(declared: int, real: int) -> bytes:
    """A frame whose header claims `declared` bytes of content but inflates to `real`."""
    frame = bytearray(zstandard.ZstdCompressor(level=1).compress(b"\0" * real))
    params = zstandard.get_frame_parameters(bytes(frame))
    assert params.content_size == real
    descriptor = frame[4]
    assert descriptor >> 6 == 2 and not descriptor & 0x20  # 4-byte size after the window byte
    frame[6:10] = declared.to_bytes(4, "little")
    assert zstandard.get_frame_parameters(bytes(frame)).content_size == declared
    return bytes(frame)


@pytest.mark.parametrize("codec", compression.CODECS)
def test_decompression_bomb_with_lying_header_is_refused_mid_stream(codec) -> None:
    declared, real = 1 << 20, 256 << 20
    bomb = _lying_bomb(declared, real)

    class Counting(io.RawIOBase):
        written = 0

        def write(self, b):  # type: ignore[override]
            self.written += len(b)
            return len(b)

    sink = Counting()
    tracemalloc.start()
    try:
        with pytest.raises(compression.DecompressionError):
            compression.decompress(io.BytesIO(bomb), sink, declared, codec)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sink.written <= declared, "never more than the signed length leaves the decoder"
    assert peak < 8 << 20, f"held {peak} bytes: the bomb was inflated in memory"


def test_decompression_bomb_from_the_manifest_falls_back_to_the_content(make_updater, sim):
    """A signed copy that is a bomb (a compromised or buggy publisher) is refused and
    deleted; the device installs the uncompressed artifact instead."""
    v1 = scaled_model(1.0, padding=4000)
    art = _with_copy(sim, sim.artifact(v1), _lying_bomb(len(v1), 64 << 20))
    sim.publish("clf", [sim.release("1.0", [art])])
    up = make_updater()
    assert up.check_once().outcome is Outcome.UPDATED
    assert [f.path for f in sim.fetched("/blobs/")] == ["/" + art.compressed.url, "/" + art.url]
    assert up.store.active("clf").member_path(up.store.active("clf").members[0]).read_bytes() \
        == v1


def test_copy_inflating_to_other_content_is_refused(make_updater, sim, events):
    v1, other = scaled_model(1.0, padding=4000), scaled_model(3.0, padding=4000)
    assert len(v1) == len(other)
    art = _with_copy(sim, sim.artifact(v1), _zstd(other))
    sim.publish("clf", [sim.release("1.0", [art])])
    up = make_updater()
    assert up.check_once().outcome is Outcome.UPDATED
    assert any("compressed copy unusable" in e.reason and "sha256" in e.reason for e in events)
    assert [f.path for f in sim.fetched("/blobs/")] == ["/" + art.compressed.url, "/" + art.url]
    assert up.store.verify(up.store.active("clf"))


@pytest.mark.parametrize("codec", compression.CODECS)
def test_protected_copy_is_opened_inflated_and_sealed_again(tmp_path: Path, make_updater,
                                                            sim, codec) -> None:
    """compress, then seal: the device undoes both as a stream and keeps the content sealed
    under the content key (its own sealed file, with its own sha256)."""
    key = sealed.new_key()
    plain = scaled_model(1.0, padding=40_000)
    served = b"".join(sealed.seal(key, [plain]))
    copy = b"".join(sealed.seal(key, [_zstd(plain, codec=codec)]))
    url, sha = sim.add_blob(copy)
    art = replace(sim.artifact(served),
                  sealed=Sealed(hashlib.sha256(plain).hexdigest(), len(plain)),
                  compressed=Compressed(codec, url, len(copy), sha))
    up = make_updater()
    dl = Downloader(up.config, sim, lambda: False)
    plan = SimpleNamespace(model="clf", release=SimpleNamespace(version="1.0"))
    target = tmp_path / "target"
    dl.dir.mkdir(parents=True, exist_ok=True)
    local = dl._fetch_compressed(plan, art, art.compressed, target,  # type: ignore[arg-type]
                                 Deadline(up.config.clock, 60), key)
    assert local is not None and local[0] == hashlib.sha256(target.read_bytes()).hexdigest()
    with target.open("rb") as f:
        assert b"".join(sealed.unseal(key, f)) == plain
    wrong = replace(art, sealed=Sealed("0" * 64, len(plain)))
    with pytest.raises(IntegrityError):
        dl._fetch_compressed(plan, wrong, art.compressed, tmp_path / "t2",  # type: ignore[arg-type]
                             Deadline(up.config.clock, 60), key)
    assert not (tmp_path / "t2").exists()
