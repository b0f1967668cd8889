"""Property tests for resumable, capped downloads: any sequence of cuts ends in exactly the
signed bytes, never more than the signed length on disk, and tampering is always caught."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from client_sdk import FetchError, IntegrityError
from client_sdk.fetcher import Deadline, download_file
from tests.client.simulator import FakeClock, RepositorySimulator


def _download(sim: RepositorySimulator, url: str, part: Path, data: bytes) -> Path:
    return download_file(sim, "https://updates.example.test/" + url, part, length=len(data),
                         sha256=hashlib.sha256(data).hexdigest(),
                         deadline=Deadline(sim.clock, 60), request_timeout=5)


@settings(max_examples=40, deadline=None)
@given(data=st.binary(min_size=1, max_size=20_000),
       cuts=st.lists(st.floats(min_value=0.0, max_value=0.999), max_size=4),
       ignore_range=st.booleans())
def test_any_sequence_of_cuts_resumes_to_exactly_the_signed_bytes(data, cuts, ignore_range):
    sim = RepositorySimulator(FakeClock())
    sim.chunk = 997
    sim.faults.ignore_range = ignore_range
    url, _ = sim.add_blob(data)
    with tempfile.TemporaryDirectory() as tmp:
        part = Path(tmp) / "x.part"
        for frac in cuts:
            sim.faults.cut_after["/" + url] = int(frac * len(data))
            with pytest.raises(FetchError):
                _download(sim, url, part, data)
            assert not part.exists() or part.stat().st_size <= len(data)
        sim.faults.cut_after.clear()
        assert _download(sim, url, part, data).read_bytes() == data


@settings(max_examples=30, deadline=None)
@given(data=st.binary(min_size=2, max_size=5_000), flip=st.integers(min_value=0),
       cut=st.floats(min_value=0.0, max_value=0.999))
def test_a_flipped_byte_served_after_a_resume_is_caught(data, flip, cut):
    sim = RepositorySimulator(FakeClock())
    sim.chunk = 500
    url, _ = sim.add_blob(data)
    with tempfile.TemporaryDirectory() as tmp:
        part = Path(tmp) / "x.part"
        cut_at = int(cut * len(data))
        sim.faults.cut_after["/" + url] = cut_at
        with pytest.raises(FetchError):
            _download(sim, url, part, data)
        sim.faults.cut_after.clear()
        i = flip % len(data)
        sim.blobs["/" + url] = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
        if i < cut_at:  # the flip is in bytes already held: the resume never sees it
            assert _download(sim, url, part, data).read_bytes() == data
            return
        with pytest.raises(IntegrityError):
            _download(sim, url, part, data)
        assert not part.exists()
