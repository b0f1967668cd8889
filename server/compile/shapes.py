"""Declared shapes specialize an ONNX graph: a dynamic upload becomes one static graph per
shape variant, which the gates and every compiler then judge.

`specialize(model, specs)`:
  1. checks the declared shapes against the graph: a static dim that differs, or one symbolic
     dim (e.g. 'p2o.DynamicDimension.0') declared with two different sizes, is an
     `InvalidSourceError` naming input, dim, declared and actual;
  2. writes the declared sizes into the inputs' symbolic dims and forgets every inferred
     intermediate/output shape (they were computed for the dynamic graph);
  3. re-runs shape inference and folds the shape arithmetic that became constant
     (Shape → Gather → Concat → Reshape/Resize chains) with onnxslim, without operator fusion,
     so the graph keeps the uploaded operators;
  4. names every dim that is still not static with the node that produces it
     (`ShapeSpecializationError`): such a dim depends on tensor values, not on input shapes.

`If` nodes whose condition the declared shapes decide (`x.shape[1] == 512`, `x.dim() == 2`)
are folded to the branch they take in step 3, in static uploads too; `value_dependent_ifs`
names the rest (their condition reads input values, e.g. a sample-rate scalar). Of those,
one whose branches are plain dataflow with matching static outputs is computed both ways
and selected by `Where` (`server/compile/if_select.py`); the others are refused by name.

`declared_shape_conflicts(model, inputs)` is the upload-time half of step 1: the API refuses a
declaration that contradicts the graph before any build is queued.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from server.compile.errors import InvalidSourceError
from server.compile.if_select import select_ifs
from server.compile.log_rescale import chains as log_power_chains
from server.compile.log_rescale import rescale_logs
from server.compile.prescale import candidates as prescalable
from server.compile.prescale import prescale_sums
from server.compile.quiet import quiet
from server.compile.rnn_unroll import batch_first_rnns, seq_first
from server.compile.types import InputSpec

# onnxslim passes we run: shape inference + constant folding + dead node elimination. Fusions
# (Conv+BN, Gemm, …) and weight tying are left out: they change the operator set the uploader
# gave, and specialization should only make shapes static.
SKIPPED_OPTIMIZATIONS = ["graph_fusion", "weight_tying", "subexpression_elimination"]


@dataclass(frozen=True)
class DimConflict:
    """A declared size that the graph's input contradicts."""

    input: str
    dim: int
    declared: int
    actual: int | str  # a static size, or the symbolic dim declared twice differently
    variant: str = ""

    def message(self) -> str:
        where = f"shape variant {self.variant!r}: " if self.variant else ""
        if isinstance(self.actual, int):
            return (f"{where}input {self.input!r} dim {self.dim} is declared {self.declared} "
                    f"but the ONNX graph fixes it at {self.actual}")
        return (f"{where}input {self.input!r} dim {self.dim} is the graph's symbolic dim "
                f"{self.actual!r}, which other declared inputs set to a different size than "
                f"{self.declared}")


@dataclass(frozen=True)
class UnfixedDim:
    """A tensor dim still not static after specialization, with the node producing it."""

    tensor: str
    dim: str  # "dim 1 ('unk__3')": its index, and the symbolic name inference gave it
    op_type: str
    node: str

    def to_dict(self) -> dict[str, str]:
        return {"tensor": self.tensor, "dim": self.dim, "op_type": self.op_type,
                "node": self.node}


class ShapeSpecializationError(InvalidSourceError):
    """Declared shapes do not make the graph static; `unfixed` names each dim and node."""

    def __init__(self, message: str, unfixed: Sequence[UnfixedDim]) -> None:
        super().__init__(message)
        self.unfixed = list(unfixed)


