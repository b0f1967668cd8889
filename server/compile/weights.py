"""The weights of an artifact file, read and rewritten in their own dtype (issue 23's
watermarks): an ONNX model's initializers, a Core ML `.mlpackage`'s weight blobs.

A model's weights are a list of named tensors (`Tensor`: name, float32 values for scoring,
the stored dtype). Which tensors count (`markable`): float16/float32 and int8/uint8 ones of
at least `MIN_ELEMENTS` elements — small ones are epsilons, scales and structural constants,
whose change would move every output. An int8 tensor of an ONNX file counts only as the
quantized input of a DequantizeLinear (other integers are shapes and indices); its values
are its integers, so scale or zero point changes do not matter.

Formats: an ONNX file (protobuf, external data refused); a Core ML `.mlpackage` directory,
or one packed as our deterministic tar (server/compile/packing.py), a compressed tar or a
zip (how an app bundle or a leak may carry it) — unpacked only when its headers add up to
at most `MAX_WEIGHT_FILE_BYTES` and `MAX_ENTRIES` (a leaked file is hostile input). A QNN
context binary's weights are compiled into the HTP graph in the DSP's layout: not read as
tensors here (server/compile/qnn_marks.py marks QNN artifacts and names a leaked binary's
cohort against the server's own binaries).

Rewriting keeps everything but the weight values: ONNX initializers are replaced in place
(same name, dtype, shape); a Core ML weight file is rewritten blob by blob through
coremltools' own blob writer (offsets recorded back in the spec).
"""

from __future__ import annotations

import json
import shutil
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MIN_ELEMENTS = 64
MAX_WEIGHT_FILE_BYTES = 8 * 1024**3  # also the cap on what an archive may unpack to
MAX_ENTRIES = 100_000  # an .mlpackage holds a handful of files
FLOATS = ("float16", "float32")
INTS = ("int8", "uint8")
COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")  # gzip, bzip2, xz: a compressed tar
QUANTIZED_SUFFIX = "_quantized"  # onnxruntime's quantizers: X → X_quantized, X_scale, …


class WeightsError(Exception):
    """The file is not a model whose weights can be read (or rewritten) here."""


@dataclass
class Tensor:
    name: str
    values: np.ndarray[Any, Any]  # as stored (float16, float32, int8 or uint8), flat
    weight: bool = True  # False: values that are not weights (palette indices, sub-byte)

    @property
    def markable(self) -> bool:
        return self.weight and self.values.dtype.name in FLOATS + INTS \
            and self.values.size >= MIN_ELEMENTS


Rewrite = Callable[[str, np.ndarray[Any, Any]], np.ndarray[Any, Any]]


def kind_of(path: Path) -> str:
    """"onnx" or "mlpackage" (a directory, tar or zip), else WeightsError."""
    if path.is_dir():
        if (path / "Manifest.json").is_file():
            return "mlpackage"
        raise WeightsError(f"{path.name} is a directory but no .mlpackage (no Manifest.json)")
    with path.open("rb") as f:
        head = f.read(512)
    if head[:4] == b"PK\x03\x04" or head.startswith(COMPRESSED) or \
            (len(head) >= 262 and head[257:262] == b"ustar"):
        return "mlpackage"
    if path.suffix in (".bin", ".dlc"):
        raise WeightsError(f"{path.name} looks like a QNN context binary: its weights are "
                           "compiled for the DSP and cannot be read as tensors (identify "
                           "compares it with the server's binaries: server/compile/qnn_marks.py)")
    return "onnx"


def read(path: Path) -> list[Tensor]:
    """The model's tensors (ONNX or Core ML, see `kind_of`), in a stable order."""
    if kind_of(path) == "onnx":
        return onnx_tensors(load_onnx(path))
    with package_dir(path) as pkg:
        return [Tensor(ref.name, ref.read(), ref.weight) for ref in _blob_refs(pkg)[1]]


def by_name(tensors: list[Tensor]) -> dict[str, np.ndarray[Any, Any]]:
    """Name → values, plus — for a copy re-quantized by onnxruntime's quantizers (X becomes
    X_quantized with X_scale and X_zero_point, one scale per tensor) — X → its dequantized
    float32 values, so a re-quantized copy is compared with the float original."""
    out = {t.name: t.values for t in tensors}
    for name, q in list(out.items()):
        base = name.removesuffix(QUANTIZED_SUFFIX)
        scale, zero = out.get(f"{base}_scale"), out.get(f"{base}_zero_point")
        if base == name or scale is None or scale.size != 1 or base in out:
            continue
        zp = np.float32(0) if zero is None or zero.size != 1 else np.float32(zero.reshape(-1)[0])
        out[base] = (q.astype(np.float32) - zp) * np.float32(scale.reshape(-1)[0])
    return out


