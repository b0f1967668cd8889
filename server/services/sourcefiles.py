"""Recognising uploaded files by their content, not their name: ONNX, torch ExportedProgram
(.pt2), TorchScript, and NumPy .npz archives. Formats are told from headers and zip
directories. An ONNX model is parsed once, by protobuf (`read_onnx`), never by hand; the
external-data check and the graph inputs read that parse.
"""

from __future__ import annotations

import hashlib
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import onnx
from google.protobuf.message import DecodeError

from server.compile.protoframe import is_onnx
from server.errors import PayloadTooLargeError, UnsupportedFileError

CHUNK = 1024 * 1024
MODEL_FORMATS = ("onnx", "pt2", "torchscript")
MAX_ONNX_BYTES = 2**31 - 1


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
    sparse_tensor(s)), subgraphs (If/Loop/Scan bodies), functions and training graphs. The
    stored model is one file (external data uploaded beside it is inlined first,
    `onnx_external`), and a `location` such as ../../etc/hostname would make a loader read a
    file of the compile machine into the model."""
    where = _external_tensor(model)
    if where:
        raise UnsupportedFileError(
            f"file field 'model' is an ONNX model whose tensor data points at a separate "
            f"external-data file (in {where}); only the .onnx is uploaded, and external data "
            "is refused wherever a tensor can appear",
            field="model",
            fix="attach the external-data file as multipart field 'model_data' "
            "(modelfleet publish --model-data FILE), or export a single file: "
            "torch.onnx.export(..., external_data=False), or "
            "onnx.save(model, path, save_as_external_data=False)",
        )


def is_external(tensor: onnx.TensorProto) -> bool:
    return (tensor.data_location == onnx.TensorProto.EXTERNAL
            or len(tensor.external_data) > 0)


def _external_tensor(model: onnx.ModelProto) -> str:
    """Where ("graph > node > attribute > tensor") the first external-data tensor is; ""."""
    return next((where for where, t in onnx_tensors(model) if is_external(t)), "")


def onnx_tensors(model: onnx.ModelProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    """Every tensor of `model` with where it is ("graph > node > attribute > tensor"):
    graph initializers, sparse initializers (values and indices), node attributes (t,
    tensors, sparse_tensor(s)), subgraphs (If/Loop/Scan bodies), functions and training
    graphs. onnx's own walker skips sparse tensors and training graphs."""
    graphs: list[tuple[str, onnx.GraphProto]] = [("graph", model.graph)]
    for training in model.training_info:
        graphs += [("training > graph", training.initialization),
                   ("training > graph", training.algorithm)]
    nodes: list[tuple[str, onnx.NodeProto]] = [
        ("function > node", n) for function in model.functions for n in function.node]
    while graphs or nodes:
        if graphs:
            where, graph = graphs.pop()
            yield from ((f"{where} > tensor", t) for t in graph.initializer)
            yield from _sparse(f"{where} > sparse > tensor", graph.sparse_initializer)
            nodes += [(f"{where} > node", n) for n in graph.node]
            continue
        where, node = nodes.pop()
        for attribute in node.attribute:
            at = f"{where} > attribute"
            if attribute.HasField("t"):
                yield f"{at} > tensor", attribute.t
            yield from ((f"{at} > tensor", t) for t in attribute.tensors)
            if attribute.HasField("sparse_tensor"):
                yield from _sparse(f"{at} > sparse > tensor", [attribute.sparse_tensor])
            yield from _sparse(f"{at} > sparse > tensor", attribute.sparse_tensors)
            graphs += [(f"{at} > graph", g) for g in (attribute.g, *attribute.graphs)]


def _sparse(where: str, sparse: Iterable[onnx.SparseTensorProto],
            ) -> Iterator[tuple[str, onnx.TensorProto]]:
    for s in sparse:
        yield where, s.values
        yield where, s.indices


MAX_NAME_BYTES = 4096
# One graph input's ValueInfoProto (name, type, shape, doc string): real ones are a few
# hundred bytes; a larger one is refused before its fields are read.
MAX_VALUE_INFO_BYTES = 64 * 1024
MAX_INPUT_DIMS = 64
# Old exporters list every weight as a graph input too: allow many, but not unbounded.
MAX_GRAPH_INPUTS = 100_000

