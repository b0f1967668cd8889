"""Precision islands on the HTP: chosen nodes kept at FP32 on the device's CPU EP, inside the
same EPContext artifact.

onnxruntime-qnn 2.7 has no per-node placement option: `op_affinity` pins whole op types (every
LSTM, every Mul), and it lowers float64 nodes to the HTP as well (measured: a graph cast to
double ran entirely on the HTP, with FP16's underflow), so neither keeps one node at FP32.
What it does do: in a model that holds EPContext nodes, the QNN EP claims only those, and
every ordinary ONNX node runs on the CPU EP at the precision the graph states.

So the graph is cut around the island (a convex set of node names): the nodes that do not
depend on it (part A) and those that do (part B) are each compiled to an EPContext model on
the HTP, and the artifact is A's EPContext node(s), the island's ordinary nodes, then B's —
one ONNX file, loaded by the same session options as any partial-offload QNN artifact
(CPU EP fallback allowed; the manifest's `cpu_nodes` compile setting tells the device).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server.compile.errors import InvalidSourceError
from server.compile.htp_support import CpuNode, HtpAssignment, node_macs

EPCONTEXT_DOMAIN = "com.microsoft"


@dataclass(frozen=True)
class Cut:
    """The source graph split around the island: part A, island, part B (node lists), each
    with copies of the constant-computing nodes it reads (a tensor computed from constants
    alone crosses no boundary: the QNN EP takes an EPContext input only as a runtime tensor)."""

    before: list[Any]
    island: list[Any]
    after: list[Any]


# Nodes whose output is not a function of their inputs alone are never treated as constants.
_RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
           "Multinomial", "Bernoulli"}


def _constant_nodes(model: Any, island: set[str]) -> set[str]:
    const = {t.name for t in model.graph.initializer}
    found: set[str] = set()
    for n in model.graph.node:
        if n.name not in island and n.op_type not in _RANDOM \
                and all(i in const for i in n.input if i):
            found.add(n.name)
            const.update(o for o in n.output if o)
    return found


def _with_constants(group: list[Any], consts: dict[str, Any], order: list[str]) -> list[Any]:
    """`group` preceded by the constant nodes it reads, transitively, in graph order."""
    producer = {o: n for n in consts.values() for o in n.output if o}
    need: set[str] = set()
    stack = [i for n in group for i in n.input]
    while stack:
        p = producer.get(stack.pop())
        if p is not None and p.name not in need:
            need.add(p.name)
            stack.extend(p.input)
    return [consts[n] for n in order if n in need] + group


def convex(model: Any, names: Iterable[str]) -> list[str]:
    """`names` plus every node on a path between two of them (so the island can run as one
    step between part A and part B), in graph order; unknown names are refused."""
    nodes = list(model.graph.node)
    known = {n.name for n in nodes}
    wanted = list(dict.fromkeys(names))
    missing = [n for n in wanted if n not in known]
    if missing:
        raise InvalidSourceError(f"qnn fp32_nodes names node(s) the graph does not have: "
                                 f"{', '.join(missing[:5])} (ONNX node names, as the build "
                                 "report's layer diff gives them)")
    island = set(wanted)
    producer = {o: n.name for n in nodes for o in n.output if o}
    # below[n]: n depends on an island node; above: an island node depends on n
    below: set[str] = set()
    for n in nodes:
        if any(producer.get(i) in island or producer.get(i) in below for i in n.input):
            below.add(n.name)
    above: set[str] = set()
    for n in reversed(nodes):
        if n.name in island or n.name in above:
            above.update(producer[i] for i in n.input if i in producer)
    return [n.name for n in nodes if n.name in island or (n.name in below and n.name in above)]


def cut(model: Any, island: list[str]) -> Cut:
    wanted = set(island)
    constant = _constant_nodes(model, wanted)
    producer = {o: n.name for n in model.graph.node for o in n.output if o}
    depends: set[str] = set()
    before, mid, after = [], [], []
    for n in model.graph.node:
        if n.name in constant:
            continue
        if n.name in wanted:
            mid.append(n)
            depends.add(n.name)
        elif any(producer.get(i) in depends for i in n.input):
            after.append(n)
            depends.add(n.name)
        else:
            before.append(n)
    consts = {n.name: n for n in model.graph.node if n.name in constant}
    order = [n.name for n in model.graph.node]
    return Cut(*(_with_constants(g, consts, order) if g else g for g in (before, mid, after)))


def _typed(model: Any) -> dict[str, Any]:
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    return {vi.name: vi for vi in [*inferred.graph.input, *inferred.graph.value_info,
                                   *inferred.graph.output]}


def _part(model: Any, nodes: list[Any], needed_later: set[str], typed: dict[str, Any],
          name: str) -> Any:
    """A standalone model of `nodes`: inputs are what they read that they do not make,
    outputs what they make that the rest of the graph (or its outputs) reads."""
    from onnx import helper

    inits = {t.name: t for t in model.graph.initializer}
    made = {o for n in nodes for o in n.output if o}
    read = list(dict.fromkeys(i for n in nodes for i in n.input if i))
    missing = [t for t in [*read, *made] if t not in typed and t not in inits]
    if missing:
        raise InvalidSourceError(f"precision island: shape inference gives no type for "
                                 f"{missing[0]!r}; the graph needs static, inferable shapes")
    graph = helper.make_graph(
        nodes, name,
        [typed[t] for t in read if t not in made and t not in inits],
        [typed[t] for t in dict.fromkeys(o for n in nodes for o in n.output)
         if t in needed_later],
        [inits[t] for t in read if t in inits])
    part = helper.make_model(graph, opset_imports=list(model.opset_import))
    part.ir_version = model.ir_version
    return part


def compile_with_islands(model_path: Path, island: list[str], provider: dict[str, str],
                         out: Path, workdir: Path, name: str
                         ) -> tuple[HtpAssignment, list[str]]:
    """Writes the island artifact to `out`; returns the HTP split of the whole artifact
    (the island's nodes named as CPU nodes) and the report notes. Each part goes through
    `plan_htp` (the HTP probe and rewrites) like a whole graph does."""
    import onnx

    from server.compile.htp_plan import plan_htp

    model = onnx.load(str(model_path))
    island = convex(model, island)
    parts = cut(model, island)
    typed = _typed(model)
    outputs = {o.name for o in model.graph.output}
    constant = _constant_nodes(model, set(island))
    reads: dict[str, set[int]] = {}
    for k, group in enumerate((parts.before, parts.island, parts.after)):
        for n in group:
            for i in n.input:
                reads.setdefault(i, set()).add(k)
    nodes: list[Any] = []
    notes: list[str] = []
    folded: list[Any] = []
    cpu: list[CpuNode] = []
    htp = total = 0
    for k, group in ((0, parts.before), (1, parts.island), (2, parts.after)):
        if not group:
            continue
        if k == 1:  # its constants are folded by onnxruntime when the session loads
            nodes += group
            runs = [n for n in group if n.name not in constant]
            total += len(runs)
            cpu += [CpuNode(n.op_type, n.name, "precision island: kept at FP32 on the CPU EP "
                            "(the HTP's FP16 loses the model here)") for n in runs]
            continue
        later = {o for n in group if n.name not in constant for o in n.output
                 if o in outputs or reads.get(o, set()) - {k}}
        part = _part(model, group, later, typed, f"{model.graph.name}_part{k}")
        src = workdir / f"model.{name.lower()}.part{k}.onnx"
        ctx = workdir / f"model.{name.lower()}.part{k}.ctx.onnx"
        onnx.save(part, str(src))
        split, rewrites = plan_htp(src, provider, ctx, workdir, f"{name}.part{k}")
        notes += rewrites
        htp += split.nodes_htp
        total += split.nodes_total
        cpu += split.cpu_nodes
        compiled = onnx.load(str(ctx))
        nodes += list(compiled.graph.node)
        # onnxruntime folds constant subgraphs (an LSTM's zero initial state, Expand of a
        # constant) into initializers of the EPContext model: they travel with it
        folded += list(compiled.graph.initializer)
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise InvalidSourceError("precision island: two parts produced EPContext nodes of the "
                                 "same name")
    _stitch(model, nodes, folded, parts, typed, out)
    macs = node_macs(model)
    macs_total = sum(macs.values())
    split = HtpAssignment(nodes_total=total, nodes_htp=htp, macs_total=macs_total,
                          macs_htp=macs_total - sum(macs.get(n.name, 0) for n in cpu),
                          cpu_nodes=cpu)
    return split, [*notes, f"precision island: {len(island)} node(s) kept at FP32 on the "
                   f"device's CPU EP ({', '.join(island[:6])}"
                   + (", …" if len(island) > 6 else "") + f"); {split.summary()}"]


def _stitch(model: Any, nodes: list[Any], folded: list[Any], parts: Cut, typed: dict[str, Any],
            out: Path) -> None:
    from onnx import helper

    inits = {t.name: t for t in [*folded, *model.graph.initializer]}
    read = {i for n in nodes for i in n.input} | {o.name for o in model.graph.output}
    boundary = {o for n in nodes for o in n.output} | read
    io = {v.name for v in [*model.graph.input, *model.graph.output]} | set(inits)
    graph = helper.make_graph(
        nodes, model.graph.name, list(model.graph.input), list(model.graph.output),
        [inits[t] for t in sorted(read) if t in inits],
        value_info=[typed[t] for t in sorted(boundary - io) if t in typed])
    opsets = list(model.opset_import)
    if not any(o.domain == EPCONTEXT_DOMAIN for o in opsets):
        opsets.append(helper.make_opsetid(EPCONTEXT_DOMAIN, 1))
    stitched = helper.make_model(graph, opset_imports=opsets)
    stitched.ir_version = model.ir_version
    out.unlink(missing_ok=True)
    import onnx

    onnx.save(stitched, str(out))
