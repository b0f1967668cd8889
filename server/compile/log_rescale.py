"""Log-power front ends normalized at run time, so that FP16 holds them.

An audio front end computes `log(P(x))`, where P is a power spectrum: linear maps of the input
(an STFT as two Convs), squared (`Pow(·, 2)` or `a · a`), summed, then linear maps again (a
mel filterbank MatMul), clamped from below, and the log. Fed int16-range samples (openWakeWord
feeds ±32767), the STFT reaches 6.5e6 and its square 4e13, far past FP16's 65,504: the HTP and
Core ML FP16 computed inf, then garbage. Scaling the input by a constant does not help: the
80 dB window the log keeps spans 1e8 in power, FP16's normal range is 1e9, and audio levels
vary by more than the 10 dB left.

P is homogeneous of degree 2, so `log P(x) = log P(x·s) − 2 log s` for any s > 0. The rewrite
picks s at run time, from the values themselves, in two steps:

1. the input is divided by the power of two at or above its largest magnitude (at least
   2^-10), so the linear maps before the square stay within their weights' L1 norms, and the
   samples they read are the plain graph's FP16 values, not rounded once more;
2. the amplitudes the squares read are multiplied by `A / max |amplitude|` (A = 128 for two
   squares: their sum stays under 32,768), so the largest power sits at the top of FP16's
   range and 80 dB below it is still a normal FP16 number;

and after the square each constant-weight linear map's weights are multiplied by the power of
two that keeps its worst-case output (from the weights' L1 norms) just under 32,768, so a mel
filterbank's small weights (Slaney-normalized columns sum to 0.03) do not push the quiet bins
into FP16's subnormals. The lower bounds and epsilons after the square (`Clip(P, 1e-10)`,
`Max(P, c)`, `P + c`) are scaled by the same run-time factor (computed in the log domain, so it
never overflows), and `2 log s` is subtracted after the log. In exact arithmetic the outputs
are unchanged; in FP32 they agree to rounding.

`rescale_logs(model)` rewrites, in place, each `Log` whose input is such a chain from a float
graph input, with every intermediate tensor read only inside the chain (or by `Shape` /
`Size`, which read only its shape); it returns the `Log` nodes' names. The linear maps may
branch and meet again (`Concat`, `Neg`, `Pad`: a CQT's octaves), and a magnitude squared
again, `sqrt(P)²` behind shape ops, is the power P itself (Basic Pitch's `log(|CQT|² + ε)`).
Anything else in the path (a bias, a nonlinearity, a square root not squared again) leaves
that `Log` untouched.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SHAPE_OPS = {"Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Slice"}
WEIGHTED = {"Conv", "MatMul", "Gemm"}
SHAPE_READERS = {"Shape", "Size"}  # read a chain tensor's shape only, which stays as it was
TOP = 32768.0  # the largest value a rescaled power-domain tensor may reach (FP16 max 65,504)
INPUT_FLOOR = 2.0 ** -10  # a silent input is divided by this, not by 0
AMPLITUDE_FLOOR = 2.0 ** -6  # so A / max |amplitude| stays within FP16 (≤ 8192)


@dataclass
class _Chain:
    log: int
    source: str  # the graph input
    amplitude_nodes: list[int] = field(default_factory=list)  # input → amplitudes
    squares: list[tuple[int, str]] = field(default_factory=list)  # (node, amplitude)
    power_nodes: list[int] = field(default_factory=list)  # the squares' sums, then to the log
    bounds: list[tuple[int, int]] = field(default_factory=list)  # (node, input slot) ≥ 0

    def nodes(self) -> set[int]:
        return {*self.amplitude_nodes, *(i for i, _ in self.squares), *self.power_nodes}


class _Graph:
    def __init__(self, model: Any) -> None:
        from onnx import numpy_helper

        self.model = model
        self.nodes = list(model.graph.node)
        self.consts: dict[str, np.ndarray] = {
            t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        for n in self.nodes:
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                self.consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        self.producer = {o: i for i, n in enumerate(self.nodes) for o in n.output}
        self.consumers: dict[str, list[int]] = {}
        for i, n in enumerate(self.nodes):
            for name in n.input:
                self.consumers.setdefault(name, []).append(i)
        self.inputs = {vi.name for vi in model.graph.input} - set(self.consts)
        self.outputs = {o.name for o in model.graph.output}

    def const(self, name: str) -> np.ndarray | None:
        return self.consts.get(name) if name else None

    def weight_input(self, node: Any) -> int | None:
        """The slot of a weighted node's constant weight, when the node is linear in its
        data input (no bias, or a zero one)."""
        ins = list(node.input)
        if node.op_type == "Conv":
            ok = len(ins) < 3 or not ins[2] or _zero(self.const(ins[2]))
            return 1 if ok and self.const(ins[1]) is not None else None
        if node.op_type == "MatMul":
            return 1 if self.const(ins[1]) is not None else None
        if node.op_type == "Gemm":
            attrs = _attrs(node)
            ok = (len(ins) < 3 or not ins[2] or _zero(self.const(ins[2]))
                  or attrs.get("beta", 1.0) == 0) and not attrs.get("transA", 0)
            return 1 if ok and self.const(ins[1]) is not None else None
        return None


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _zero(value: np.ndarray | None) -> bool:
    return value is not None and not np.any(value)


def _scalar(value: np.ndarray | None) -> float | None:
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def _square_of(g: _Graph, node: Any) -> str | None:
    """The amplitude a node squares (`Pow(a, 2)`, `a · a`), else None."""
    if node.op_type == "Pow" and _scalar(g.const(node.input[1])) == 2.0:
        return str(node.input[0])
    if node.op_type == "Mul" and node.input[0] == node.input[1]:
        return str(node.input[0])
    return None


def _power(g: _Graph, name: str, chain: _Chain) -> bool:
    """Walks back from the log's input to the squares; records what it passes."""
    i = g.producer.get(name)
    if i is None:
        return False
    node = g.nodes[i]
    amplitude = _square_of(g, node)
    if amplitude is not None:
        root = _magnitude(g, amplitude)
        if root is None:
            chain.squares.append((i, amplitude))
            return True
        # the square of a magnitude, sqrt(P)²: the power P itself (Basic Pitch's
        # log(|CQT|² + ε) squares the CQT's magnitude again)
        passed, inner = root
        chain.power_nodes += [i, *passed]
        return _power(g, inner, chain)
    chain.power_nodes.append(i)
    op, ins = node.op_type, list(node.input)
    if op == "Add" and not any(g.const(x) is not None for x in ins):
        return _power(g, ins[0], chain) and _power(g, ins[1], chain)
    if op in SHAPE_OPS or op in ("ReduceSum", "ReduceMean"):
        return _power(g, ins[0], chain)
    if op in WEIGHTED and g.weight_input(node) == 1:
        return _power(g, ins[0], chain)
    if op == "Clip":
        if node.attribute:  # opset < 11: bounds as attributes
            return False
        slots = [k for k in (1, 2) if k < len(ins) and ins[k]]
        if any(not _nonnegative(g.const(ins[k])) for k in slots):
            return False
        chain.bounds += [(i, k) for k in slots]
        return _power(g, ins[0], chain)
    if op in ("Mul", "Max", "Min", "Add") and len(ins) == 2:
        slot = next((k for k in (0, 1) if g.const(ins[k]) is not None), None)
        if slot is None:
            return False
        value = g.const(ins[slot])
        if op == "Mul":
            if value is None or value.size != 1 or not np.all(value > 0):
                return False
        elif not _nonnegative(value):
            return False
        else:
            chain.bounds.append((i, slot))
        return _power(g, ins[1 - slot], chain)
    return False


