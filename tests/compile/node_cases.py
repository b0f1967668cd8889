"""ONNX's backend node cases, collected once per onnx / numpy version into the model cache.

`collect_testcases()` computes every case's expected outputs with onnx's reference ops when
it is imported (the 3-D pools alone take tens of seconds), and the conformance check runs in
two modules on two workers, which would each pay it. The first caller writes the cases to
`<model cache>/onnx-node-cases/` under the cache's file lock (tests/corpus/fetch.py); later
ones read them back. No pickle: each case's model as protobuf bytes and its first data set
as arrays in one `.npz` read with `allow_pickle=False`, plus a JSON index. A value that
cannot be stored so (a sequence, an optional, a string or bfloat16 tensor) is out of the
conformance scope anyway; it comes back as a placeholder of the same kind (a list, a
one-element array of that dtype), so the case is reported out of scope for the same reason.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tests.corpus.fetch import locked, root

_LIST, _DTYPE = "list", "dtype:"  # placeholders for what the .npz does not hold


@dataclass(frozen=True)
class NodeCase:
    """The fields of onnx's `TestCase` that `run_suite` reads."""

    name: str
    model: Any
    data_sets: list[tuple[list[Any], list[Any]]]
    rtol: float
    atol: float


def _where() -> Path:
    import onnx

    return root() / "onnx-node-cases" / f"onnx-{onnx.__version__}-numpy-{np.__version__}"


def _entry(arrays: dict[str, np.ndarray], key: str, value: Any) -> str:
    if not isinstance(value, np.ndarray):
        return _LIST
    if value.dtype.hasobject or value.dtype.kind == "V":  # ml_dtypes' come back as void
        return _DTYPE + str(value.dtype)
    arrays[key] = value
    return key


def write(out: Path, cases: list[Any]) -> None:
    """Stores `cases` (onnx `TestCase`s with a model, or `NodeCase`s) in the directory `out`."""
    arrays: dict[str, np.ndarray] = {}
    index = []
    for i, c in enumerate(cases):
        assert c.model is not None
        arrays[f"m{i}"] = np.frombuffer(c.model.SerializeToString(), dtype=np.uint8)
        ins, outs = c.data_sets[0] if c.data_sets else ([], [])
        index.append({"name": c.name, "rtol": float(c.rtol), "atol": float(c.atol),
                      "data": bool(c.data_sets),
                      "in": [_entry(arrays, f"i{i}_{k}", a) for k, a in enumerate(ins)],
                      "out": [_entry(arrays, f"o{i}_{k}", a) for k, a in enumerate(outs)]})
    out.mkdir(parents=True, exist_ok=True)
    part = out / f"cases.npz.{os.getpid()}"
    with open(part, "wb") as f:
        np.savez(f, **arrays)
    os.replace(part, out / "cases.npz")
    (out / "index.json").write_text(json.dumps(index))  # written last: marks the cache whole


def _value(arrays: Any, ref: str) -> Any:
    if ref == _LIST:
        return []
    if ref.startswith(_DTYPE):
        try:  # bfloat16, float8: numpy knows them once onnx has imported ml_dtypes
            return np.zeros(1, dtype=np.dtype(ref.removeprefix(_DTYPE)))
        except TypeError:
            return np.empty(1, dtype=object)
    return arrays[ref]


def read(where: Path) -> list[NodeCase]:
    import onnx

    index = json.loads((where / "index.json").read_text())
    with np.load(where / "cases.npz", allow_pickle=False) as arrays:
        return [NodeCase(e["name"], onnx.load_from_string(arrays[f"m{i}"].tobytes()),
                         [([_value(arrays, r) for r in e["in"]],
                           [_value(arrays, r) for r in e["out"]])] if e["data"] else [],
                         e["rtol"], e["atol"])
                for i, e in enumerate(index)]


def node_cases() -> list[NodeCase]:
    """Every node case with a model, in `collect_testcases()` order."""
    where = _where()
    with locked("onnx-node-cases"):
        if not (where / "index.json").is_file():
            from onnx.backend.test.case.node import collect_testcases

            from server.compile.quiet import quiet

            with quiet():
                write(where, [c for c in collect_testcases() if c.model is not None])
    return read(where)