def rewrite(path: Path, change: Rewrite) -> None:
    """Replaces each markable tensor's values with `change(name, values)` (same dtype and
    size), in place: an ONNX file or an .mlpackage directory."""
    if kind_of(path) == "onnx":
        _rewrite_onnx(path, change)
    elif path.is_dir():
        _rewrite_mlpackage(path, change)
    else:
        raise WeightsError(f"{path.name}: rewrite an unpacked .mlpackage directory")


def _checked(name: str, old: np.ndarray[Any, Any], new: np.ndarray[Any, Any]
             ) -> np.ndarray[Any, Any]:
    if new.dtype != old.dtype or new.size != old.size:
        raise WeightsError(f"tensor {name}: a rewrite must keep dtype {old.dtype} and size "
                           f"{old.size}")
    return new


# ---- ONNX -------------------------------------------------------------------------------

def load_onnx(path: Path) -> Any:
    import onnx
    from google.protobuf.message import DecodeError

    if path.stat().st_size > MAX_WEIGHT_FILE_BYTES:
        raise WeightsError(f"{path.name} exceeds {MAX_WEIGHT_FILE_BYTES} bytes")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, OSError) as e:
        raise WeightsError(f"{path.name} is neither an ONNX model nor an .mlpackage: {e}"
                           ) from None
    if not model.graph.node:
        raise WeightsError(f"{path.name} is not an ONNX model (no graph nodes)")
    return model


def _dequantized_inputs(graph: Any) -> set[str]:
    return {n.input[0] for n in graph.node if n.op_type == "DequantizeLinear" and n.input}


def onnx_tensors(model: Any) -> list[Tensor]:
    from onnx import TensorProto, numpy_helper

    quantized = _dequantized_inputs(model.graph)
    out = []
    for init in model.graph.initializer:
        if init.data_location == TensorProto.EXTERNAL:
            raise WeightsError(f"initializer {init.name} lives in external data; give the "
                               "self-contained model file")
        try:
            arr = numpy_helper.to_array(init).reshape(-1)
        except (ValueError, TypeError) as e:  # dims the data does not fill: a cut or forgery
            raise WeightsError(f"initializer {init.name}: its data does not fit its dims "
                               f"{list(init.dims)} ({e})") from None
        if arr.dtype.name in INTS and init.name not in quantized \
                and not init.name.endswith((QUANTIZED_SUFFIX, "_zero_point")):
            continue  # integers that are not quantized weights: shapes, indices
        out.append(Tensor(init.name, arr))
    return out


def _rewrite_onnx(path: Path, change: Rewrite) -> None:
    import onnx
    from onnx import numpy_helper

    model = load_onnx(path)
    by_name = {t.name: t for t in onnx_tensors(model)}
    for i, init in enumerate(model.graph.initializer):
        t = by_name.get(init.name)
        if t is None or not t.markable:
            continue
        new = _checked(t.name, t.values, change(t.name, t.values))
        shaped = new.reshape(tuple(init.dims))
        model.graph.initializer[i].CopyFrom(numpy_helper.from_array(shaped, init.name))
    tmp = path.with_name(path.name + ".partial")
    onnx.save(model, str(tmp))
    tmp.replace(path)


# ---- Core ML ------------------------------------------------------------------------------

_READ = {"FLOAT16": ("read_fp16_data", "write_fp16_data", np.float16),
         "FLOAT32": ("read_float_data", "write_float_data", np.float32),
         "INT8": ("read_int8_data", "write_int8_data", np.int8),
         "UINT8": ("read_uint8_data", "write_uint8_data", np.uint8),
         "INT16": ("read_int16_data", "write_int16_data", np.int16),
         "UINT16": ("read_uint16_data", "write_uint16_data", np.uint16),
         "INT32": ("read_int32_data", "write_int32_data", np.int32),
         "UINT32": ("read_uint32_data", "write_uint32_data", np.uint32),
         # sub-byte: INT4 linear weights, palette indices; read and written back, not marked
         "INT4": ("read_int4_data", "write_int4_data", np.int8),
         **{f"UINT{n}": (f"read_uint{n}_data", f"write_uint{n}_data", np.uint8)
            for n in (1, 2, 3, 4, 6)}}
