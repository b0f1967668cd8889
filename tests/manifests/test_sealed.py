"""The sealed-file format of protected releases (manifests/sealed.py): round trips across
chunk boundaries, and every tampering a bucket or network attacker can try fails loudly with
`SealedError`, never with wrong bytes."""

from __future__ import annotations

import io
import os

import pytest

import manifests
from manifests import Sealed, SealedError, sealed

KEY = bytes(range(32))


def _seal(data: bytes, chunk: int = 64, key: bytes = KEY) -> bytes:
    return b"".join(sealed.seal(key, [data[i:i + 7] for i in range(0, len(data), 7)], chunk))


def _open(blob: bytes, key: bytes = KEY) -> bytes:
    return b"".join(sealed.unseal(key, io.BytesIO(blob)))


@pytest.mark.parametrize("size", [0, 1, 63, 64, 65, 128, 1000])
def test_round_trip_across_chunk_boundaries(size):
    data = os.urandom(size)
    blob = _seal(data)
    assert _open(blob) == data
    assert len(blob) == sealed.sealed_length(size, 64)
    assert data not in blob or size < 16  # a short plaintext may occur by chance


def test_each_seal_is_fresh_so_equal_plaintexts_do_not_show():
    assert _seal(b"x" * 100) != _seal(b"x" * 100)


def test_wrong_key_is_refused():
    with pytest.raises(SealedError, match="does not decrypt"):
        _open(_seal(b"weights" * 50), key=bytes(32))


def test_truncated_stream_is_refused():
    blob = _seal(os.urandom(300))
    for cut in (len(blob) - 1, len(blob) - 17, 36 + 64 + 17):
        with pytest.raises(SealedError):
            _open(blob[:cut])


def test_reordered_chunks_are_refused():
    blob = _seal(os.urandom(64 * 3 + 10))
    head, step = 36, 64 + 17
    chunks = [blob[head + i * step:head + (i + 1) * step] for i in range(3)]
    swapped = blob[:head] + chunks[1] + chunks[0] + chunks[2] + blob[head + 3 * step:]
    with pytest.raises(SealedError):
        _open(swapped)


def test_flipped_bit_is_refused():
    blob = bytearray(_seal(os.urandom(200)))
    blob[60] ^= 1
    with pytest.raises(SealedError):
        _open(bytes(blob))


def test_appended_bytes_are_refused():
    for data in (b"abc", os.urandom(64 * 2)):  # a short and an empty final chunk
        with pytest.raises(SealedError):
            _open(_seal(data) + b"more")


def test_a_plain_file_is_not_taken_for_a_sealed_one():
    with pytest.raises(SealedError, match="not a sealed"):
        _open(b"\x08\x08onnx model bytes" * 4)


def test_seal_file_reports_both_digests():
    import hashlib

    data = os.urandom(5000)
    out = io.BytesIO()
    plain_sha, plain_n, sha, n = sealed.seal_file(KEY, io.BytesIO(data), out)
    assert (plain_sha, plain_n) == (hashlib.sha256(data).hexdigest(), len(data))
    assert (sha, n) == (hashlib.sha256(out.getvalue()).hexdigest(), len(out.getvalue()))


def test_manifest_artifact_carries_sealed_and_old_documents_stay_byte_identical():
    art = manifests.Artifact("onnx", "", "onnx", "v1/artifacts/x", 10, "a" * 64)
    assert "sealed" not in art.to_dict()
    marked = manifests.Artifact("onnx", "", "onnx", "v1/artifacts/x", 10, "a" * 64,
                                sealed=Sealed("b" * 64, 7))
    back = manifests.Artifact.from_dict(marked.to_dict())
    assert back.sealed == Sealed("b" * 64, 7)
    with pytest.raises(manifests.MalformedError):
        manifests.Artifact.from_dict({**marked.to_dict(), "sealed": {"scheme": "rot13",
                                      "plain_sha256": "b" * 64, "plain_length": 7}})