# TensorProto.DataType -> the metadata dtype names (server/services/version_metadata.py);
# a type not listed here cannot be declared (e.g. float64, string).
ONNX_DTYPES = {1: "float32", 10: "float16", 16: "bfloat16", 3: "int8", 2: "uint8",
               5: "int16", 6: "int32", 7: "int64", 9: "bool"}
_ONNX_TYPE_NAMES = {11: "float64", 8: "string", 4: "uint16", 12: "uint32", 13: "uint64",
                    14: "complex64", 15: "complex128"}


@dataclass(frozen=True)
class GraphInput:
    """One real input of an uploaded ONNX graph, as its ValueInfoProto declares it."""

    name: str
    dtype: str  # a metadata dtype name, else the ONNX type's name ("float64", "sequence", …)
    # Each dim: a size, else its symbolic name ('' unnamed); None when the graph gives no
    # shape at all (any rank), [] for a scalar (rank 0).
    dims: list[int | str] | None

    @property
    def dynamic(self) -> list[int]:
        """The indices of the dims that are not a fixed size."""
        return [i for i, d in enumerate(self.dims or []) if not isinstance(d, int)]

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "dtype": self.dtype, "dims": self.dims,
                "dynamic_dims": self.dynamic}


def onnx_graph_inputs(model: onnx.ModelProto) -> list[GraphInput]:
    """The graph's real inputs (initializers left out) in order, each with dtype and dims,
    from the model `read_onnx` parsed: protobuf found the fields, so whatever it skips
    (unknown fields, groups) or merges (repeated graph fields) is skipped or merged here as
    in every loader. Each input is bounded (MAX_VALUE_INFO_BYTES, MAX_INPUT_DIMS,
    MAX_NAME_BYTES), and so is their number (MAX_GRAPH_INPUTS)."""
    graph = model.graph
    if len(graph.input) > MAX_GRAPH_INPUTS:
        raise _bad_inputs(f"it lists more than {MAX_GRAPH_INPUTS} graph inputs")
    initializers = {t.name for t in graph.initializer}
    inputs = [_graph_input(vi, index) for index, vi in enumerate(graph.input)]
    return [i for i in inputs if i.name not in initializers]


def _bad_inputs(why: str) -> UnsupportedFileError:
    return UnsupportedFileError(
        f"file field 'model' is an ONNX model whose graph inputs cannot be read: {why}",
        field="model", fix="re-export the model with onnx.save (torch.onnx.export writes "
        "well-formed inputs); check that the file is not truncated")


def _graph_input(vi: onnx.ValueInfoProto, index: int) -> GraphInput:
    if vi.ByteSize() > MAX_VALUE_INFO_BYTES:
        raise _bad_inputs(f"graph input #{index} is larger than {MAX_VALUE_INFO_BYTES} bytes")
    if len(vi.name.encode()) > MAX_NAME_BYTES:
        raise _bad_inputs(f"graph input #{index} has a name over {MAX_NAME_BYTES} bytes")
    kind = vi.type.WhichOneof("value")
    if kind != "tensor_type":
        return GraphInput(vi.name, kind.removesuffix("_type") if kind else "unknown", None)
    tt = vi.type.tensor_type
    dtype = ONNX_DTYPES.get(tt.elem_type) or _ONNX_TYPE_NAMES.get(tt.elem_type,
                                                                  f"onnx type {tt.elem_type}")
    if not tt.HasField("shape"):
        return GraphInput(vi.name, dtype, None)
    if len(tt.shape.dim) > MAX_INPUT_DIMS:
        raise _bad_inputs(f"input {vi.name!r} has more than {MAX_INPUT_DIMS} dims")
    dims: list[int | str] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(d.dim_value)
        else:
            # Some exporters write -1 or "?" for "unknown": an unnamed dynamic dim.
            dims.append("" if d.dim_param in ("?", "-1") else d.dim_param[:MAX_NAME_BYTES])
    return GraphInput(vi.name, dtype, dims)


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