SUB_BYTE = ("INT4", "UINT1", "UINT2", "UINT3", "UINT4", "UINT6")
# What a compressed weight's constexpr op holds besides the weight values: a palettized
# weight's indices into its table (a step there is another table entry, not a step in value;
# the table's FP16 entries are marked), and the per-channel or per-block scales, zero points
# and offsets of a quantized one (a step there moves a whole channel). Never marked.
NOT_WEIGHTS = ("indices", "zero_point", "scale", "offset", "mask")


@dataclass
class _BlobRef:
    name: str
    dtype: str  # MIL DataType name
    file: str
    offset: int
    values: list[Any]  # the spec's BlobFileValue messages that point at this blob
    reader: Any
    op: tuple[str, str] = ("", "")  # (MIL op type, attribute) that holds the blob

    @property
    def weight(self) -> bool:
        return self.dtype not in SUB_BYTE and not (self.op[0].startswith("constexpr_")
                                                   and self.op[1] in NOT_WEIGHTS)

    def read(self) -> np.ndarray[Any, Any]:
        if self.dtype not in _READ:
            raise WeightsError(f"weight {self.name} is stored as {self.dtype}, which is not "
                               "read here")
        method, _, np_type = _READ[self.dtype]
        try:
            raw = np.asarray(getattr(self.reader, method)(self.offset)).reshape(-1)
        except (ValueError, RuntimeError) as e:  # coremltools' reader checks the file's
            # header and every blob's bounds: a forged or cut weight file lands here
            raise WeightsError(f"weight {self.name}: its blob at offset {self.offset} cannot "
                               f"be read from {Path(self.file).name} ({e})") from None
        # coremltools hands float16 blobs over as their uint16 bit patterns
        return raw.view(np.float16) if self.dtype == "FLOAT16" else raw.astype(np_type)


def _model_file(pkg: Path) -> Path:
    try:
        manifest = json.loads((pkg / "Manifest.json").read_text())
        root = str(manifest["itemInfoEntries"][manifest["rootModelIdentifier"]]["path"])
    except (ValueError, KeyError, TypeError) as e:
        raise WeightsError(f"{pkg.name}: unreadable Manifest.json ({e})") from None
    path = (pkg / "Data" / root).resolve()
    if not path.is_file() or pkg.resolve() not in path.parents:
        raise WeightsError(f"{pkg.name}: its Manifest.json names no model file inside it")
    return path


def _operations(block: Any) -> Iterator[Any]:
    for op in block.operations:
        yield op
        for inner in op.blocks:
            yield from _operations(inner)


def _blob_values(op: Any) -> Iterator[tuple[str, Any]]:
    """(attribute or input name, Value) of each of the op's weight-file values: attributes
    (a `const`'s `val`, iOS16/17 constexpr ops), and inputs bound to values (iOS18's
    constexpr ops: `constexpr_lut_to_dense(indices=…, lut=…)`)."""
    for attr in sorted(op.attributes):
        if op.attributes[attr].WhichOneof("value") == "blobFileValue":
            yield attr, op.attributes[attr]
    for name in sorted(op.inputs):
        for arg in op.inputs[name].arguments:
            if arg.WhichOneof("binding") == "value" and \
                    arg.value.WhichOneof("value") == "blobFileValue":
                yield name, arg.value


def _blob_refs(pkg: Path) -> tuple[Any, list[_BlobRef]]:
    from coremltools import libmilstoragepython as storage
    from coremltools.proto import MIL_pb2

    model_file = _model_file(pkg)
    spec = parse_spec(model_file)
    if spec.WhichOneof("Type") != "mlProgram":
        raise WeightsError(f"{pkg.name} holds no ML Program; only ML Program weights are read")
    readers: dict[str, Any] = {}
    refs: dict[tuple[str, int], _BlobRef] = {}
    for fname in sorted(spec.mlProgram.functions):
        fn = spec.mlProgram.functions[fname]
        for block_name in sorted(fn.block_specializations):
            for op in _operations(fn.block_specializations[block_name]):
                for attr, value in _blob_values(op):
                    blob = value.blobFileValue
                    file = _weight_file(pkg, model_file, blob.fileName)
                    if file not in readers:
                        readers[file] = storage._BlobStorageReader(file)  # opened lazily
                    dtype = MIL_pb2.DataType.Name(value.type.tensorType.dataType)
                    name = f"{op.outputs[0].name if op.outputs else op.type}:{attr}"
                    ref = refs.setdefault((file, blob.offset), _BlobRef(
                        name, dtype, file, blob.offset, [], readers[file], (op.type, attr)))
                    ref.values.append(blob)
    return spec, sorted(refs.values(), key=lambda r: (r.file, r.offset))