@dataclass(frozen=True)
class Specialized:
    """What `specialize` did: the symbolic dims it fixed (name -> size) and folded nodes."""

    fixed: dict[str, int]
    nodes_before: int
    nodes_after: int
    ifs_folded: int = 0
    relaid_rnns: tuple[str, ...] = ()  # batch-first RNN nodes rewritten to layout 0
    constants: tuple[str, ...] = ()  # inputs bound to their declared value ("sr=16000")
    ifs_selected: tuple[str, ...] = ()  # value-dependent Ifs as both branches + Where
    sums_prescaled: tuple[str, ...] = ()  # ReduceSum nodes scaled before the sum (FP16)
    logs_rescaled: tuple[str, ...] = ()  # Log nodes of power spectra normalized (FP16)

    def note(self) -> str:
        dims = ", ".join(f"{k}={v}" for k, v in sorted(self.fixed.items()))
        ifs = f", {self.ifs_folded} If node(s) with a constant condition folded" \
            if self.ifs_folded else ""
        head = f"dynamic ONNX specialized to the declared shapes ({dims})" if dims else \
            "static ONNX folded at the declared shapes"
        rnn = (f"; batch-first RNN node(s) {', '.join(self.relaid_rnns)} as layout 0 between "
               "Transposes") if self.relaid_rnns else ""
        consts = (f"; input(s) bound to their declared value ({', '.join(self.constants)})"
                  if self.constants else "")
        selected = (f"; If node(s) {', '.join(self.ifs_selected)} on tensor values computed "
                    "both ways and selected by Where (both branches always run)"
                    if self.ifs_selected else "")
        sums = (f"; {len(self.sums_prescaled)} sum(s) scaled before the ReduceSum instead of "
                "after, so FP16 holds them" if self.sums_prescaled else "")
        logs = (f"; {len(self.logs_rescaled)} log-power chain(s) ({', '.join(self.logs_rescaled)})"
                " normalized at run time, so FP16 holds them" if self.logs_rescaled else "")
        return (f"{head}; shape arithmetic folded{ifs}: {self.nodes_before} → "
                f"{self.nodes_after} nodes{rnn}{consts}{selected}{sums}{logs}")


def graph_inputs(model: Any) -> list[Any]:
    """The graph's real inputs (initializers listed as inputs left out), in order."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


# Symbolic names that mean "unknown", not "the same size wherever it appears" (paddle2onnx
# writes '?' for every unknown dim of an input).
ANONYMOUS_DIMS = frozenset({"", "?", "-1"})


def _dims(vi: Any) -> list[int | str]:
    """Each dim of a value's shape: its size, else its symbolic name ('' when unnamed)."""
    out: list[int | str] = []
    for d in vi.type.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            out.append(d.dim_value)
        else:
            out.append("" if d.dim_param in ANONYMOUS_DIMS else d.dim_param)
    return out


def input_dims(model: Any) -> dict[str, list[int | str]]:
    """Each graph input's dims (size, or symbolic name, '' when unnamed), in graph order."""
    return {vi.name: _dims(vi) for vi in graph_inputs(model)}


def declared_shape_conflicts(graph_dims: Mapping[str, Sequence[int | str]],
                             variants: Mapping[str, Mapping[str, Sequence[int]]]
                             ) -> list[DimConflict]:
    """Declared sizes (variant -> input -> shape) that contradict the graph's input dims
    (input -> dims, as `input_dims` gives them, or as the upload check streams them).

    Inputs the graph does not have, and rank mismatches, are left to `check_inputs`.
    """
    conflicts: list[DimConflict] = []
    for variant, shapes in variants.items():
        symbolic: dict[str, tuple[str, int, int]] = {}
        for name, shape in shapes.items():
            dims = graph_dims.get(name)
            if dims is None or len(dims) != len(shape):
                continue
            for i, (actual, declared) in enumerate(zip(dims, shape, strict=True)):
                if isinstance(actual, int):
                    if actual != declared:
                        conflicts.append(DimConflict(name, i, declared, actual, variant))
                elif actual and actual not in ANONYMOUS_DIMS:
                    seen = symbolic.setdefault(actual, (name, i, declared))
                    if seen[2] != declared:
                        conflicts.append(DimConflict(name, i, declared, actual, variant))
    return conflicts


def check_inputs(model: Any, specs: Sequence[InputSpec]) -> None:
    """Input names, order and rank of the graph against the declared specs."""
    inputs = graph_inputs(model)
    names = [i.name for i in inputs]
    if names != [s.name for s in specs]:
        raise InvalidSourceError(
            f"the ONNX graph's inputs are {names} but the input specs name "
            f"{[s.name for s in specs]}; declare the specs in the graph's order")
    for vi, spec in zip(inputs, specs, strict=True):
        rank = len(vi.type.tensor_type.shape.dim)
        if vi.type.tensor_type.HasField("shape") and rank != len(spec.shape):
            raise InvalidSourceError(
                f"the ONNX graph's input {spec.name!r} has rank {rank} but the declared "
                f"shape {list(spec.shape)} has rank {len(spec.shape)}")


