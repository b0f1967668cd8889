"""The per-layer diff of one built artifact against its FP32 source (seed §13.1, "Tensor Diff
Visualizer"): cosine and SNR of every intermediate tensor both compute, in the source's node
order, stored with the build and drawn as a heatmap on the version page.

Where the artifact's intermediates come from (`candidate_for`):
- an ONNX artifact: the artifact itself on onnxruntime's CPU provider;
- a compiler offering `intermediates(artifact)` (QNN): the graph it compiled, compiled again on
  the same (emulated) HTP with the tensors as outputs, as few times as `HTP_BYTES` allows;
  a QDQ graph's quantized tensors are read through taps (qdq_prep.tap_quantized), and the
  reference is read the same way (`Candidate.tapped`), so an INT8 walk compares the value
  each layer passes on with the same value on the CPU, not with the float before rounding;
- a Core ML package: our MIL executor (server/compile/milexec), one run keeping every var;
  the converter names a MIL var after the ONNX tensor it computes (`mil_name`), and
  coremltools' FP16 pass appends `_cast_fp16`.

A layer is *below* when it misses the seed thresholds of the artifact's precision (FP16:
cosine > 0.999, SNR > 60 dB; INT8: 0.995, 40 dB; FP32: the faithful FP32 ones); the first such
layer is named. The report is capped at `MAX_LAYERS` tensors (the first ones in node order;
`truncated` and `total` say so) and rows are compact lists, so a build's report stays under
~100 kB whatever the model; the API pages it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from server.compile.compilers.base import Compiler
from server.compile.gates import emulate, layers, numeric
from server.compile.types import CompiledArtifact, Precision

MAX_LAYERS = 1000  # tensors stored per artifact
ROW_FIELDS = ("tensor", "node", "op", "cosine", "snr_db")
FP16_SUFFIX = "_cast_fp16"  # coremltools' FP16 pass renames each op's output var so
# Float32 bytes of intermediate tensors per HTP diagnostic compile (each run compiles the
# graph once more, a fixed cost whatever the outputs: all-MiniLM-L6-v2's 187 tensors, 59 MiB,
# take one compile; PP-OCRv4 det's 330 at 640x640, 659 MiB, two).
HTP_BYTES = 512 * 1024**2


def mil_candidate(package: Path, feeds: dict[str, NDArray[Any]]) -> layers.Candidate:
    """The intermediates of a Core ML package by ONNX tensor name, from one executor run."""
    from server.compile.milexec import MilExecutor
    from server.compile.onnx_mil.context import mil_name

    trace = MilExecutor(package).run(feeds, keep_intermediates=True)

    class _Names:
        # Membership by ONNX name: the var is the MIL name, or it with the FP16 suffix.
        def __contains__(self, name: object) -> bool:
            return isinstance(name, str) and _var(name) is not None

    def _var(name: str) -> str | None:
        base = mil_name(name)
        return next((v for v in (base, base + FP16_SUFFIX) if v in trace), None)

    def fetch(names: list[str]) -> dict[str, NDArray[Any]]:
        out = {}
        for n in names:
            var = _var(n)
            if var is not None:
                out[n] = np.asarray(trace[var]).astype(np.float32)
        return out

    return layers.Candidate(_Names(), fetch)


def on_cpu_provider(art: CompiledArtifact) -> bool:
    """An ONNX artifact whose intermediates are read on onnxruntime's CPU provider."""
    return art.target.format == "onnx" and art.path.suffix == ".onnx"


def candidate_for(compiler: Compiler, art: CompiledArtifact, feeds: dict[str, NDArray[Any]]
                  ) -> tuple[layers.Candidate, str, int] | None:
    """(the artifact's intermediates, where they are computed, tensors per run), or None when
    this artifact exposes none."""
    if on_cpu_provider(art):
        return layers.Candidate.onnx(art.path, feeds), "the artifact", layers.CHUNK
    diag = getattr(compiler, "intermediates", None)
    found = diag(art) if callable(diag) else None
    if found is not None:
        graph, opener = found
        return (layers.Candidate.onnx(graph, feeds, opener, max_bytes=HTP_BYTES, tapped=True),
                f"the artifact's graph on {art.target.runtime}", MAX_LAYERS)
    if art.path.suffix == ".mlpackage" and art.path.is_dir():
        return mil_candidate(art.path, feeds), "the artifact on the MIL executor", MAX_LAYERS
    return None


def thresholds(precision: Precision) -> numeric.Thresholds:
    return numeric.SEED_THRESHOLDS.get(precision) or numeric.DEFAULT_THRESHOLDS[precision]


def _num(x: float) -> float | str:
    return round(x, 6) if math.isfinite(x) else ("inf" if x > 0 else "-inf")


def layer_diff(source: Path, candidate: layers.Candidate, where: str, chunk: int,
               feeds: dict[str, NDArray[Any]], precision: Precision) -> dict[str, Any]:
    """The capped per-layer report of `candidate` against the FP32 `source`, one sample."""
    import onnx

    src = onnx.load(str(source))
    order = layers.graph_order(src, {n for n in layers.available_tensors(src)
                                     if n in candidate.names})
    if isinstance(candidate.names, Mapping) and not candidate.tapped:
        # A tapped QDQ graph reads its tensors through DequantizeLinear by design.
        order = layers.same_operator(order, candidate.names)
    t = thresholds(precision)
    sizes = layers.tensor_bytes(src) if candidate.max_bytes is not None else None
    opener = candidate.reference_opener()
    rows: list[list[Any]] = []
    first: dict[str, Any] | None = None
    for m in layers.compare_layers(order[:MAX_LAYERS],
                                   lambda names: layers.run_tensors(src, names, feeds, opener),
                                   candidate.fetch,
                                   clip=emulate.FP16_MAX if precision is Precision.FP16
                                   else None, chunk=chunk, sizes=sizes,
                                   max_bytes=candidate.max_bytes):
        rows.append([m.tensor, m.node, m.op, _num(m.cosine), _num(m.snr_db)])
        if first is None and m.below(t.min_cosine, t.min_snr_db):
            first = {**m.to_dict(), "index": len(rows) - 1}
    return {"basis": f"the FP32 source vs {where}", "precision": precision.value,
            "thresholds": {"min_cosine": t.min_cosine, "min_snr_db": t.min_snr_db},
            "total": len(order), "truncated": len(order) > MAX_LAYERS,
            "fields": list(ROW_FIELDS), "layers": rows, "first_below": first}


def for_artifact(compiler: Compiler, art: CompiledArtifact, source: Path,
                 feeds: dict[str, NDArray[Any]]) -> dict[str, Any]:
    """The per-layer diff of `art`, or {"unavailable": why}; never raises (a diagnostic)."""
    if not art.runnable_here:
        return {"unavailable": art.not_runnable_reason}
    try:
        found = candidate_for(compiler, art, feeds)
        if found is None:
            return {"unavailable": f"the {art.target.format} artifact exposes no intermediate "
                                   "tensors"}
        cand, where, chunk = found
        return layer_diff(source, cand, where, chunk, feeds, art.precision)
    except Exception as e:  # a diagnostic: its failure is reported, never fatal
        return {"unavailable": f"{type(e).__name__}: {str(e)[:300]}"}
