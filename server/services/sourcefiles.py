"""Recognising uploaded files by their content, not their name: ONNX, torch ExportedProgram
(.pt2), TorchScript, and NumPy .npz archives. Formats are told from headers and zip
directories; the ONNX external-data check parses the model with protobuf (`read_onnx`), the
graph inputs are read field by field without loading the weights.
"""

from __future__ import annotations

import hashlib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import onnx
from google.protobuf.message import DecodeError

from server.compile.protoframe import is_onnx, read_varint
from server.errors import PayloadTooLargeError, UnsupportedFileError

CHUNK = 1024 * 1024
MODEL_FORMATS = ("onnx", "pt2", "torchscript")
MAX_ONNX_BYTES = 2**31 - 1

# ModelProto fields (onnx.proto3): number -> wire type (0 varint, 2 length-delimited).
_ONNX_GRAPH_FIELD = 7


@dataclass(frozen=True)
class FileDigest:
    sha256: str
    length: int


def digest_file(f: BinaryIO, *, field: str, max_bytes: int) -> FileDigest:
    """sha256 and length of a seekable upload, refusing it past `max_bytes`; rewinds `f`."""
    f.seek(0)
    sha = hashlib.sha256()
    length = 0
    while chunk := f.read(CHUNK):
        length += len(chunk)
        if length > max_bytes:
            raise PayloadTooLargeError(
                f"file field {field!r} is larger than the limit of {max_bytes} bytes",
                field=field,
                fix="upload a smaller file, or raise the server's size cap "
                "(MODELFLEET_MAX_MODEL_BYTES / MODELFLEET_MAX_NPZ_BYTES)",
            )
        sha.update(chunk)
    f.seek(0)
    return FileDigest(sha256=sha.hexdigest(), length=length)


def detect_model_format(f: BinaryIO) -> str:
    """'onnx', 'pt2' or 'torchscript'; raises UnsupportedFileError naming the `model` field."""
    f.seek(0)
    head = f.read(4)
    f.seek(0)
    try:
        if head.startswith(b"PK"):
            fmt = _torch_zip_format(f)
        elif is_onnx(f):
            fmt = "onnx"
        else:
            fmt = None
    finally:
        f.seek(0)
    if fmt is None:
        raise UnsupportedFileError(
            "file field 'model' is not an ONNX model, a torch ExportedProgram (.pt2) or a "
            "TorchScript archive",
            field="model",
            fix="upload a single-file .onnx (torch.onnx.export), a .pt2 (torch.export.save) "
            "or a TorchScript file (torch.jit.save)",
        )
    return fmt


def read_onnx(f: BinaryIO) -> onnx.ModelProto:
    """The uploaded ONNX model, parsed by protobuf (onnx's generated `ModelProto`), never by
    hand: what protobuf accepts here is what every ONNX loader accepts later — unknown fields
    and groups skipped, repeated messages merged. The whole file is parsed, so memory is the
    file's size, bounded by `max_model_bytes` (checked before) and by protobuf's 2 GiB limit
    on one message (a larger .onnx is refused before it is read); uploads are also limited in
    number (`max_concurrent_uploads`). Rewinds `f`."""
    size = f.seek(0, 2)
    f.seek(0)
    if size > MAX_ONNX_BYTES:
        raise UnsupportedFileError(
            f"file field 'model' is an ONNX file of {size} bytes; a single-file ONNX model "
            f"is at most {MAX_ONNX_BYTES} bytes (protobuf's limit on one message)",
            field="model", fix="upload the model as a .pt2 (torch.export.save), or shrink it")
    try:
        model: onnx.ModelProto = onnx.ModelProto.FromString(f.read())
        return model
    except DecodeError as e:  # also: nesting past protobuf's recursion limit
        raise UnsupportedFileError(
            f"file field 'model' is not a valid ONNX model: {e}", field="model",
            fix="re-export the model (torch.onnx.export) and check it with "
            "onnx.checker.check_model") from None
    finally:
        f.seek(0)


