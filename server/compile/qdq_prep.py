"""Graph preparation before QNN's QDQ quantization (server/compile/compilers/qnn.py).

- Constants shared through Identity nodes get one copy per Identity. The TorchScript
  exporter writes a bias that several Convs share (equal initial values, as a fresh
  ResNet's zero biases) as one initializer read through an Identity per Conv. Quantized,
  each Conv's int32 bias needs its own scale (input scale × that Conv's weight scales), so
  the quantizer cannot give the shared bias to the Conv's QDQ group; onnxruntime-qnn then
  finds no Conv group to fold the per-channel weight DequantizeLinear into, and the HTP
  leaves it to the CPU (per tensor it runs it, but on dequantized FP16 weights, twice the
  bytes). With a copy per Conv the whole graph goes to the HTP with 8-bit weights.
- MatMul weights per output channel: onnxruntime's QNN config keeps them per tensor ("QNN
  does not support per-channel MatMul"), but onnxruntime-qnn 2.x / QAIRT 2.5x run a MatMul
  of a 2-D activation (its FullyConnected) whose constant [K, N] weight is signed and
  symmetric per column (axis 1) on the HTP; asymmetric ones, and any per-column weight of
  a MatMul with a 3-D or wider activation, it leaves to the CPU, so those stay per tensor.
  Per column an 8-bit weight keeps ~4 dB more SNR on Gaussian weights (an MLP at W8A16:
  35 → 39 dB).
- Embedding tables at 8 bits: onnxruntime's quantizer treats a Gather's data input as an
  activation, so a 16-bit scheme stored the tables (most of a small text encoder's
  parameters) at 16 bits; as an 8-bit weight (one scale per table) BERT-small keeps
  43.7 dB on the HTP and its artifact drops from 0.46× to 0.28× the FP32 source.
- Additive attention masks stay float: a mask built from -inf or a huge negative constant
  (`Where(mask, 0, -inf)`, `(1 - mask) * finfo.min`, a constant causal mask tensor of 0 and
  finfo.min: gpt2-tiny's cost it 5 dB at W8A16) added to the attention scores gives
  the sum a range no 16-bit scale spans — onnxruntime-qnn refuses to quantize an infinite
  range ("graphAddNode ... Quantize ... 6007"), and a finite huge one leaves the scores no
  resolution (BERT-small: 28 dB on the CPU). The nodes from such a constant to the Softmax
  it reaches are left out of the quantization (they run in FP16 on the HTP; Softmax turns
  -inf into 0).
- Nodes kept at higher precision get 16-bit weights where the HTP runs them (v73 and later,
  16-bit activations), not float ones: left float between a DequantizeLinear and a
  QuantizeLinear, PP-OCR's 5×5 depthwise Conv@13 took the HTP's result to 19.9 dB from
  FP32 (the first departure at a hardswish Mul far before it) while the CPU QDQ graph, the
  yardstick the search measures on, said 46.5 dB; at 16-bit weights the HTP gives 43.0 dB.
  On small MLPs 16 bits stay within 1.1 dB of float on the HTP, at half its bytes
  (`weights_at_16_bits`).
- metadata_props are dropped (onnxruntime's QNN preprocessing fails on them).
- BatchNormalization is folded into the Conv before it (server/compile/bn_fold.py): left
  standalone, the HTP computes it otherwise than the CPU (PP-OCR's direction classifier).
- Graphs below opset 13 are lifted to 13 for per-channel weights: DequantizeLinear has no
  `axis` before 13, so a per-channel QDQ graph of an opset-11 export is invalid (16-bit
  schemes are lifted to 21 by onnxruntime's quantizer itself). A graph the ONNX version
  converter cannot lift stays as it is (its per-channel candidate then fails to compile
  and the precision search tries the per-tensor one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def quantizer_inputs(qdq: Path) -> tuple[Path, Path]:
    """Where `compilers.qnn.quantize_qdq` writes, beside the QDQ graph `qdq`, the prepared
    graph (`prepare`) and onnxruntime's preprocessed one, when a step changed its input."""
    return qdq.with_name(qdq.stem + ".prepared.onnx"), qdq.with_name(qdq.stem + ".prep.onnx")


