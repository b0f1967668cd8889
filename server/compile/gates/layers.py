"""Where agreement is lost: per-layer comparison of the intermediate tensors of two ONNX graphs.

Seed §13.1 asks for a layer-by-layer, tensor-by-tensor comparison ("逐层/逐张量对比"). Both
graphs (the FP32 source, and the source at the artifact's precision or an ONNX artifact) are
run on onnxruntime's CPU provider with every float tensor that both compute, under the same
name, exposed as an extra graph output; the tensors are compared in the reference graph's
node order (topological, as ONNX requires), and the first node whose output falls below the
thresholds is named with its figures (node name, op type, cosine, SNR, max abs diff).

The candidate runs on the CPU provider, or on the runtime that built the artifact when it can
expose intermediates (the QNN compiler opens an HTP session on the graph it compiled). Memory
stays bounded: the tensors are fetched in chunks of `CHUNK` per run, and the walk stops at the
first chunk holding a failing tensor. A candidate whose every run costs a compile (the HTP's)
is fetched in runs bounded by bytes instead (`Candidate.max_bytes`, the float32 size of each
tensor from shape inference): a model with small activations needs one compile, not one per
`CHUNK` tensors. One sample is enough to localize; the caller passes the first reference
sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from server.compile.gates.metrics import cosine, snr_db

CHUNK = 48  # intermediate tensors fetched per run
# A tensor whose shape inference leaves unknown counts as this many bytes against a budget.
UNKNOWN_BYTES = 4 * 1024**2
_FLOAT_TYPES = (1, 10, 11, 16)  # FLOAT, FLOAT16, DOUBLE, BFLOAT16


@dataclass(frozen=True)
class LayerMetrics:
    node: str
    op: str
    tensor: str
    cosine: float
    snr_db: float
    max_abs_diff: float

    def below(self, min_cosine: float, min_snr_db: float) -> bool:
        return not (self.cosine > min_cosine and self.snr_db > min_snr_db)

    def to_dict(self) -> dict[str, Any]:
        def num(x: float) -> float | str:
            return x if math.isfinite(x) else ("inf" if x > 0 else "-inf")

        return {"node": self.node, "op": self.op, "tensor": self.tensor,
                "cosine": num(self.cosine), "snr_db": num(self.snr_db),
                "max_abs_diff": num(self.max_abs_diff)}

    def describe(self) -> str:
        return (f"{self.op} node {self.node!r} (tensor {self.tensor!r}): cosine "
                f"{self.cosine:.6f}, SNR {self.snr_db:.1f} dB, max abs diff "
                f"{self.max_abs_diff:.3g}")


@dataclass
class Localization:
    """The first layer below the thresholds (None: every compared layer agrees) and how many
    layers were compared up to it."""

    first: LayerMetrics | None
    compared: int
    basis: str  # what was compared with what, e.g. "source FP32 vs source at FP16"
    before: LayerMetrics | None = None  # the last layer that still agreed

    def to_dict(self) -> dict[str, Any]:
        return {"basis": self.basis, "compared": self.compared,
                "first_below": None if self.first is None else self.first.to_dict(),
                "last_agreeing": None if self.before is None else self.before.to_dict()}

    def sentence(self) -> str:
        if self.first is None:
            return (f"{self.basis}: all {self.compared} intermediate tensors agree; the loss "
                    "appears only at the outputs")
        return f"{self.basis}: agreement first falls below the threshold at {self.first.describe()}"


def _graph_tensors(model: Any) -> list[tuple[str, str, str]]:
    """(tensor, node name, op type) of every float node output, in graph order."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    types = {vi.name: vi.type.tensor_type.elem_type
             for vi in [*inferred.graph.value_info, *inferred.graph.output]}
    out = []
    for i, node in enumerate(model.graph.node):
        if node.op_type == "Constant":
            continue
        for t in node.output:
            if t and types.get(t) in _FLOAT_TYPES:
                out.append((t, node.name or f"{node.op_type}_{i}", node.op_type))
    return out


def tensor_bytes(model: Any) -> dict[str, int]:
    """The float32 size in bytes of each tensor whose inferred shape is static."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    out = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        dims = vi.type.tensor_type.shape.dim
        if vi.type.HasField("tensor_type") and all(d.HasField("dim_value") for d in dims):
            out[vi.name] = 4 * math.prod(d.dim_value for d in dims)
    return out


def available_tensors(model: Any) -> set[str]:
    names = {o for n in model.graph.node for o in n.output if o}
    return names | {i.name for i in model.graph.input}


def producers(model: Any) -> dict[str, str]:
    """Tensor name → the op type computing it ("" for a graph input)."""
    made = {o: n.op_type for n in model.graph.node for o in n.output if o}
    return {**{i.name: "" for i in model.graph.input}, **made}


Opener = Callable[[Any], Any]  # ModelProto -> a session with get_inputs() and run()


def cpu_session(model: Any) -> Any:
    """An onnxruntime CPU session with graph optimizations off: a fused node would hide the
    very tensors compared here."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), sess_options=opts,
                                providers=["CPUExecutionProvider"])