def refuse_dynamic_quantization(model: Any) -> None:
    """A quantized graph (dynamic or static) reaching specialization directly is refused by name:
    shape inference knows nothing of its contrib ops (it would otherwise blame "sizes that
    depend on tensor values"). The build pipeline rewrites such uploads to FP32 first
    (`server/compile/dequantize.py`)."""
    from server.compile.dequantize import quantized_nodes

    found = [(n.op_type, n.name or n.output[0]) for n in quantized_nodes(model)]
    if found:
        named = ", ".join(f"{op} {name!r}" for op, name in found[:6])
        raise InvalidSourceError(
            f"the graph is quantized ({len(found)} node(s): {named}"
            f"{' …' if len(found) > 6 else ''}); rewrite it to FP32 first with "
            "server.compile.dequantize.dequantize_file")


def bind_constants(model: Any, specs: Sequence[InputSpec]) -> tuple[str, ...]:
    """Turns each input declared with a `value` into an initializer holding it (in the
    graph input's dtype), in place; returns "name=value" for each."""
    from onnx import helper, numpy_helper

    bound = []
    for spec in specs:
        if spec.value is None:
            continue
        (vi,) = [vi for vi in model.graph.input if vi.name == spec.name]
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        keep = [i for i in model.graph.input if i.name != spec.name]
        del model.graph.input[:]
        model.graph.input.extend(keep)
        model.graph.initializer.append(numpy_helper.from_array(
            np.asarray(spec.value).astype(dtype), spec.name))
        bound.append(f"{spec.name}={spec.value:g}")
    return tuple(bound)


def is_static(model: Any) -> bool:
    """Whether every graph input dim is a positive size."""
    return all(isinstance(d, int) for vi in graph_inputs(model) for d in _dims(vi)) and all(
        vi.type.tensor_type.HasField("shape") for vi in graph_inputs(model))


def _fix_inputs(model: Any, specs: Sequence[InputSpec]) -> dict[str, int]:
    conflicts = declared_shape_conflicts(input_dims(model),
                                         {"": {s.name: s.shape for s in specs}})
    if conflicts:
        raise InvalidSourceError(
            "; ".join(c.message() for c in conflicts) + ". An ONNX upload compiles only at "
            "sizes its graph allows: declare the graph's fixed sizes, or export it with those "
            "dims dynamic")
    fixed: dict[str, int] = {}
    for vi, spec in zip(graph_inputs(model), specs, strict=True):
        shape = vi.type.tensor_type.shape
        if not vi.type.tensor_type.HasField("shape"):
            shape.SetInParent()
        while len(shape.dim) < len(spec.shape):
            shape.dim.add()
        for i, (d, size) in enumerate(zip(shape.dim, spec.shape, strict=True)):
            if not (d.HasField("dim_value") and d.dim_value > 0):
                named = d.dim_param not in ANONYMOUS_DIMS
                fixed[d.dim_param if named else f"{spec.name}[{i}]"] = size
                d.Clear()
                d.dim_value = size
    return fixed