def _magnitude(g: _Graph, name: str) -> tuple[list[int], str] | None:
    """(the nodes passed, P) when `name` is `Sqrt(P)` behind shape ops only, else None."""
    passed: list[int] = []
    while (i := g.producer.get(name)) is not None:
        node = g.nodes[i]
        passed.append(i)
        if node.op_type == "Sqrt":
            return passed, str(node.input[0])
        if node.op_type not in SHAPE_OPS:
            return None
        name = node.input[0]
    return None


def _nonnegative(value: np.ndarray | None) -> bool:
    return value is not None and value.size == 1 and bool(np.all(value >= 0))


def _amplitude(g: _Graph, name: str, chain: _Chain, seen: dict[str, str | None]
               ) -> str | None:
    """The graph input an amplitude is a linear map of, walking back through every branch
    (a `Concat` of the octaves of a CQT); None if it is not. `seen`: tensors walked."""
    if name in g.inputs:
        return name
    if name in seen:
        return seen[name]
    seen[name] = None
    i = g.producer.get(name)
    if i is None:
        return None
    node = g.nodes[i]
    op, ins = node.op_type, list(node.input)
    linear = (op in SHAPE_OPS or op == "Neg"
              or (op in WEIGHTED and g.weight_input(node) == 1)
              or (op == "Mul" and any(g.const(x) is not None for x in ins))
              or (op == "Concat" and all(g.const(x) is None for x in ins))
              or (op == "Pad" and _attrs(node).get("mode", b"constant") in (
                  b"constant", "constant", b"reflect", "reflect", b"edge", "edge")
                  and (len(ins) < 3 or not ins[2] or _zero(g.const(ins[2])))))
    if not linear:
        return None
    chain.amplitude_nodes.append(i)
    data = ([next(x for x in ins if g.const(x) is None)] if op == "Mul" else
            [x for x in ins if x] if op == "Concat" else [ins[0]])
    sources = {_amplitude(g, x, chain, seen) for x in data}
    seen[name] = sources.pop() if len(sources) == 1 else None
    return seen[name]


