"""Recognising uploads by content: ONNX parsed by protobuf (and its external-data trap),
.pt2, TorchScript, .npz."""

from __future__ import annotations

import io
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from server.errors import UnsupportedFileError
from server.services.npzcheck import check_npz_arrays
from server.services.sourcefiles import (
    MAX_ONNX_BYTES,
    check_onnx_self_contained,
    detect_model_format,
    read_onnx,
)
from tests.server.server_testdata import make_onnx_bytes, npz_bytes

INPUTS = [{"name": "a", "shapes": {"default": [2]}}]


def check_npz(f: io.BytesIO, *, field: str) -> None:
    check_npz_arrays(f, field=field, inputs=INPUTS, max_unpacked_bytes=1 << 20)


def big_onnx(path: Path, mib: int) -> None:
    weights = np.zeros((mib, 256, 1024), dtype=np.float32)  # mib * 1 MiB
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y],
                              [numpy_helper.from_array(weights, name="w")])
    onnx.save_model(helper.make_model(graph), path)


def test_large_onnx_is_parsed_by_protobuf_with_memory_of_its_own_size(tmp_path: Path) -> None:
    big_onnx(tmp_path / "big.onnx", 48)
    with (tmp_path / "big.onnx").open("rb") as f:
        tracemalloc.start()
        try:
            assert detect_model_format(f) == "onnx"
            check_onnx_self_contained(read_onnx(f))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    # The file's bytes once, read to be parsed (the parsed copy is protobuf's, in C).
    assert peak < 60 * 1024 * 1024, f"peak {peak} bytes for a 48 MiB model"


def test_onnx_past_protobufs_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.onnx"
    with path.open("wb") as f:
        f.truncate(MAX_ONNX_BYTES + 1)  # sparse: no disk used
    with path.open("rb") as f:
        tracemalloc.start()
        try:
            with pytest.raises(UnsupportedFileError, match="at most 2147483647 bytes"):
                read_onnx(f)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert f.tell() == 0
    assert peak < 1024 * 1024


def test_bytes_protobuf_cannot_parse_are_refused_as_not_an_onnx_model() -> None:
    # A graph field whose length runs past the end of the file.
    with pytest.raises(UnsupportedFileError, match="not a valid ONNX model") as e:
        read_onnx(io.BytesIO(b"\x08\x07\x3a\x40abc"))
    assert e.value.field == "model"


def test_external_data_onnx_is_refused(tmp_path: Path) -> None:
    model = onnx.load_model_from_string(make_onnx_bytes())
    onnx.save_model(model, tmp_path / "m.onnx", save_as_external_data=True,
                    location="m.onnx.data", size_threshold=0)
    with (tmp_path / "m.onnx").open("rb") as f:
        assert detect_model_format(f) == "onnx"
        with pytest.raises(UnsupportedFileError, match="external-data"):
            check_onnx_self_contained(read_onnx(f))


def test_self_contained_onnx_passes() -> None:
    check_onnx_self_contained(read_onnx(io.BytesIO(make_onnx_bytes())))


@pytest.mark.parametrize("data", [b"", b"\x08", b"\x08\x07\x3a\xff\xff", b"PK\x03\x04junk",
                                  b"GIF89a", b'{"not": "a model"}'])
def test_garbage_is_not_a_model(data: bytes) -> None:
    with pytest.raises(UnsupportedFileError) as e:
        detect_model_format(io.BytesIO(data))
    assert e.value.field == "model"


def test_npz_accepted_and_other_zip_refused(tmp_path: Path) -> None:
    check_npz(io.BytesIO(npz_bytes(a=np.zeros(2))), field="calibration")
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("notes.txt", "hi")
    with pytest.raises(UnsupportedFileError, match="'reference'"):
        check_npz(buf, field="reference")


def test_npz_per_variant_arrays_are_checked_against_their_own_variant() -> None:
    from server.errors import InvalidInputError

    inputs = [{"name": "x", "shapes": {"sd": [1, 3, 4, 4], "hd": [1, 3, 8, 8]}}]
    ok = npz_bytes(**{"x@sd": np.zeros((2, 1, 3, 4, 4), np.float32),
                      "x@hd": np.zeros((2, 1, 3, 8, 8), np.float32)})
    check_npz_arrays(io.BytesIO(ok), field="reference", inputs=inputs, max_unpacked_bytes=1 << 20)
    swapped = npz_bytes(**{"x@sd": np.zeros((2, 1, 3, 8, 8), np.float32)})
    with pytest.raises(InvalidInputError, match="shape variant 'sd'"):
        check_npz_arrays(io.BytesIO(swapped), field="reference", inputs=inputs,
                         max_unpacked_bytes=1 << 20)
