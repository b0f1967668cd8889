"""Which nodes of an ONNX graph the QNN HTP takes, asked of onnxruntime-qnn itself.

A session is created with CPU fallback allowed and `session.record_ep_graph_assignment_info`
on; onnxruntime then reports, per execution provider, the nodes it was given. Nodes left to
the CPU EP are named with their operator, their input types and the QNN EP's own words about
them (its warnings, e.g. "backendValidateOpConfig() failed for node `x` of type `GatherNd`",
captured from the session log). The share of nodes and of multiply-accumulates (Conv,
ConvTranspose, MatMul, Gemm) on the HTP is computed from the graph.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server.compile.qnn_runtime import EP_NAME, open_session


@dataclass(frozen=True)
class CpuNode:
    op: str
    name: str
    why: str

    def to_dict(self) -> dict[str, str]:
        return {"op": self.op, "node": self.name, "why": self.why}


@dataclass
class HtpAssignment:
    nodes_total: int
    nodes_htp: int
    macs_total: int
    macs_htp: int
    cpu_nodes: list[CpuNode] = field(default_factory=list)

    @property
    def node_share(self) -> float:
        return self.nodes_htp / self.nodes_total if self.nodes_total else 1.0

    @property
    def mac_share(self) -> float:
        return self.macs_htp / self.macs_total if self.macs_total else self.node_share

    def summary(self) -> str:
        share = (f"{100 * self.node_share:.1f}% of nodes ({self.nodes_htp}/{self.nodes_total}),"
                 f" {100 * self.mac_share:.1f}% of MACs on the HTP")
        if not self.cpu_nodes:
            return f"whole graph on the HTP: {share}"
        named = "; ".join(f"{n.op} node {n.name!r}: {n.why}" for n in self.cpu_nodes[:10])
        more = f" (and {len(self.cpu_nodes) - 10} more)" if len(self.cpu_nodes) > 10 else ""
        return f"{len(self.cpu_nodes)} node(s) the HTP does not take: {named}{more}; {share}"

    def to_dict(self) -> dict[str, Any]:
        return {"gate": "htp", "passed": not self.cpu_nodes,
                "node_share": round(self.node_share, 4), "mac_share": round(self.mac_share, 4),
                "nodes_total": self.nodes_total, "nodes_htp": self.nodes_htp,
                "macs_total": self.macs_total, "macs_htp": self.macs_htp,
                "cpu_nodes": [n.to_dict() for n in self.cpu_nodes], "summary": self.summary()}


_TYPES = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
          10: "float16", 11: "float64", 12: "uint32", 13: "uint64"}


def node_macs(model: Any) -> dict[str, int]:
    """Multiply-accumulates per node name for the compute-heavy ops (static shapes)."""
    import numpy as np
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    shapes: dict[str, list[int]] = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        dims = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if dims and all(d > 0 for d in dims):
            shapes[vi.name] = dims
    for t in inferred.graph.initializer:
        shapes[t.name] = list(t.dims)
    out: dict[str, int] = {}
    for i, node in enumerate(inferred.graph.node):
        name = node.name or f"{node.op_type}_{i}"
        y = shapes.get(node.output[0]) if node.output else None
        w = shapes.get(node.input[1]) if len(node.input) > 1 else None
        a = shapes.get(node.input[0]) if node.input else None
        macs = 0
        if y and w and node.op_type == "Conv":
            macs = int(np.prod(y)) * int(np.prod(w[1:]))
        elif a and w and node.op_type == "ConvTranspose":
            macs = int(np.prod(a)) * int(np.prod(w[1:]))
        elif y and a and node.op_type in ("MatMul", "Gemm"):
            transposed = node.op_type == "Gemm" and any(
                x.name == "transA" and x.i for x in node.attribute)
            macs = int(np.prod(y)) * (a[-2] if transposed else a[-1])
        out[name] = macs
    return out


def _input_types(model: Any) -> dict[str, str]:
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    out = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        tt = vi.type.tensor_type
        dims = "x".join(str(d.dim_value or d.dim_param or "?") for d in tt.shape.dim)
        out[vi.name] = f"{_TYPES.get(tt.elem_type, str(tt.elem_type))}[{dims}]"
    for t in inferred.graph.initializer:
        out[t.name] = f"{_TYPES.get(t.data_type, str(t.data_type))}[{'x'.join(map(str, t.dims))}]"
    return out


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """onnxruntime logs from C++ to fd 2: capture it for the QNN EP's reasons."""
    lines: list[str] = []
    with tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            lines.extend(f.read().decode(errors="replace").splitlines())


_LOG_PREFIX = re.compile(r"^.*?\[[WEI]:onnxruntime:[^\]]*\]\s*")


def _why(node: str, op: str, inputs: list[str], types: dict[str, str], log: list[str]) -> str:
    said = [_LOG_PREFIX.sub("", re.sub(r"\x1b\[[0-9;]*m", "", line)).strip()
            for line in log if f"`{node}`" in line or f"'{node}'" in line
            or f" {node} " in line]
    typed = ", ".join(types.get(i, "?") for i in inputs if i)
    reason = said[0] if said else "the QNN EP did not claim it (no HTP kernel for this " \
                                  "operator or these types)"
    return f"{reason}; inputs {typed}" if typed else reason


def probe(model_path: Path, provider_options: dict[str, str],
          context_out: Path | None = None) -> HtpAssignment:
    """The HTP / CPU split of the graph onnxruntime-qnn makes for these provider options.

    With `context_out`, the same session also writes the EPContext model (CPU nodes
    included, if any), so a compile that accepts the split needs no second session."""
    import onnx

    model = onnx.load(str(model_path))
    with _captured_stderr() as log:
        sess = open_session(model_path, provider_options=provider_options,
                            context_out=context_out, allow_cpu_fallback=True,
                            record_assignment=True, log_level=1)
    assigned = sess.get_provider_graph_assignment_info()
    by_name = {n.name: n for n in model.graph.node if n.name}
    types = _input_types(model)
    macs = node_macs(model)
    cpu: list[CpuNode] = []
    htp_count = total = 0
    for sub in assigned:
        for n in sub.get_nodes():
            total += 1
            if sub.ep_name == EP_NAME:
                htp_count += 1
                continue
            original = by_name.get(n.name)
            inputs = list(original.input) if original is not None else []
            cpu.append(CpuNode(n.op_type, n.name, _why(n.name, n.op_type, inputs, types, log)))
    macs_total = sum(macs.values())
    macs_cpu = sum(macs.get(n.name, 0) for n in cpu)
    return HtpAssignment(nodes_total=total, nodes_htp=htp_count, macs_total=macs_total,
                         macs_htp=macs_total - macs_cpu, cpu_nodes=cpu)