def chains(model: Any) -> list[_Chain]:
    """Each `Log` of a power spectrum of a graph input that the rewrite takes."""
    g = _Graph(model)
    found = []
    for i, node in enumerate(g.nodes):
        if node.op_type != "Log" or node.domain not in ("", "ai.onnx"):
            continue
        chain = _Chain(log=i, source="")
        if not _power(g, node.input[0], chain) or not chain.squares:
            continue
        seen: dict[str, str | None] = {}
        sources = {_amplitude(g, a, chain, seen) for _, a in chain.squares}
        if len(sources) != 1 or None in sources:
            continue
        chain.source = str(sources.pop())
        inside = chain.nodes() | {i}
        produced = {o for k in chain.nodes() for o in g.nodes[k].output}
        if produced & g.outputs or any(
                c not in inside and g.nodes[c].op_type not in SHAPE_READERS
                for t in produced for c in g.consumers.get(t, [])):
            continue  # a tensor of the chain is read elsewhere: its values must not change
        found.append(chain)
    return found


def rescale_logs(model: Any) -> list[str]:
    """Rewrites each qualifying `Log` (module docstring), in place; returns their names."""
    found = chains(model)
    if not found:
        return []
    # One at a time: each rewrite renumbers the nodes. A rewritten Log no longer qualifies
    # (its bounds and amplitude gains are computed), so this ends.
    return [_rewrite(model, found[0]), *rescale_logs(model)]


