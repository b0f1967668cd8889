"""An ONNX model uploaded with its external-data file (multipart field `model_data`).

Exporters keep large weights beside the graph: torch.onnx.export(..., external_data=True)
writes `model.onnx` + `model.onnx.data`, Optimum `model.onnx_data`, onnx.save with
save_as_external_data=True whatever `location` it was given. The upload takes the .onnx and
its one data file, and the registry stores a single-file ONNX with the weights inlined, so
every later step (sandboxed compile, gates, hashing, patches) sees one self-contained file
as before.

The data file is hostile input like the model. onnx's own loader reads each tensor
(`load_external_data_for_tensor`: offset/length checked against the file), from a private
directory holding nothing but the uploaded bytes under the one name every tensor uses;
that name must be a bare file name, never a path. The bytes the tensors claim are counted
before each read and may not exceed the data file's size, so tensors that all point at one
region cannot multiply a small upload into gigabytes of memory; each loaded tensor must fill
its declared shape (onnx's `to_array`).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import BinaryIO

import onnx
from onnx.external_data_helper import ExternalDataInfo, load_external_data_for_tensor
from onnx.numpy_helper import to_array

from server.errors import InvalidInputError, PayloadTooLargeError, UnsupportedFileError
from server.services.sourcefiles import (
    MAX_ONNX_BYTES,
    check_onnx_self_contained,
    is_external,
    onnx_tensors,
)

MODEL_DATA_FIELD = "model_data"
SINGLE_FILE_FIX = ("save the weights to one file beside the model: onnx.save(model, path, "
                   "save_as_external_data=True, all_tensors_to_one_file=True, "
                   "location='model.onnx.data'), or export a single file "
                   "(torch.onnx.export(..., external_data=False))")


def inline_external_data(model: onnx.ModelProto, data: BinaryIO, *, max_bytes: int) -> None:
    """Loads every external tensor of `model` from `data` (the uploaded `model_data`), in
    place: afterwards the model is self-contained. Refuses (naming the tensor and the fix) a
    model with no external tensors, tensors spread over several files, a `location` that is
    not a bare file name, ranges outside the file, tensors the bytes do not fill, and a
    merged model past `max_bytes` or protobuf's 2 GiB."""
    external = [(where, t) for where, t in onnx_tensors(model) if is_external(t)]
    if not external:
        raise InvalidInputError(
            f"file field {MODEL_DATA_FIELD!r} was given, but the ONNX model keeps all its "
            "tensors inline and reads no external-data file", field=MODEL_DATA_FIELD,
            fix="upload the .onnx alone")
    location = _one_location(external)
    limit = min(max_bytes, MAX_ONNX_BYTES)
    size = data.seek(0, 2)
    total = model.ByteSize()
    with tempfile.TemporaryDirectory(prefix="mf-onnx-data-") as private:
        data.seek(0)
        with open(Path(private) / location, "wb") as copy:
            shutil.copyfileobj(data, copy, 1024 * 1024)
        data.seek(0)
        claimed = 0
        for where, tensor in external:
            claimed += _claimed_bytes(tensor, where, size)
            if claimed > size:  # exporters lay tensors end to end, never over each other
                raise _bad_range(tensor, where, f"the tensors claim more bytes ({claimed}) "
                                 f"than the {size}-byte data file holds: their ranges overlap")
            if total + claimed > limit:
                raise _too_large(limit, max_bytes)
            _load(tensor, where, private)
    check_onnx_self_contained(model)  # every tensor onnx_tensors saw is inline now


def _one_location(external: list[tuple[str, onnx.TensorProto]]) -> str:
    locations = {_location(t) for _, t in external}
    if len(locations) != 1:
        shown = ", ".join(sorted(repr(loc) for loc in locations)[:5])
        raise UnsupportedFileError(
            f"the ONNX model reads its tensors from {len(locations)} external-data files "
            f"({shown}); one data file is uploaded beside it (field {MODEL_DATA_FIELD!r})",
            field=MODEL_DATA_FIELD, fix=SINGLE_FILE_FIX)
    location = locations.pop()
    bare = (location not in ("", ".", "..") and "\0" not in location
            and PurePosixPath(location).name == location
            and PureWindowsPath(location).name == location and len(location.encode()) <= 255)
    if not bare:
        where = next(w for w, t in external if _location(t) == location)
        raise UnsupportedFileError(
            f"the ONNX model's external-data location {location[:200]!r} (in {where}) is not "
            "a file name beside the model; a path there would make a loader read another "
            "file of the machine", field="model", fix=SINGLE_FILE_FIX)
    return location


def _location(tensor: onnx.TensorProto) -> str:
    return next((e.value for e in tensor.external_data if e.key == "location"), "")


def _claimed_bytes(tensor: onnx.TensorProto, where: str, size: int) -> int:
    """What onnx's loader will read for `tensor`: `length`, or the rest of the file."""
    try:
        info = ExternalDataInfo(tensor)
    except ValueError as e:  # offset / length not a non-negative integer
        raise _bad_range(tensor, where, str(e)) from None
    offset = info.offset or 0
    if offset > size or (info.length is not None and offset + info.length > size):
        raise _bad_range(tensor, where, f"offset {offset} and length {info.length} reach "
                         f"past the end of the {size}-byte data file")
    return int(info.length) if info.length is not None else size - offset


def _load(tensor: onnx.TensorProto, where: str, private: str) -> None:
    if tensor.data_type == onnx.TensorProto.STRING:
        raise _bad_range(tensor, where, "a string tensor cannot be stored as external data")
    try:
        load_external_data_for_tensor(tensor, private)
        to_array(tensor)  # the bytes fill the declared shape and type, no more, no less
    except (ValueError, TypeError, OSError, onnx.checker.ValidationError) as e:
        raise _bad_range(tensor, where, str(e).splitlines()[0][:300]) from None


def _bad_range(tensor: onnx.TensorProto, where: str, why: str) -> UnsupportedFileError:
    return UnsupportedFileError(
        f"tensor {tensor.name[:200]!r} (in {where}) cannot be read from the uploaded "
        f"external-data file: {why}", field=MODEL_DATA_FIELD,
        fix="upload the data file that was saved with this .onnx (the pair from one export)")


def _too_large(limit: int, max_bytes: int) -> InvalidInputError | PayloadTooLargeError:
    if limit < max_bytes:  # protobuf's limit, not the server's cap
        return UnsupportedFileError(
            f"with its external data inlined, the ONNX model is larger than {limit} bytes, "
            "the most one ONNX file can hold (protobuf's limit on one message)",
            field=MODEL_DATA_FIELD, fix="upload the model as a .pt2 (torch.export.save)")
    return PayloadTooLargeError(
        f"the ONNX model with its external data is larger than the limit of {max_bytes} "
        "bytes", field=MODEL_DATA_FIELD,
        fix="upload a smaller model, or raise the server's size cap (MODELFLEET_MAX_MODEL_BYTES)")