def prepare(src: Path, out: Path, per_channel: bool) -> Path:
    """`src`, or the prepared graph written to `out` when a step changed it."""
    import onnx

    from server.compile.bn_fold import fold_batchnorms

    graph = onnx.load(str(src))
    lifted = lift_for_per_channel(graph) if per_channel else None
    model = lifted or graph
    # onnxruntime's qnn_preprocess_model fails on any model with metadata_props
    # (`dict.update` of the protobuf entries: "cannot convert dictionary update sequence");
    # paddle2onnx and nudenet's exports carry some. The QDQ graph does not need them.
    had_metadata = len(model.metadata_props) > 0
    del model.metadata_props[:]
    changed = unshare_identity_constants(model) + fold_batchnorms(model) + \
        unshare_float_vectors(model)
    if changed or lifted is not None or had_metadata:
        onnx.save(model, str(out))
        return out
    return src


PER_CHANNEL_MIN_OPSET = 13


def lift_for_per_channel(model: Any) -> Any | None:
    """`model` converted to opset 13 when its default-domain opset is below it, else None
    (also when the converter fails)."""
    from onnx import version_converter

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset >= PER_CHANNEL_MIN_OPSET:
        return None
    try:
        return version_converter.convert_version(model, PER_CHANNEL_MIN_OPSET)
    except Exception:  # the converter has no adapter for some node: keep the graph as is
        return None


