"""Which layers lose the most when quantized, measured on a reference sample (mixed precision).

A layer's loss is the noise it adds: the relative noise power of its output against the
unquantized graph's (10^(-SNR/10)), minus the worst of its inputs'. Errors pile up down a
network, so ranking by output SNR alone would always blame the last layers, and ranking by
SNR dB dropped would always blame the first (exact inputs: an "infinite" drop); noise power
adds up layer over layer, so its increase finds the layers that quantize badly (an
outlier-heavy projection, a first conv on raw pixels).

- QNN: measured at the outputs (`qdq_output_losses`): the QDQ graph is run on onnxruntime's
  CPU provider once per node with a weight (an initializer of rank 2 or more: Conv, MatMul,
  Gemm, …), that node reading its float weight and bias instead of their DequantizeLinear —
  what `nodes_to_exclude` makes of it — and a node's loss is the output noise that removes.
  A local measure misled here: on PP-OCR's direction classifier it blamed the bias Adds of
  the squeeze-excitation convs (-11 dB on 8 values a ReLU then mostly zeroes), while one
  depthwise conv, kept float, lifts the output from 37.0 to 46.5 dB. `onnx_losses` (tensor by
  tensor, `layers.all_layers`) stays for a QDQ graph without its float twin.
- Core ML: measured at the outputs too (`coreml_output_losses`): the compressed package runs
  in the MIL reference executor once per op that consumes a compressed weight (the
  `op_name_configs` candidates), that op reading the weight the uncompressed package holds,
  and its loss is the output noise that removes. `coreml_losses` (the compressed package
  against the uncompressed one, op by op with intermediates kept) stays for a search
  without reference outputs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from server.compile.gates.layers import all_layers, layer_metrics
from server.compile.gates.metrics import snr_db
from server.compile.qdq_prep import quantizer_inputs, readers

# SNRs are clamped to ±this before conversion to noise power.
_EXACT_DB = 140.0


@dataclass(frozen=True)
class LayerLoss:
    name: str  # the name the compiler's exclusion setting takes (ONNX node / MIL op name)
    op: str
    snr_db: float  # of the layer's output ("layer"), or of the outputs with it float
    added_noise: float  # relative noise power this layer added (output's minus inputs')
    measured: str = "layer"  # "layer": at its own output; "outputs": at the graph's outputs

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.name, "op": self.op, "snr_db": round(self.snr_db, 2),
                "added_noise": float(f"{self.added_noise:.4g}"), "measured": self.measured}


def _noise(snr_db: float) -> float:
    """Relative noise power of a tensor with this SNR (0 for an exact one)."""
    if math.isinf(snr_db) and snr_db > 0:
        return 0.0
    return 10 ** (-max(min(snr_db, _EXACT_DB), -_EXACT_DB) / 10)


def _loss(name: str, op: str, snr_out: float, snr_in: list[float]) -> LayerLoss:
    worst_in = max((_noise(x) for x in snr_in), default=0.0)
    return LayerLoss(name, op, snr_out, max(_noise(snr_out) - worst_in, 0.0))


def _rank(losses: list[LayerLoss]) -> list[LayerLoss]:
    return sorted(losses, key=lambda x: -x.added_noise)


def onnx_losses(source: Path, quantized: Path, feeds: dict[str, Any]) -> list[LayerLoss]:
    """Nodes of the FP32 `source`, most loss added first, against the QDQ graph `quantized`."""
    import onnx

    metrics = {m.tensor: m for m in all_layers(source, quantized, feeds)}
    model = onnx.load(str(source))
    weights = {t.name for t in model.graph.initializer if len(t.dims) >= 2}
    reading = readers(model)

    def measured(node: Any) -> list[Any]:
        """The node's outputs as the quantized graph has them; for a node a fusion swallowed
        (a MatMul whose Add the QNN preprocessing fused into one Gemm: its output is gone),
        those of its one reader."""
        outs = [metrics[t] for t in node.output if t in metrics]
        if outs or len(node.output) != 1 or len(reading.get(node.output[0], [])) != 1:
            return outs
        return [metrics[t] for t in reading[node.output[0]][0].output if t in metrics]

    out = []
    for i, node in enumerate(model.graph.node):
        outs = measured(node)
        if not outs or not any(t in weights for t in node.input):
            continue
        out.append(_loss(node.name or f"{node.op_type}_{i}", node.op_type,
                         min(m.snr_db for m in outs),
                         [metrics[t].snr_db for t in node.input if t in metrics]))
    return _rank(out)


# Output-referred measurement costs one CPU run of the QDQ graph per candidate: bounded.
OUTPUT_MEASURE_SECONDS = 180.0
OUTPUT_MEASURE_NODES = 256


def _float_inputs(qdq: Any, floats: dict[str, Any]) -> dict[int, dict[int, str]]:
    """Per node index of the QDQ graph, the inputs that read a DequantizeLinear of a quantized
    initializer whose float original `floats` holds (input slot -> float name); only nodes
    with a weight among them (rank 2 or more), as `nodes_to_exclude` candidates."""
    consts = {t.name for t in qdq.graph.initializer}
    dq_of = {n.output[0]: n.input[0] for n in qdq.graph.node
             if n.op_type == "DequantizeLinear" and n.input[0] in consts}
    out: dict[int, dict[int, str]] = {}
    for i, node in enumerate(qdq.graph.node):
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        slots = {k: dq_of[x].removesuffix("_quantized") for k, x in enumerate(node.input)
                 if x in dq_of and dq_of[x].removesuffix("_quantized") in floats}
        if any(len(floats[f].dims) >= 2 for f in slots.values()):
            out[i] = slots
    return out


def spread(items: list[Any], n: int) -> list[Any]:
    """At most `n` of `items`, evenly spaced from the first to the last: when not every node
    can be measured, the ones measured cover the whole graph, not its first layers."""
    if len(items) <= n:
        return items
    if n <= 1:
        return items[:n]
    return [items[round(j * (len(items) - 1) / (n - 1))] for j in range(n)]


def _source_name(name: str, known: set[str]) -> str | None:
    """The uploaded node a QDQ-graph node stands for: itself, or the node a fusion named it
    after ("<node>/MatMulAddFusion"), which is what `keep_float_nodes` takes."""
    while name:
        if name in known:
            return name
        name = name.rpartition("/")[0]
    return None


def quantizer_input(quantized: Path, source: Path) -> Path:
    """The graph the quantizer was given for `quantized` (`qdq_prep.quantizer_inputs`, the
    last step's first; `source` when no step changed it): its initializers are the float
    originals of the quantized ones."""
    prepared, prepped = quantizer_inputs(quantized)
    return next((p for p in (prepped, prepared) if p.is_file()), source)


def qdq_output_losses(source: Path, quantized: Path, feeds: list[dict[str, Any]],
                      expected: list[list[Any]], seconds: float = OUTPUT_MEASURE_SECONDS
                      ) -> list[LayerLoss]:
    """Nodes of the QDQ graph `quantized`, as nodes of `source`, most output noise removed
    first when that node alone reads float weights (from `quantizer_input`); the outputs
    are judged against `expected` (the FP32 source's, per sample) by their worst SNR, as
    the gate judges them. At most `OUTPUT_MEASURE_NODES` nodes, and as many as `seconds`
    allow at the time one run took, are measured, evenly spread over the graph when that
    is not all of them (`spread`)."""
    import onnx

    from server.compile.gates.layers import cpu_session

    model = onnx.load(str(quantized))
    floats = {t.name: t for t in
              onnx.load(str(quantizer_input(quantized, source))).graph.initializer}
    known = {n.name for n in onnx.load(str(source), load_external_data=False).graph.node}

    def run() -> float:
        sess = cpu_session(model)
        wanted = {i.name for i in sess.get_inputs()}
        return _worst(expected, [sess.run(None, {k: v for k, v in f.items() if k in wanted})
                                 for f in feeds])

    def worst_snr(change: tuple[Any, dict[int, str]] | None) -> float:
        if change is None:
            return run()
        node, slots = change
        before = list(node.input)
        for k, f in slots.items():
            twin = f + "::float"  # a bias's DequantizeLinear output keeps the bias's name
            if twin not in added:  # the twins stay in the graph, unread, once added
                model.graph.initializer.append(floats[f])
                model.graph.initializer[-1].name = twin
                added.add(twin)
            node.input[k] = twin
        try:
            return run()
        finally:
            del node.input[:]
            node.input.extend(before)

    added: set[str] = set()
    cands = [(name, model.graph.node[i].op_type, (model.graph.node[i], slots))
             for i, slots in _float_inputs(model, floats).items()
             if (name := _source_name(model.graph.node[i].name, known)) is not None]
    return _measured_at_outputs(cands, worst_snr, seconds)


def _worst(expected: list[list[Any]], got: list[list[Any]]) -> float:
    """The worst SNR of any output of any sample against the FP32 one (as the gate judges)."""
    return min(snr_db(np.asarray(e), np.asarray(g, np.float32))
               for exp, out in zip(expected, got, strict=True)
               for e, g in zip(exp, out, strict=True))


C = TypeVar("C")


def _measured_at_outputs(cands: list[tuple[str, str, C]],
                         worst_snr: Callable[[C | None], float], seconds: float
                         ) -> list[LayerLoss]:
    """Each candidate's (name, op type, change) gain at the outputs: `worst_snr(None)` is the
    quantized build's, `worst_snr(change)` with that one layer at higher precision. At most
    `OUTPUT_MEASURE_NODES`, and as many as `seconds` allow at the time the first run took,
    evenly `spread` over the graph when that is not all of them; most gain first."""
    started = time.monotonic()
    base = _noise(worst_snr(None))
    run = max(time.monotonic() - started, 1e-3)
    deadline = started + seconds
    out = []
    for name, op_type, change in spread(cands, min(OUTPUT_MEASURE_NODES,
                                                   max(int(seconds / run) - 1, 1))):
        if time.monotonic() > deadline:
            break
        snr = worst_snr(change)
        out.append(LayerLoss(name, op_type, snr, max(base - _noise(snr), 0.0), "outputs"))
    return _rank(out)


def _compressed_vars(ops: list[Any]) -> set[str]:
    """The vars of a MIL program that its `constexpr_*` ops (compressed weights) produce."""
    return {o.name for op in ops if op.type.startswith("constexpr_") for o in op.outputs}


def _weight_args(op: Any) -> list[tuple[str, int, str]]:
    """(input key, position, var name) of each named argument of a MIL op."""
    return [(key, i, a.name) for key, arg in op.inputs.items()
            for i, a in enumerate(arg.arguments) if a.WhichOneof("binding") == "name"]


def coreml_output_losses(plain: Path, compressed: Path, feeds: list[dict[str, Any]],
                         expected: list[list[Any]], seconds: float = OUTPUT_MEASURE_SECONDS
                         ) -> list[LayerLoss]:
    """Ops of the `compressed` package that read a compressed weight, most output noise
    removed first when that op alone reads its weight as the `plain` package holds it (same
    program, uncompressed weights); the outputs are judged against `expected` (the FP32
    source's, per sample) by their worst SNR, as the gate judges them. As for QNN
    (`qdq_output_losses`), and bounded the same way. The local measure (`coreml_losses`)
    misled on silero: its int8 package (37.0 dB on the state output) went to 35.4, 34.2
    and 38.4 dB with the first one, two and three layers it ranked kept at FP16."""
    from server.compile.milexec import MilExecutor
    from server.compile.onnx_mil.context import mil_name

    feeds = [{mil_name(k): v for k, v in f.items()} for f in feeds]
    cand_ex = MilExecutor(compressed)
    plain_ex = MilExecutor(plain)
    plain_weights = plain_ex.weights()
    plain_ops = {_op_name(op, op.outputs[0].name if op.outputs else ""): op
                 for op in plain_ex.operations}
    compressed_vars = _compressed_vars(cand_ex.operations)

    def worst_snr(weights: dict[str, Any] | None) -> float:
        got = [cand_ex.run(f, weights=weights) for f in feeds]
        return _worst(expected, [[out[n] for n in cand_ex.output_names] for out in got])

    cands: list[tuple[str, str, dict[str, Any]]] = []
    for op in cand_ex.operations:
        if op.type == "const" or op.type.startswith("constexpr_") or not op.outputs:
            continue
        name = _op_name(op, op.outputs[0].name)
        twin = plain_ops.get(name)
        if twin is None:
            continue
        floats = {(key, pos): var for key, pos, var in _weight_args(twin)
                  if var in plain_weights}
        swap = {var: plain_weights[floats[(key, pos)]] for key, pos, var in _weight_args(op)
                if var in compressed_vars and (key, pos) in floats}
        if swap:
            cands.append((name, op.type, swap))
    return _measured_at_outputs(cands, worst_snr, seconds)


def _op_name(op: Any, fallback: str) -> str:
    attr = op.attributes.get("name")
    values = attr.immediateValue.tensor.strings.values if attr is not None else []
    return str(values[0]) if values else fallback


def coreml_losses(plain: Path, compressed: Path, feeds: dict[str, Any]) -> list[LayerLoss]:
    """Ops of the `compressed` package that read a compressed weight, most loss added first,
    against the `plain` package (same program, uncompressed weights)."""
    from server.compile.milexec import MilExecutor
    from server.compile.onnx_mil.context import mil_name

    # The package's inputs carry MIL identifiers ('state.workaround' → 'state_workaround'),
    # as in CoreMLCompiler.run: without it, silero's int8 search could not rank a layer.
    feeds = {mil_name(k): v for k, v in feeds.items()}
    ref_ex, cand_ex = MilExecutor(plain), MilExecutor(compressed)
    ref = ref_ex.run(feeds, keep_intermediates=True)
    cand = cand_ex.run(feeds, keep_intermediates=True)
    ops = cand_ex.operations
    compressed_vars = _compressed_vars(ops)
    snr: dict[str, float] = {}
    out = []
    for op in ops:
        if op.type == "const" or op.type.startswith("constexpr_") or not op.outputs:
            continue
        var = op.outputs[0].name
        if var not in ref or var not in cand or np.asarray(ref[var]).dtype.kind not in "fc":
            continue
        m = layer_metrics(np.asarray(ref[var]), np.asarray(cand[var]), var, op.type, var)
        snr[var] = m.snr_db
        args = [name for _, _, name in _weight_args(op)]
        if not any(a in compressed_vars for a in args):
            continue
        out.append(_loss(_op_name(op, var), op.type, snr[var], [snr[a] for a in args
                                                                  if a in snr]))
    return _rank(out)
