"""Checking an uploaded reference / calibration `.npz` without decompressing it (issue 9).

An .npz is a zip of .npy members. A 1.9 MB upload of deflated zeros can declare a 40000×1×3×
64×64 float32 array and inflate to 1.96 GB on the compile worker, and an object-dtype member
is a pickle. So `check_npz_arrays` reads only the zip directory and each member's .npy
header (its first bytes; numpy parses it with a literal evaluator and a header-size cap,
never unpickling), and refuses before anything is inflated:

- a member that is not `<name>.npy`, or more than `MAX_MEMBERS` of them;
- a total declared (uncompressed) size over the cap (413);
- a header whose shape × itemsize disagrees with the directory's size (a lying archive);
- object, string, void or other non-numeric dtypes (pickles);
- an array for a declared input whose shape is neither a declared shape nor (N, *shape)
  (`<input>@<variant>` arrays: that variant's shape);
- a declared input with no array.
"""

from __future__ import annotations

import math
import zipfile
from typing import Any, BinaryIO

import numpy as np
from numpy.lib import format as npy_format

from server.errors import InvalidInputError, PayloadTooLargeError, UnsupportedFileError

MAX_MEMBERS = 1024
NUMERIC_KINDS = "biuf"  # bool, int, uint, float


def _not_npz(field: str, why: str) -> UnsupportedFileError:
    return UnsupportedFileError(
        f"file field {field!r} is not a NumPy .npz archive of numeric arrays: {why}",
        field=field,
        fix="save plain numeric arrays with numpy.savez / savez_compressed (one array per "
        "model input name, shaped (N, *input_shape)); object arrays are refused",
    )


def _header(zf: zipfile.ZipFile, info: zipfile.ZipInfo, field: str
            ) -> tuple[tuple[int, ...], np.dtype[Any], int]:
    """(shape, dtype, data offset) from the member's .npy header, reading only the header."""
    try:
        with zf.open(info) as member:
            version = npy_format.read_magic(member)
            if version == (1, 0):
                shape, _fortran, dtype = npy_format.read_array_header_1_0(member)
            elif version in ((2, 0), (3, 0)):
                shape, _fortran, dtype = npy_format.read_array_header_2_0(member)
            else:
                raise ValueError(f"unsupported .npy version {version}")
            offset = member.tell()
    except (ValueError, OSError, zipfile.BadZipFile, EOFError, SyntaxError) as e:
        raise _not_npz(field, f"member {info.filename!r} has no valid .npy header ({e})") \
            from None
    return tuple(int(d) for d in shape), dtype, offset


def check_npz_arrays(f: BinaryIO, *, field: str, inputs: list[dict[str, Any]],
                     max_unpacked_bytes: int) -> None:
    """Raises UnsupportedFileError / PayloadTooLargeError / InvalidInputError (see module
    docstring); `inputs` are the version's specs ({name, shapes: {variant: shape}}). Rewinds
    `f`."""
    f.seek(0)
    try:
        try:
            zf = zipfile.ZipFile(f)
            infos = zf.infolist()
        except (zipfile.BadZipFile, OSError, ValueError) as e:
            raise _not_npz(field, f"not a zip archive ({e})") from None
        _check_directory(infos, field, max_unpacked_bytes)
        arrays: dict[str, tuple[int, ...]] = {}
        for info in infos:
            shape, dtype, offset = _header(zf, info, field)
            if dtype.hasobject or dtype.kind not in NUMERIC_KINDS:
                raise _not_npz(field, f"member {info.filename!r} has dtype {dtype}")
            declared = offset + math.prod(shape) * dtype.itemsize
            if declared != info.file_size:
                raise _not_npz(field, f"member {info.filename!r} claims {info.file_size} bytes "
                               f"in the zip directory but its header describes {declared}")
            arrays[info.filename[:-len(".npy")]] = shape
    finally:
        f.seek(0)
    _check_inputs(arrays, inputs, field)


def _check_directory(infos: list[zipfile.ZipInfo], field: str, cap: int) -> None:
    if not infos or len(infos) > MAX_MEMBERS:
        raise _not_npz(field, f"it holds {len(infos)} members (1..{MAX_MEMBERS} expected)")
    bad = [i.filename for i in infos if not i.filename.endswith(".npy") or i.is_dir()]
    if bad:
        raise _not_npz(field, f"member {bad[0]!r} is not an .npy array")
    total = sum(i.file_size for i in infos)
    if total > cap:
        raise PayloadTooLargeError(
            f"file field {field!r} decompresses to {total} bytes, over the limit of {cap} "
            "bytes (checked from the archive's directory, before decompressing)",
            field=field,
            fix="send fewer samples (the numeric gate uses at most 256, calibration a few "
            "hundred), or raise MODELFLEET_MAX_NPZ_UNPACKED_BYTES",
        )


def _fits(shape: tuple[int, ...], declared: tuple[int, ...]) -> bool:
    return shape == declared or (len(shape) == len(declared) + 1 and shape[1:] == declared
                                 and shape[0] > 0)


def _check_inputs(arrays: dict[str, tuple[int, ...]], inputs: list[dict[str, Any]],
                  field: str) -> None:
    """Per input: `<name>@<variant>` arrays must fit that variant's shape, a plain `<name>`
    array one of the declared shapes, and at least one of them must be there."""
    for i, spec in enumerate(inputs):
        name = str(spec["name"])
        shapes = {str(v): tuple(int(d) for d in s) for v, s in spec["shapes"].items()}
        own = {v: f"{name}@{v}" for v in shapes if f"{name}@{v}" in arrays}
        if name not in arrays and not own:
            raise InvalidInputError(
                f"file field {field!r} has no array for input {name!r}; it has "
                f"{sorted(arrays)[:20]}",
                field=field,
                fix="save one array per model input name, shaped (N, *input_shape) (or one "
                "per input and shape variant, named '<input>@<variant>')")
        for variant, key in own.items():
            if not _fits(arrays[key], shapes[variant]):
                raise InvalidInputError(
                    f"file field {field!r}: array {key!r} has shape {arrays[key]}, expected "
                    f"(N, *{shapes[variant]}) for shape variant {variant!r}",
                    field=field, fix=f"shape {key!r} (N, *{shapes[variant]})")
        if name in arrays and not any(_fits(arrays[name], s) for s in shapes.values()):
            raise InvalidInputError(
                f"file field {field!r}: array {name!r} has shape {arrays[name]}, which is "
                f"neither a declared shape of metadata.inputs[{i}] ({list(shapes.values())}) "
                "nor (N, *shape)",
                field=field,
                fix="shape each array (N, *input_shape) for one of the declared shapes, or "
                "give each shape variant its own '<input>@<variant>' array")