class _Aliased:
    """A session whose `run` reads each asked-for tensor from the graph output `aliases`
    names for it (a tap), or from the tensor itself."""

    def __init__(self, session: Any, aliases: dict[str, str]) -> None:
        self.session, self.aliases = session, aliases

    def get_inputs(self) -> Any:
        return self.session.get_inputs()

    def run(self, names: list[str], feeds: dict[str, NDArray[Any]]) -> Any:
        return self.session.run([self.aliases.get(n, n) for n in names], feeds)


def tapped(opener: Opener) -> Opener:
    """`opener` on the model (edited in place) with each quantized tensor read through a tap
    (qdq_prep.tap_quantized): the value the next layer reads. The QNN compiler's HTP
    sessions are opened so, and the reference of such a candidate too (`tapped_cpu_session`),
    so the two sides compare like for like."""
    def open_tapped(model: Any) -> Any:
        from server.compile.qdq_prep import tap_quantized

        aliases = tap_quantized(model)
        return _Aliased(opener(model), aliases)
    return open_tapped


tapped_cpu_session = tapped(cpu_session)


def run_tensors(model: Any, tensors: list[str], feeds: dict[str, NDArray[Any]], opener: Opener
         ) -> dict[str, NDArray[Any]]:
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    present = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.ValueInfoProto(name=t) for t in tensors if t not in present)
    sess = opener(m)
    wanted = {i.name for i in sess.get_inputs()}
    values = sess.run(tensors, {k: v for k, v in feeds.items() if k in wanted})
    return dict(zip(tensors, (np.asarray(v) for v in values), strict=True))


Fetch = Callable[[list[str]], dict[str, NDArray[Any]]]  # tensor names -> values, one sample


@dataclass(frozen=True)
class Candidate:
    """Something whose intermediate tensors can be read by ONNX tensor name: an ONNX graph on
    a session `opener`, or another runtime (the MIL executor) behind `fetch`. `max_bytes`:
    each fetch asks for at most this many float32 bytes (and at most the caller's chunk of
    tensors), for a runtime where every run costs a compile; None: the chunk alone."""

    names: Container[str]  # an ONNX graph's: a mapping to the op computing each (`producers`)
    fetch: Fetch
    max_bytes: int | None = None
    tapped: bool = False  # reads a QDQ graph's quantized tensors through taps

    @classmethod
    def onnx(cls, model: Path | Any, feeds: dict[str, NDArray[Any]],
             opener: Opener = cpu_session, max_bytes: int | None = None,
             tapped: bool = False) -> Candidate:
        import onnx

        m = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
        return cls(producers(m), lambda names: run_tensors(m, names, feeds, opener),
                   max_bytes, tapped)

    def reference_opener(self) -> Opener:
        """How to run the reference so that it is read the way this candidate is."""
        return tapped_cpu_session if self.tapped else cpu_session


def graph_order(names_from: Path | Any, common: Container[str]
                ) -> list[tuple[str, str, str]]:
    """(tensor, node, op) of the float node outputs of `names_from` that are in `common`, in
    its (topological) node order."""
    import onnx

    named = names_from if isinstance(names_from, onnx.ModelProto) else onnx.load(str(names_from))
    return [t for t in _graph_tensors(named) if t[0] in common]


def same_operator(order: list[tuple[str, str, str]], made: Mapping[str, str]
                  ) -> list[tuple[str, str, str]]:
    """The tensors of `order` that the candidate computes with the same operator (`made`:
    `producers`). A quantized upload's int8 graph keeps names its FP32 rewrite computes
    otherwise: a ConvInteger's int32 sum, or its Cast, bears the name of the rewrite's Conv
    at another scale."""
    return [t for t in order if made.get(t[0], t[2]) in (t[2], "")]


def batches(order: list[tuple[str, str, str]], chunk: int, sizes: Mapping[str, int] | None = None,
            max_bytes: int | None = None) -> Iterator[list[tuple[str, str, str]]]:
    """`order` in consecutive runs of at most `chunk` tensors and, with `max_bytes`, at most
    that many bytes by `sizes` (an unknown size counts `UNKNOWN_BYTES`; a single tensor over
    the budget is a run of its own)."""
    part: list[tuple[str, str, str]] = []
    used = 0
    for item in order:
        size = (sizes or {}).get(item[0], UNKNOWN_BYTES) if max_bytes is not None else 0
        if part and (len(part) >= chunk or (max_bytes is not None and used + size > max_bytes)):
            yield part
            part, used = [], 0
        part.append(item)
        used += size
    if part:
        yield part