def static_shapes(model: Any, data_prop: bool = False) -> dict[str, list[int]]:
    """The tensors (inputs, intermediates, outputs) whose inferred shape is static, with it."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=data_prop)
    except Exception:
        return {}
    known: dict[str, list[int]] = {}
    for vi in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            known[vi.name] = [d.dim_value for d in t.shape.dim]
    return known


def _fold(model: Any, op: str, known: dict[str, list[int]], value: Any) -> int:
    """Each `op` node (no attributes) whose input's shape is in `known` becomes the Constant
    `value(shape)`; how many."""
    from onnx import helper, numpy_helper

    folded = 0
    for i, node in enumerate(model.graph.node):
        if node.op_type == op and node.domain in ("", "ai.onnx") and not node.attribute \
                and node.input[0] in known:
            tensor = numpy_helper.from_array(value(known[node.input[0]]),
                                             node.output[0] + "_value")
            model.graph.node[i].CopyFrom(helper.make_node(
                "Constant", [], list(node.output), name=node.name or f"{op.lower()}{i}",
                value=tensor))
            folded += 1
    return folded


def _fold_sizes(model: Any) -> None:
    """`Size` of a tensor whose shape inference fixed at the declared shapes becomes a constant
    (onnxslim folds `Shape` chains but leaves `Size`, so `If x.numel() == N` stayed an `If`)."""
    _fold(model, "Size", static_shapes(model),
          lambda shape: np.array(np.prod(shape, dtype=np.int64), np.int64))


def fold_shapes(model: Any) -> int:
    """`Shape` (whole, no start / end) of a tensor whose shape is static becomes a constant;
    how many. For a graph whose static shapes onnxslim cannot see (its own inference drops
    the types given to contrib operators' outputs: `quantized_upload.static_int8`)."""
    return _fold(model, "Shape", static_shapes(model, data_prop=True),
                 lambda shape: np.array(shape, np.int64))


def forget_inferred_shapes(model: Any) -> None:
    """Intermediate and output shapes were inferred for the dynamic graph: drop them."""
    del model.graph.value_info[:]
    for out in model.graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")


def unfixed_dims(model: Any) -> list[UnfixedDim]:
    """Every node output whose inferred shape still has a non-static dim, named by node."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # best effort; onnxslim already inferred what it could
        inferred = model
    shapes = {vi.name: vi for vi in [*inferred.graph.value_info, *inferred.graph.output]}
    out: list[UnfixedDim] = []
    for i, node in enumerate(inferred.graph.node):
        for name in node.output:
            vi = shapes.get(name)
            if vi is None or not vi.type.HasField("tensor_type"):
                continue
            tt = vi.type.tensor_type
            if not tt.HasField("shape"):
                out.append(UnfixedDim(name, "<unknown rank>", node.op_type,
                                      node.name or f"{node.op_type}{i}"))
                continue
            for j, d in enumerate(tt.shape.dim):
                if not (d.HasField("dim_value") and d.dim_value > 0):
                    label = f"dim {j}" + (f" ({d.dim_param!r})" if d.dim_param else "")
                    out.append(UnfixedDim(name, label, node.op_type,
                                          node.name or f"{node.op_type}{i}"))
    return out


def _origins(unfixed: Iterable[UnfixedDim]) -> list[UnfixedDim]:
    """The first tensor per symbolic dim: where the dynamic size enters the graph."""
    seen: set[str] = set()
    first = []
    for u in unfixed:
        key = u.dim.split(" ", 2)[-1] if "(" in u.dim else f"{u.tensor}:{u.dim}"
        if key not in seen:
            seen.add(key)
            first.append(u)
    return first


def specialize(model: Any, specs: Sequence[InputSpec], *, allow_ifs: bool = False
               ) -> tuple[Any, Specialized]:
    """A static copy of `model` at the declared shapes (see the module docstring);
    `allow_ifs` (the version allows the `If` operator) keeps value-dependent Ifs."""
    import onnx
    import onnxslim

    check_inputs(model, specs)
    work = onnx.ModelProto()
    work.CopyFrom(model)
    nodes_before = len(work.graph.node)
    constants = bind_constants(work, specs)
    specs = [s for s in specs if s.value is None]
    relaid = tuple(seq_first(work))
    fixed = _fix_inputs(work, specs)
    forget_inferred_shapes(work)
    _fold_sizes(work)
    try:
        with quiet():
            slim = onnxslim.slim(work, skip_optimizations=SKIPPED_OPTIMIZATIONS)
    except Exception as e:
        raise InvalidSourceError(
            f"shape inference / constant folding at the declared shapes failed: "
            f"{type(e).__name__}: {e}. Check that the declared shapes are ones the model "
            "accepts (run it once with onnxruntime at those shapes)") from e
    if slim is None:
        raise InvalidSourceError("onnxslim returned no model for the declared shapes")
    remaining = _origins(unfixed_dims(slim))
    if remaining:
        named = "; ".join(f"{u.dim} of {u.tensor!r} (output of {u.op_type} node "
                          f"{u.node!r})" for u in remaining[:10])
        raise ShapeSpecializationError(
            f"the declared shapes do not make the graph static: {named}. These sizes depend "
            "on tensor values, not on input shapes; when they come from a scalar input the "
            "app always feeds the same value (a sample rate), declare that input with its "
            '"value" (e.g. {"name": "sr", "dtype": "int64", "shape": [], "value": 16000}) so '
            "the build folds it; else move that part of the model into app code or export "
            "the model with a static size there", remaining)
    folded = len(if_nodes(work)) - len(if_nodes(slim))
    selected: list[str] = []
    if not allow_ifs:
        selected, kept = select_ifs(slim)
        refuse_value_dependent_ifs(slim, kept)
    prescaled = prescale_sums(slim)
    rescaled = rescale_logs(slim)
    return slim, Specialized(fixed, nodes_before, len(slim.graph.node), folded, relaid,
                             constants, tuple(selected), tuple(prescaled), tuple(rescaled))


def if_nodes(model: Any) -> list[Any]:
    """The graph's top-level `If` nodes."""
    return [n for n in model.graph.node if n.op_type == "If" and n.domain in ("", "ai.onnx")]


def value_dependent_ifs(model: Any) -> list[tuple[str, list[str]]]:
    """(node name, graph inputs its condition reads) for each `If` still in the graph: its
    condition depends on tensor values, not shapes, so no build-time folding decides it."""
    producer = {o: n for n in model.graph.node for o in n.output}
    inputs = {i.name for i in graph_inputs(model)}
    found = []
    for i, node in enumerate(if_nodes(model)):
        seen, todo, reads = set(), [node.input[0]], []
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in inputs:
                reads.append(name)
            elif name in producer:
                todo.extend(x for x in producer[name].input if x)
        found.append((node.name or f"If{i}", sorted(reads)))
    return found


def refuse_value_dependent_ifs(model: Any, unselected: Mapping[str, str] | None = None
                               ) -> None:
    """An `If` left after folding and selection picks its branch from tensor values at run
    time; no compiler here takes control flow, so the build fails naming each one, with why
    it could not be computed both ways (`unselected`: `if_select.select_ifs`'s reasons)."""
    ifs = value_dependent_ifs(model)
    if not ifs:
        return
    why = unselected or {}
    named = "; ".join(
        (f"If node {name!r} (its condition reads the values of input(s) "
         f"{', '.join(map(repr, reads))}" if reads else
         f"If node {name!r} (its condition is computed from values inside the graph")
        + (f"; not computable both ways: {why[name]})" if name in why else ")")
        for name, reads in ifs[:8])
    raise InvalidSourceError(
        f"{len(ifs)} If node(s) whose branch depends on tensor values, not on the declared "
        f"shapes: {named}. A compiled artifact has no control flow: declare a scalar input "
        'the app always feeds the same value with it ("value": 16000 in its input spec) and '
        "the build folds the If; else export the model with that choice made (e.g. trace it "
        "with the value fixed, one version per value), or move the choice into app code")


def specialize_file(path: Path, specs: Sequence[InputSpec], out: Path, *,
                    allow_ifs: bool = False) -> Specialized | None:
    """Writes the static graph for `specs` to `out`; None when the upload was static already
    and has no `If` (then it is copied unchanged: a static upload passes through as it was).
    A static graph with `If` nodes is folded too: a condition computed from input shapes
    (`x.shape[1] == 512`, `x.dim() == 2`) is constant once the shapes are, and the branch it
    takes replaces the `If` (an `If` on tensor values stays; `value_dependent_ifs` names it).
    So is one with a batch-first LSTM / GRU (layout 0 between Transposes, `seq_first`), and
    one whose static inputs still leave intermediate dims unknown to shape inference: sizes
    computed by constant subgraphs (spox inlines Silero's STFT with its `Pad` amounts built by
    ConstantOfShape → Concat → Reshape → Slice → Cast) are only known once those are folded,
    and one with a sum scaled after its ReduceSum (`server/compile/prescale.py`: the scale
    moves before the sum, so FP16 builds hold it), and one with the log of a power spectrum
    of an input (`server/compile/log_rescale.py`: normalized at run time, so FP16 holds it).
    `allow_ifs`: the version's operator gate allows `If` (`allow_ops`), so an `If` on tensor
    values is kept for the runtimes that execute control flow."""
    import onnx

    try:
        model = onnx.load(str(path))
    except Exception as e:
        raise InvalidSourceError(f"cannot read {path.name} as ONNX: {e}") from e
    check_inputs(model, specs)
    refuse_dynamic_quantization(model)
    plain = is_static(model) and not if_nodes(model) and not batch_first_rnns(model) and all(
        s.value is None for s in specs)
    if plain and not unfixed_dims(model) and not prescalable(model) and not \
            log_power_chains(model):
        _fix_inputs(model, specs)  # only checks: static dims that differ are refused
        onnx.save(model, str(out))
        return None
    try:
        static, report = specialize(model, specs, allow_ifs=allow_ifs)
    except ShapeSpecializationError:
        if not plain:
            raise
        # Folding leaves sizes that depend on values (NonMaxSuppression, NonZero): the static
        # upload passes through, and the operator gate names those operators and tensors.
        _fix_inputs(model, specs)
        prescale_sums(model)
        rescale_logs(model)
        onnx.save(model, str(out))
        return None
    onnx.save(static, str(out))
    return report