def _rewrite(model: Any, chain: _Chain) -> str:
    from onnx import helper, numpy_helper

    g = _Graph(model)
    log = g.nodes[chain.log]
    name = str(log.name or log.output[0])
    tag = f"{name}/fp16range"
    new: list[Any] = []
    inits: list[Any] = []

    def const(name: str, value: float | np.ndarray) -> str:
        if all(t.name != f"{tag}/{name}" for t in inits):  # one initializer per name
            inits.append(numpy_helper.from_array(np.asarray(value, np.float32),
                                                 f"{tag}/{name}"))
        return f"{tag}/{name}"

    def node(op: str, ins: Iterable[str], out: str, **attrs: Any) -> str:
        new.append(helper.make_node(op, list(ins), [f"{tag}/{out}"], name=f"{tag}/{out}",
                                    **attrs))
        return f"{tag}/{out}"

    def peak(name: str, out: str) -> str:
        return node("ReduceMax", [node("Abs", [name], f"{out}_abs")], out, keepdims=0)

    # 1. the input over the power of two at or above its largest magnitude, 2^ceil(log2 peak):
    # dividing by it only moves the exponent, so the STFT reads the very FP16 samples the
    # plain graph reads (divided by the exact peak, each sample was rounded once more, which
    # cost quiet audio ~2 dB: its bins near zero come from cancelling sums)
    top = node("Max", [peak(chain.source, "input_peak"), const("input_floor", INPUT_FLOOR)],
               "input_peak_floored")
    exponent = node("Ceil", [node("Mul", [node("Log", [top], "input_peak_log"),
                                          const("inv_ln2", 1 / math.log(2))],
                                  "input_peak_log2")], "input_exponent")
    m = node("Pow", [const("two", 2.0), exponent], "input_scale")
    x = node("Div", [chain.source, m], "input")
    for k in chain.amplitude_nodes:
        n = g.nodes[k]
        n.input[:] = [x if i == chain.source else i for i in n.input]
    # 2. the amplitudes scaled so the largest power sits under TOP
    amplitudes = sorted({a for _, a in chain.squares})
    level = 2.0 ** math.floor(math.log2(math.sqrt(TOP / len(chain.squares))))
    peaks = [peak(a, f"amplitude_peak{j}") for j, a in enumerate(amplitudes)]
    while len(peaks) > 1:
        peaks = [node("Max", peaks[:2], f"amplitude_peaks{len(peaks)}"), *peaks[2:]]
    gain = node("Div", [const("level", level), node(
        "Max", [peaks[0], const("amplitude_floor", AMPLITUDE_FLOOR)], "amplitude_max")],
        "gain")
    scaled = {a: node("Mul", [a, gain], f"amplitude{j}") for j, a in enumerate(amplitudes)}
    for k, a in chain.squares:
        n = g.nodes[k]
        n.input[:] = [scaled[a] if i == a else i for i in n.input]
    # 3. each weighted map after the square keeps its worst case just under TOP
    bound, factor = level ** 2 * len(chain.squares), 1.0
    for k in sorted(chain.power_nodes):
        n = g.nodes[k]
        if n.op_type in WEIGHTED:
            w = g.consts[n.input[1]].astype(np.float32)
            bound *= _gain_bound(n, w)
            f = 2.0 ** math.floor(math.log2(TOP / bound)) if bound > 0 else 1.0
            bound, factor = bound * f, factor * f
            n.input[1] = const(f"weight{k}", w * np.float32(f))
        elif n.op_type == "ReduceSum":
            bound *= _reduced_count(model, n)
        elif n.op_type == "Sqrt":  # a magnitude, squared again below
            bound = math.sqrt(bound)
        elif _square_of(g, n) is not None:
            bound *= bound
        elif n.op_type == "Mul":
            bound *= max(float(np.max(np.abs(g.consts[i]))) for i in n.input if i in g.consts)
    # log s, with the input scale m and the gain: P(x) · gain² / m² · factor
    log_scale = node("Add", [node("Mul", [node("Sub", [
        node("Log", [gain], "log_gain"), node("Log", [m], "log_input_scale")], "log_ratio"),
        const("two", 2.0)], "log_ratio2"), const("log_factor", math.log(factor))],
        "log_scale")
    # 4. the power-domain constants scale with it (in the log domain: no overflow)
    for k, slot in chain.bounds:
        n = g.nodes[k]
        value = g.consts[n.input[slot]].astype(np.float64)
        if not np.all(np.isfinite(value) & (value > 0)):
            continue  # 0 and inf are the same at every scale (and the HTP's exp(inf) is not)
        log_c = np.log(value)
        n.input[slot] = node("Exp", [node("Add", [const(f"log_constant{k}_{slot}", log_c),
                                                  log_scale], f"log_bound{k}_{slot}")],
                             f"bound{k}_{slot}")
    # 5. log P(x) = log(rescaled) − log s
    out = log.output[0]
    log.output[0] = f"{tag}/log"
    new.append(helper.make_node("Sub", [f"{tag}/log", log_scale], [out], name=f"{tag}/unscale"))
    model.graph.initializer.extend(inits)
    nodes = [*g.nodes, *new]
    del model.graph.node[:]
    model.graph.node.extend(_topological(nodes, {t.name for t in model.graph.initializer}
                                         | {vi.name for vi in model.graph.input}))
    return name


def _gain_bound(node: Any, w: np.ndarray) -> float:
    """The largest |output| per unit of max |input|: the weights' largest L1 norm."""
    if node.op_type == "Conv":
        return float(np.abs(w).reshape(w.shape[0], -1).sum(axis=1).max())
    if node.op_type == "Gemm" and _attrs(node).get("transB", 0):
        w = w.T
    return float(np.abs(w).sum(axis=-2).max()) * abs(float(_attrs(node).get("alpha", 1.0)))


def _reduced_count(model: Any, node: Any) -> float:
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in [*inferred.graph.value_info, *inferred.graph.input]}
    before, after = shapes.get(node.input[0]), shapes.get(node.output[0])
    if not before or after is None or not all(before):
        return TOP  # unknown: assume the worst, which only costs range
    return float(np.prod(before) / max(np.prod([d for d in after if d] or [1]), 1))


def _topological(nodes: list[Any], available: set[str]) -> list[Any]:
    """`nodes` in an order where each reads only what is computed before it (stable; an
    If / Loop body's reads of outer tensors count as the node's inputs)."""
    from server.compile.dequantize import subgraph_reads

    produced = {o for n in nodes for o in n.output}
    needs = [{i for i in (*n.input, *subgraph_reads(n)) if i in produced} for n in nodes]
    ready = set(available)
    pending, out = list(range(len(nodes))), []
    while pending:
        rest = []
        for k in pending:
            if needs[k] <= ready:
                out.append(nodes[k])
                ready.update(nodes[k].output)
            else:
                rest.append(k)
        if len(rest) == len(pending):
            raise ValueError("the rewritten graph has a cycle")  # a bug here, not the upload's
        pending = rest
    return out