def matmul_weights_per_channel(model_path: Path, weight_type: Any, keep: set[str]
                               ) -> dict[str, list[dict[str, Any]]]:
    """`init_overrides` for onnxruntime's QNN config: each rank-2 initializer that only
    MatMul B inputs read (outside `keep`, the nodes left float) → signed, symmetric, per
    column. A weight something else reads too (a tied embedding's Gather) is left as is."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    rank2 = {t.name for t in model.graph.initializer if len(t.dims) == 2}
    reading = readers(model)
    ranks = _ranks(model)
    return {name: [{"axis": 1, "quant_type": weight_type, "symmetric": True}]
            for name in rank2 if reading.get(name) and all(
                n.op_type == "MatMul" and list(n.input).index(name) == 1
                and ranks.get(n.input[0]) == 2 and n.name not in keep for n in reading[name])}


# Where the per-channel axis of a weight input lies, per op that takes one (Gemm: by transB).
_WEIGHT_AXIS = {"Conv": 0, "MatMul": 1}
WIDE_WEIGHTS_MIN_ARCH = 73


def weights_at_16_bits(model_path: Path, keep: set[str], weight_type: Any
                       ) -> tuple[dict[str, list[dict[str, Any]]], set[str]]:
    """`init_overrides` giving the weights of the `keep` nodes `weight_type` (16-bit,
    signed, symmetric, per output channel; per tensor for a MatMul of a 3-D or wider
    activation), and the nodes so covered: a Conv, a MatMul or a Gemm whose constant weight
    no other node reads. The rest of `keep` stays float (nodes_to_exclude)."""
    import onnx
    from onnx import helper

    model = onnx.load(str(model_path), load_external_data=False)
    consts = {t.name: t for t in model.graph.initializer}
    reading = readers(model)
    ranks = _ranks(model)
    overrides: dict[str, list[dict[str, Any]]] = {}
    covered: set[str] = set()
    for node in model.graph.node:
        if node.name not in keep or len(node.input) < 2 or node.input[1] not in consts:
            continue
        weight = node.input[1]
        axis = _WEIGHT_AXIS.get(node.op_type)
        if node.op_type == "Gemm":
            trans = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            axis = 0 if trans.get("transB", 0) else 1
        if axis is None or len(consts[weight].dims) < 2 or \
                any(n is not node for n in reading.get(weight, [])):
            continue
        # Per column the HTP runs a MatMul weight only beside a 2-D activation (module doc);
        # per tensor, 16 bits still leave ~8 more than an 8-bit weight per column.
        per_tensor = node.op_type == "MatMul" and ranks.get(node.input[0]) != 2
        overrides[weight] = [{"quant_type": weight_type, "symmetric": True,
                              **({} if per_tensor else {"axis": axis})}]
        covered.add(node.name)
    return overrides, covered


def sixteen_bit_weight_readers(qdq_path: Path) -> set[str]:
    """Nodes of a QDQ graph whose weight (input 1) is a 16-bit integer initializer."""
    import onnx
    from onnx import TensorProto

    model = onnx.load(str(qdq_path), load_external_data=False)
    wide = {t.name for t in model.graph.initializer
            if t.data_type in (TensorProto.INT16, TensorProto.UINT16)}
    dq16 = {n.output[0] for n in model.graph.node
            if n.op_type == "DequantizeLinear" and n.input[0] in wide}
    return {n.name for n in model.graph.node if len(n.input) > 1 and n.input[1] in dq16}


def fused_names(model_path: Path, names: tuple[str, ...]) -> tuple[str, ...]:
    """`names` (nodes of the graph before onnxruntime's QNN preprocessing) as nodes of the
    preprocessed graph at `model_path`: a node a fusion replaced is there as
    "<name>/<fusion>" (MatMul + Add → Gemm: "node_MatMul_26/MatMulAddFusion"), and without
    this a node kept float by name would be quantized after all."""
    import onnx

    present = [n.name for n in onnx.load(str(model_path), load_external_data=False).graph.node]
    have = set(present)
    out: list[str] = []
    for name in names:
        out += [name] if name in have else [n for n in present if n.startswith(name + "/")]
    return tuple(dict.fromkeys(out))


def _ranks(model: Any) -> dict[str, int]:
    """Rank of each tensor shape inference knows (graph inputs, value_info, outputs)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # an op without an inference function: no ranks, nothing per column
        return {}
    graph = inferred.graph
    return {v.name: len(v.type.tensor_type.shape.dim)
            for v in [*graph.input, *graph.value_info, *graph.output]
            if v.type.tensor_type.HasField("shape")}


HUGE = 1e4  # a constant this large (or non-finite) is a mask value, not a weight
MASK_MAX_ELEMENTS = 1 << 24  # a 4096 × 4096 causal mask; larger constants are not scanned
# Ops a mask value passes through on its way to the scores (shape and selection ops, the
# arithmetic that builds and adds the mask).
_MASK_PATH = {"Where", "Add", "Sub", "Mul", "Expand", "Reshape", "Unsqueeze", "Squeeze",
              "Cast", "Concat", "Slice", "Transpose", "Tile", "Min", "Max", "Identity"}


def attention_mask_nodes(model_path: Path) -> list[str]:
    """Names of the nodes that carry a huge or infinite mask constant to a Softmax, and that
    Softmax; nothing when the constant reaches no Softmax."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(model_path), load_external_data=False)
    graph = model.graph

    def is_mask(t: Any) -> bool:
        # A scalar fill value (Where(mask, 0, -inf)), or a whole mask tensor of 0 and the
        # fill value (the dynamo exporter's causal mask of float32's lowest value).
        if t.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16) or \
                t.data_location == onnx.TensorProto.EXTERNAL or \
                int(np.prod(t.dims)) > MASK_MAX_ELEMENTS:
            return False
        v = numpy_helper.to_array(t)
        fill = ~np.isfinite(v) | (np.abs(v) >= HUGE)
        return bool(np.any(fill)) and (v.size <= 16 or bool(np.all(fill | (v == 0))))

    huge = {t.name for t in graph.initializer if is_mask(t)}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].type == \
                onnx.AttributeProto.TENSOR and is_mask(node.attribute[0].t):
            huge.update(node.output)
    carried, path, softmax = set(huge), [], []
    for node in graph.node:  # graph order is topological
        if not any(i in carried for i in node.input):
            continue
        if node.op_type == "Softmax":
            softmax.append(node)
        elif node.op_type in _MASK_PATH:
            carried.update(node.output)
            path.append(node)
    if not softmax:
        return []
    # Only the path nodes from which a Softmax is reached.
    feeds = {i for n in softmax for i in n.input}
    keep = []
    for node in reversed(path):
        if any(o in feeds for o in node.output):
            keep.append(node)
            feeds.update(i for i in node.input if i in carried)
    return [n.name for n in reversed(keep)] + [n.name for n in softmax]


def gather_tables_at_8_bits(model_path: Path, weight_type: Any, keep: set[str]
                            ) -> dict[str, list[dict[str, Any]]]:
    """`init_overrides`: each rank-2 initializer that only Gather data inputs read (outside
    `keep`) → `weight_type` (8-bit, per tensor)."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    rank2 = {t.name for t in model.graph.initializer if len(t.dims) == 2}
    reading = readers(model)
    return {name: [{"quant_type": weight_type}] for name in rank2 if reading.get(name) and all(
        n.op_type == "Gather" and n.input[0] == name and n.name not in keep
        for n in reading[name])}


def readers(model: Any) -> dict[str, list[Any]]:
    """The nodes that read each tensor, by its name."""
    out: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            out.setdefault(name, []).append(node)
    return out


def unshare_float_vectors(model: Any) -> int:
    """Gives each further reader of a float vector initializer (a bias, a norm's scale or
    shift) its own copy (in place); returns how many copies. Exporters share identical
    vectors (one zero bias for every projection and LayerNorm of a ViT): quantized, each
    reader needs its own int32 bias scale, and when the mixed search keeps one reader float
    onnxruntime duplicates the shared DequantizeLinear into a form the HTP refuses."""
    import onnx

    graph = model.graph
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
    vectors = {t.name: t for t in graph.initializer if len(t.dims) == 1 and
               t.data_type in floats}
    seen: dict[str, int] = {}
    copies = 0
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name not in vectors:
                continue
            seen[name] = seen.get(name, 0) + 1
            if seen[name] == 1:
                continue
            copy = onnx.TensorProto()
            copy.CopyFrom(vectors[name])
            copy.name = f"{name}__reader{seen[name]}"
            graph.initializer.append(copy)
            node.input[i] = copy.name
            copies += 1
    return copies


def unshare_identity_constants(model: Any) -> int:
    """Replaces each Identity of an initializer by a copy of it under the Identity's output
    name (in place); returns how many. An Identity whose output is a graph output stays."""
    import onnx

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    done = []
    for node in graph.node:
        if node.op_type != "Identity" or node.input[0] not in inits \
                or node.output[0] in outputs or node.output[0] in inits:
            continue
        copy = onnx.TensorProto()
        copy.CopyFrom(inits[node.input[0]])
        copy.name = node.output[0]
        graph.initializer.append(copy)
        done.append(node)
    for node in done:
        graph.node.remove(node)
    # The original stays even when nothing reads it now (a subgraph still may); the EPContext
    # model carries no initializers, so it costs the artifact nothing.
    return len(done)


TAP_SUFFIX = "__mf_tap"  # a tap's name: the tensor's, with this suffix


def tap_quantized(model: Any) -> dict[str, str]:
    """Makes `model` (edited in place) output each of its graph outputs that feeds a
    QuantizeLinear through a DequantizeLinear tap of that QuantizeLinear's output instead;
    the others stay. Returns {tensor: its tap's name} (nothing for a float graph).

    The layer walk reads a QDQ graph's tensors this way on both sides (server/compile/
    htp_child.py has why the HTP needs it; gates/layers.py `tapped_cpu_session`): the value
    the next layer reads, quantized, rather than the float that only exists before the
    QuantizeLinear."""
    import onnx

    reading = readers(model)
    aliases: dict[str, str] = {}
    for name in [o.name for o in model.graph.output]:
        q = next((r for r in reading.get(name, []) if r.op_type == "QuantizeLinear"), None)
        if q is None:
            continue
        tap = name + TAP_SUFFIX
        axis = [a for a in q.attribute if a.name in ("axis", "block_size")]
        node = onnx.helper.make_node("DequantizeLinear", [q.output[0], *q.input[1:3]], [tap],
                                     name=tap)
        node.attribute.extend(axis)
        model.graph.node.append(node)
        aliases[name] = tap
    kept = [o for o in model.graph.output if o.name not in aliases]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    model.graph.output.extend(onnx.ValueInfoProto(name=t) for t in aliases.values())
    return aliases