def compare_layers(order: list[tuple[str, str, str]], reference: Fetch, candidate: Fetch,
                   clip: float | None = None, chunk: int = CHUNK,
                   sizes: Mapping[str, int] | None = None, max_bytes: int | None = None
                   ) -> Iterator[LayerMetrics]:
    """The metrics of each tensor of `order` both sides computed with the same size, fetched
    in `batches` (a caller that stops early stops the runs too)."""
    for part in batches(order, chunk, sizes, max_bytes):
        names = [t for t, _, _ in part]
        got_ref, got_cand = reference(names), candidate(names)
        for tensor, node, op in part:
            a, b = got_ref.get(tensor), got_cand.get(tensor)
            if a is None or b is None or a.size != b.size or a.size == 0:
                continue
            if clip is not None:
                a = np.clip(a.astype(np.float64), -clip, clip)
                b = np.clip(b.astype(np.float64), -clip, clip)
            yield layer_metrics(a, b, node, op, tensor)


def layer_metrics(ref: NDArray[Any], cand: NDArray[Any], node: str, op: str,
                  tensor: str) -> LayerMetrics:
    a = np.asarray(ref, dtype=np.float64)
    b = np.asarray(cand, dtype=np.float64).reshape(a.shape)
    # The same infinity on both sides agrees: an additive attention mask of -inf (MiniLM's
    # export) masks in an INT8 artifact as in the source. Left in, inf - inf made the
    # tensor's SNR -inf and named the mask as the first failing layer.
    same_inf = np.isinf(a) & (a == b)
    if same_inf.any():
        a, b = a[~same_inf], b[~same_inf]
    diff = a - b  # once, for the SNR's noise and the max abs diff
    return LayerMetrics(node=node, op=op, tensor=tensor, cosine=cosine(a, b),
                        snr_db=snr_db(a, b, diff),
                        max_abs_diff=float(np.nanmax(np.abs(diff))) if diff.size else 0.0)


def first_divergence(reference: Path | Any, candidate: Path | Any | Candidate,
                     feeds: dict[str, NDArray[Any]], min_cosine: float, min_snr_db: float,
                     basis: str, clip: float | None = None, opener: Opener = cpu_session,
                     chunk: int = CHUNK, names_from: Path | None = None,
                     same_op: bool = False) -> Localization:
    """Compares the float tensors both graphs compute (same name, same size), in the reference
    graph's order, and returns the first one below `min_cosine` / `min_snr_db`. With `clip`
    (FP16's 65504), values beyond the precision's range count as saturated in both: a mask
    of -3.4e38 that FP16 holds as -65504 still masks. `opener` runs an ONNX candidate
    (default: the CPU provider; the QNN compiler passes an HTP session), `chunk` tensors per
    run; a `Candidate` brings its own runtime (the MIL executor of a Core ML package).
    `names_from` (the FP32 source) gives the order and the node names when the reference is
    a rewritten copy of it (the FP16 yardstick, whose tensors come out of rounding casts).
    `same_op`: only tensors both compute with the same operator (`same_operator`; an ONNX
    candidate that is a quantized upload's own int8 graph)."""
    import onnx

    ref = reference if isinstance(reference, onnx.ModelProto) else onnx.load(str(reference))
    cand = candidate if isinstance(candidate, Candidate) else \
        Candidate.onnx(candidate, feeds, opener)
    order = graph_order(ref if names_from is None else names_from,
                        {n for n in available_tensors(ref) if n in cand.names})
    if same_op and isinstance(cand.names, Mapping):
        order = same_operator(order, cand.names)
    sizes = tensor_bytes(ref) if cand.max_bytes is not None else None
    compared, last_ok = 0, None
    opener = cand.reference_opener()
    for m in compare_layers(order, lambda names: run_tensors(ref, names, feeds, opener),
                            cand.fetch, clip, chunk, sizes, cand.max_bytes):
        compared += 1
        if m.below(min_cosine, min_snr_db):
            return Localization(first=m, compared=compared, basis=basis, before=last_ok)
        last_ok = m
    return Localization(first=None, compared=compared, basis=basis, before=last_ok)


def all_layers(reference: Path | Any, candidate: Path | Any, feeds: dict[str, NDArray[Any]],
               opener: Opener = cpu_session, chunk: int = CHUNK) -> list[LayerMetrics]:
    """The metrics of every float tensor both graphs compute, in the reference graph's order
    (the precision search ranks layers by the loss each adds; `first_divergence` stops at
    the first one below a threshold instead)."""
    import onnx

    ref = reference if isinstance(reference, onnx.ModelProto) else onnx.load(str(reference))
    cand = Candidate.onnx(candidate, feeds, opener)
    order = graph_order(ref, {n for n in available_tensors(ref) if n in cand.names})
    return list(compare_layers(order, lambda names: run_tensors(ref, names, feeds, cpu_session),
                               cand.fetch, chunk=chunk))