def parse_spec(model_file: Path) -> Any:
    """The Core ML spec in `model_file`, else WeightsError (a leak may be cut or forged)."""
    from coremltools.proto import Model_pb2
    from google.protobuf.message import DecodeError

    spec = Model_pb2.Model()
    try:
        spec.ParseFromString(model_file.read_bytes())
    except DecodeError as e:
        raise WeightsError(f"{model_file.name} is not a Core ML model spec ({e})") from None
    return spec


def _weight_file(pkg: Path, model_file: Path, name: str) -> str:
    rel = name.removeprefix("@model_path/")
    path = (model_file.parent / rel).resolve()
    if pkg.resolve() not in path.parents or not path.is_file():
        raise WeightsError(f"{pkg.name}: weight file {name!r} is missing or outside the package")
    return str(path)


def _rewrite_mlpackage(pkg: Path, change: Rewrite) -> None:
    from coremltools import libmilstoragepython as storage

    spec, refs = _blob_refs(pkg)
    for file in sorted({r.file for r in refs}):
        tmp = file + ".partial"
        writer = storage._BlobStorageWriter(tmp, truncate_file=True)
        for ref in (r for r in refs if r.file == file):
            values = ref.read()
            t = Tensor(ref.name, values, ref.weight)
            if t.markable:
                values = _checked(ref.name, values, change(ref.name, values))
            data = np.ascontiguousarray(values)
            if ref.dtype == "FLOAT16":
                data = data.view(np.uint16)
            offset = getattr(writer, _READ[ref.dtype][1])(data)
            for blob in ref.values:
                blob.offset = offset
        del writer  # flushes and closes the file
        for ref in refs:
            ref.reader = None
        Path(tmp).replace(file)
    _model_file(pkg).write_bytes(spec.SerializeToString())


@contextmanager
def package_dir(path: Path) -> Iterator[Path]:
    """An .mlpackage as a directory: itself, or unpacked from its tar or zip to a temporary
    directory (names checked: nothing outside it)."""
    if path.is_dir():
        yield path
        return
    tmp = Path(tempfile.mkdtemp(prefix="mf-weights-"))
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                if len(z.infolist()) > MAX_ENTRIES or \
                        sum(i.file_size for i in z.infolist()) > MAX_WEIGHT_FILE_BYTES:
                    raise WeightsError(f"{path.name} unpacks to more than "
                                       f"{MAX_WEIGHT_FILE_BYTES} bytes or {MAX_ENTRIES} "
                                       "entries")
                for info in z.infolist():
                    target = (tmp / info.filename).resolve()
                    if tmp.resolve() not in target.parents:
                        raise WeightsError(f"{path.name}: entry {info.filename!r} escapes")
                z.extractall(tmp)  # noqa: S202 (every name checked above)
        else:
            try:
                with tarfile.open(path, mode="r:*") as tar:
                    members = _capped_members(tar, path.name)
                    tar.extractall(tmp, members=members, filter="data")
            except (tarfile.TarError, OSError) as e:
                raise WeightsError(f"{path.name} is not a readable .mlpackage archive: {e}"
                                   ) from None
        found: list[Path] = sorted(p.parent for p in tmp.rglob("Manifest.json"))
        if not found:
            raise WeightsError(f"{path.name} holds no .mlpackage (no Manifest.json)")
        yield found[0]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _capped_members(tar: tarfile.TarFile, name: str) -> list[tarfile.TarInfo]:
    """The archive's members, refused as soon as their sizes add up to more than
    `MAX_WEIGHT_FILE_BYTES` or they outnumber `MAX_ENTRIES` (a tar bomb: a small compressed
    file that unpacks to more than the disk holds). The headers are read one by one, so the
    check stops at the first member over the cap and nothing is written before it."""
    members, total = [], 0
    for info in tar:
        total += max(info.size, 0)
        members.append(info)
        if total > MAX_WEIGHT_FILE_BYTES or len(members) > MAX_ENTRIES:
            raise WeightsError(f"{name} unpacks to more than {MAX_WEIGHT_FILE_BYTES} bytes "
                               f"or {MAX_ENTRIES} entries")
    return members