def check_onnx_self_contained(model: onnx.ModelProto) -> None:
    """Refuses an ONNX model that points at external data anywhere a tensor can appear: graph
    initializers, sparse initializers, `Constant` and other node attributes (t, tensors,
    sparse_tensor(s)), subgraphs (If/Loop/Scan bodies), functions and training graphs. Only
    the .onnx is uploaded, and a `location` such as ../../etc/hostname would make a loader
    read a file of the compile machine into the model."""
    where = _external_tensor(model)
    if where:
        raise UnsupportedFileError(
            f"file field 'model' is an ONNX model whose tensor data points at a separate "
            f"external-data file (in {where}); only the .onnx is uploaded, and external data "
            "is refused wherever a tensor can appear",
            field="model",
            fix="export a single file: torch.onnx.export(..., external_data=False), or "
            "onnx.save(model, path, save_as_external_data=False)",
        )


def _external(tensor: onnx.TensorProto) -> bool:
    return (tensor.data_location == onnx.TensorProto.EXTERNAL
            or len(tensor.external_data) > 0)


def _sparse_external(sparse: onnx.SparseTensorProto) -> bool:
    return _external(sparse.values) or _external(sparse.indices)


def _external_tensor(model: onnx.ModelProto) -> str:
    """Where ("graph > node > attribute > tensor") the first external-data tensor is; ""."""
    graphs: list[tuple[str, onnx.GraphProto]] = [("graph", model.graph)]
    for training in model.training_info:
        graphs += [("training > graph", training.initialization),
                   ("training > graph", training.algorithm)]
    nodes: list[tuple[str, onnx.NodeProto]] = [
        ("function > node", n) for function in model.functions for n in function.node]
    while graphs or nodes:
        if graphs:
            where, graph = graphs.pop()
            if any(_external(t) for t in graph.initializer):
                return f"{where} > tensor"
            if any(_sparse_external(t) for t in graph.sparse_initializer):
                return f"{where} > sparse > tensor"
            nodes += [(f"{where} > node", n) for n in graph.node]
            continue
        where, node = nodes.pop()
        for attribute in node.attribute:
            at = f"{where} > attribute"
            if _external(attribute.t) or any(_external(t) for t in attribute.tensors):
                return f"{at} > tensor"
            if _sparse_external(attribute.sparse_tensor) or any(
                    _sparse_external(t) for t in attribute.sparse_tensors):
                return f"{at} > sparse > tensor"
            graphs += [(f"{at} > graph", g) for g in (attribute.g, *attribute.graphs)]
    return ""


def _fields(f: BinaryIO, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, value or payload offset, payload size) for each protobuf
    field from the current position to `end`; payloads are skipped, not read."""
    while f.tell() < end:
        tag = read_varint(f)
        if tag is None:
            return
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value = read_varint(f)
            if value is None:
                return
            yield number, wire, value, 0
        elif wire == 2:
            size = read_varint(f)
            if size is None or f.tell() + size > end:
                return
            offset = f.tell()
            yield number, wire, offset, size
            f.seek(offset + size)
        elif wire in (1, 5):
            f.seek(8 if wire == 1 else 4, 1)
        else:
            return


_GRAPH_INITIALIZER = 5


_GRAPH_INPUT = 11
_VALUE_INFO_NAME = 1
_TENSOR_NAME = 8
MAX_NAME_BYTES = 4096


def onnx_input_names(f: BinaryIO) -> list[str]:
    """The model's real inputs: graph inputs that are not initializers (older exporters list
    weights as inputs too). Streams like `check_onnx_self_contained`."""
    return list(onnx_input_dims(f))


# ValueInfoProto.type = 2 → TypeProto.tensor_type = 1 → shape = 2 → TensorShapeProto.dim = 1
# → Dimension.dim_value = 1 (varint) | dim_param = 2 (string).
_VALUE_INFO_TYPE = 2
_TYPE_TENSOR = 1
_TENSOR_SHAPE = 2
_SHAPE_DIM = 1
_DIM_VALUE, _DIM_PARAM = 1, 2
MAX_INPUT_DIMS = 64


def onnx_input_dims(f: BinaryIO) -> dict[str, list[int | str]]:
    """Each real input's dims in graph order: a size, else its symbolic name ('' unnamed);
    an input without a declared shape has no dims listed. Streams the graph's input entries
    only, like `check_onnx_self_contained`, never the weights."""
    end = f.seek(0, 2)
    f.seek(0)
    inputs: dict[str, list[int | str]] = {}
    initializers: set[str] = set()
    try:
        for number, wire, offset, size in _fields(f, end):
            if number != _ONNX_GRAPH_FIELD or wire != 2:
                continue
            f.seek(offset)
            for g_number, g_wire, g_offset, g_size in _fields(f, offset + size):
                if g_wire != 2 or g_number not in (_GRAPH_INPUT, _GRAPH_INITIALIZER):
                    continue
                if g_number == _GRAPH_INITIALIZER:
                    f.seek(g_offset)
                    name = _first_string(f, g_offset + g_size, _TENSOR_NAME)
                    if name is not None:
                        initializers.add(name)
                    continue
                f.seek(g_offset)
                name = _first_string(f, g_offset + g_size, _VALUE_INFO_NAME)
                if name is not None:
                    f.seek(g_offset)
                    inputs[name] = _value_info_dims(f, g_offset + g_size)
            f.seek(offset + size)
    finally:
        f.seek(0)
    return {n: d for n, d in inputs.items() if n not in initializers}


def _submessage(f: BinaryIO, end: int, field: int) -> tuple[int, int] | None:
    """(offset, end) of the first length-delimited `field` before `end`."""
    for number, wire, offset, size in _fields(f, end):
        if number == field and wire == 2:
            return offset, offset + size
    return None


def _value_info_dims(f: BinaryIO, end: int) -> list[int | str]:
    dims: list[int | str] = []
    span: tuple[int, int] | None = (f.tell(), end)
    for field in (_VALUE_INFO_TYPE, _TYPE_TENSOR, _TENSOR_SHAPE):
        assert span is not None
        f.seek(span[0])
        span = _submessage(f, span[1], field)
        if span is None:
            return dims
    assert span is not None
    f.seek(span[0])
    for number, wire, offset, size in _fields(f, span[1]):
        if number != _SHAPE_DIM or wire != 2 or len(dims) >= MAX_INPUT_DIMS:
            continue
        dim: int | str = ""
        f.seek(offset)
        for d_number, d_wire, d_value, d_size in _fields(f, offset + size):
            # int64 on the wire: -1 (some exporters' "unknown") arrives as 2**64 - 1.
            if d_number == _DIM_VALUE and d_wire == 0 and 0 < d_value < 1 << 63:
                dim = d_value
            elif d_number == _DIM_PARAM and d_wire == 2 and d_size <= MAX_NAME_BYTES:
                f.seek(d_value)
                dim = f.read(d_size).decode("utf-8", errors="replace")
        dims.append(dim)
        f.seek(offset + size)
    return dims


def _first_string(f: BinaryIO, end: int, field: int) -> str | None:
    for number, wire, offset, size in _fields(f, end):
        if number == field and wire == 2 and size <= MAX_NAME_BYTES:
            f.seek(offset)
            return f.read(size).decode("utf-8", errors="replace")
    return None


def _torch_zip_format(f: BinaryIO) -> str | None:
    try:
        names = zipfile.ZipFile(f).namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return None
    # torch.export.save writes <archive>/archive_format; torch.jit.save writes code/ + data.pkl.
    if any(n == "archive_format" or n.endswith("/archive_format") for n in names):
        return "pt2"
    if any("/code/" in n or n.startswith("code/") for n in names) and any(
        n.endswith("data.pkl") for n in names
    ):
        return "torchscript"
    return None
