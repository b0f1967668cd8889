"""Watermarks in QNN artifacts (issue 23; docs/security.md "Per-cohort watermarks").

Marking. A QNN artifact is an EPContext ONNX file whose context binary the HTP compiler
built from a graph (`extra["htp_graph"]`: the FP32 source, its QDQ-quantized form, or either
rewritten for the HTP). Cohort c's artifact is that graph with cohort c's mark in the
precision the HTP really uses, compiled again by the same HTP compiler: for an FP16 build,
each marked float weight set to its FP16 value one FP16 step off (stored as an FP32 that the
HTP's FP16 conversion keeps exactly; the other weights are left as they were); for a QDQ
build, the quantized weights (the uint8/int8 inputs of DequantizeLinear) moved by ±1,
floats left alone. INT4 (w4a16) weights are not marked here (no tensor to mark: the build's
watermark gate says not_supported).

Reading. The context binary's graph is laid out for the DSP and not parsed here; but a real
build shows (tests/compile/test_qnn_marks.py, docs/security.md) that it stores each weight
verbatim in the HTP's precision — one FP16 word, or one byte, per weight, in a tiled order —
and that the layout does not depend on the values: cohort c's binary differs from the
unmarked one at exactly one word per marked weight, by one step, in the pattern's direction
(besides a few dozen header words that differ between any two compiles). So `identify_binary`
scores a leaked binary in the binary's own order, which the statistic does not depend on:
the positions where every cohort's binary moved by exactly one step from the unmarked one
are the marked weights; cohort c's sign there is its binary's step; d is the leaked value
minus the unmarked one there, decoded as FP16 (or as a byte step). The signs are the keyed
patterns' (server/watermark.py), so the same Hoeffding bound holds. It needs every cohort's
binary, which the server keeps (it serves them); a few weights whose step is two bit
patterns (one FP16 step down from a power of two, a byte wrapping) are left out, and so are
positions every cohort moved the same way (from 3 cohorts on): header words that each compile
moves alike, which a foreign binary compiled later moves too (a false "match" otherwise).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from server import watermark as wm
from server.compile import weights
from server.compile.types import CompiledArtifact, Precision

EPCONTEXT_FORMAT = "onnx-epcontext"
MIXED_SIGNS_FROM = 3  # cohorts from which a position every cohort moved alike is no mark
MAX_BINARY_BYTES = weights.MAX_WEIGHT_FILE_BYTES


def word_bytes(precision: str) -> int:
    """The size of one stored weight in a context binary of this build precision."""
    return 2 if precision == Precision.FP16.value else 1


def mark_graph(src: Path, dest: Path, key: bytes, cohort: int, precision: Precision,
               strength: int = 1, share: float = 1.0,
               share_of: Callable[[str], float] = lambda _: 1.0) -> int:
    """A copy of the HTP's source graph `src` at `dest` with cohort `cohort`'s mark in the
    precision the HTP uses for each weight (FP16 weights `strength` steps off, quantized
    ones one step), tensor t on `share` × `share_of(t)` of the mask's positions (the same
    ones for every cohort, as `identify_binary` needs); returns how many tensors were
    marked."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    marked = 0
    quantized = precision is Precision.INT8

    def change(name: str, values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        nonlocal marked
        part = share * share_of(name)
        if quantized != (values.dtype.name in weights.INTS) or part <= 0:
            return values  # an FP16 build's integers, a QDQ build's unquantized floats
        marked += 1
        if quantized:
            return wm.embed(values, key, cohort, name=name, share=part)
        # FP16 on the HTP: a marked weight is stored at its FP16 value `strength` steps off,
        # which the HTP's FP16 conversion keeps exactly; the others stay as they were.
        fp16 = np.clip(values, -65504, 65504).astype(np.float16)
        moved = wm.embed(fp16, key, cohort, strength, name=name, share=part)
        out = values.copy()
        changed = moved.view(np.uint16) != fp16.view(np.uint16)
        out[changed] = moved[changed].astype(values.dtype)
        return out
    weights.rewrite(dest, change)
    return marked


def compile_cohort(art: CompiledArtifact, graph: Path, out: Path) -> CompiledArtifact:
    """`art` compiled again from the marked `graph` by the same HTP compiler and options;
    refused when the HTP would now take fewer nodes than it took for `art`."""
    from server.compile.htp_support import probe

    provider = {str(k): str(v) for k, v in art.extra["provider_options"].items()}
    assignment = probe(graph, provider, context_out=out)
    before = int(art.extra.get("htp", {}).get("nodes_htp", assignment.nodes_htp))
    if assignment.nodes_htp < before or not out.is_file():
        raise weights.WeightsError(f"the marked graph puts {before - assignment.nodes_htp} "
                                   "node(s) fewer on the HTP")
    return replace(art, path=out, extra={**art.extra, "htp_graph": str(graph)})


def context_binary(path: Path) -> bytes:
    """The QNN context binary of an EPContext ONNX file (embed mode 1), or the file's bytes
    when it is a bare context binary (as extracted from an artifact)."""
    if path.stat().st_size > MAX_BINARY_BYTES:
        raise weights.WeightsError(f"{path.name} exceeds {MAX_BINARY_BYTES} bytes")
    data = path.read_bytes()
    blob = _embedded(data)
    return data if blob is None else blob


def is_epcontext(path: Path) -> bool:
    """True for an EPContext ONNX file with an embedded context binary."""
    try:
        with path.open("rb") as f:
            head = f.read(1 << 16)
    except OSError:
        return False
    return b"EPContext" in head and _embedded(path.read_bytes()) is not None


def _embedded(data: bytes) -> bytes | None:
    import onnx
    from google.protobuf.message import DecodeError

    if b"EPContext" not in data[: 1 << 16] and b"ep_cache_context" not in data[-(1 << 16):]:
        return None
    try:
        model = onnx.load_from_string(data)
    except (DecodeError, ValueError):
        return None
    for node in model.graph.node:
        if node.op_type != "EPContext":
            continue
        attrs = {a.name: a for a in node.attribute}
        if "ep_cache_context" in attrs and attrs.get("embed_mode") is not None \
                and attrs["embed_mode"].i == 1:
            return bytes(attrs["ep_cache_context"].s)
    return None


def _values(blob: bytes, word: int, at: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    kind = np.float16 if word == 2 else np.uint8
    out: np.ndarray[Any, Any] = np.frombuffer(blob, dtype=kind)[at].astype(np.float32)
    return out


def _steps(cohort: bytes, unmarked: bytes, word: int) -> np.ndarray[Any, Any]:
    """Per stored word: +1 / −1 where `cohort` moved it up / down in value by a mark (one
    byte step; 1 to `wm.MAX_STRENGTH` FP16 steps, as bit patterns), 0 where it is unchanged,
    2 where it changed otherwise (a header word, a clipped mark)."""
    kind = np.uint16 if word == 2 else np.uint8
    a = np.frombuffer(cohort, dtype=kind).astype(np.int32)
    b = np.frombuffer(unmarked, dtype=kind).astype(np.int32)
    out = np.where(a == b, 0, 2).astype(np.int8)
    apart = np.abs(a - b)
    if word == 2:  # an FP16 bit pattern up is away from zero (same sign: at most 16 apart)
        mark = (apart >= 1) & (apart <= wm.MAX_STRENGTH)
        negative = (b & 0x8000) != 0
        up = (a > b) != negative
    else:  # a byte, signed or not: one up is one up
        mark = apart == 1
        up = a > b
    out[mark] = np.where(up[mark], 1, -1)
    return out


def identify_binary(leaked: bytes, unmarked: bytes, cohorts: Iterable[bytes], word: int, *,
                    max_false_positive: float = wm.MAX_FALSE_POSITIVE) -> wm.Identified:
    """The cohort whose mark the context binary `leaked` carries, from the unmarked binary
    and every cohort's (all of one length; else "none"), in the binary's own order; the
    differences weighed as server/watermark.py's `filtered` weighs a tensor's."""
    if len(leaked) != len(unmarked) or len(unmarked) % word:
        return wm.Identified(None, 0.0, 1.0)
    signs: list[np.ndarray[Any, Any]] = []
    at: np.ndarray[Any, Any] | None = None  # the candidates: marked in every cohort
    for blob in cohorts:
        if len(blob) != len(unmarked):
            return wm.Identified(None, 0.0, 1.0)
        s = _steps(blob, unmarked, word)
        if at is None:
            at = np.flatnonzero(np.abs(s) == 1)  # kept small: a cohort's marks only
        signs.append(s[at])
    if at is None or at.size == 0:
        return wm.Identified(None, 0.0, 1.0)
    keep = np.logical_and.reduce([np.abs(s) == 1 for s in signs])
    if len(signs) >= MIXED_SIGNS_FROM:
        # A header word a compile changes by one step in the same direction every time (a
        # count, an offset: ~50 bytes in one INT8 build of six) is a step off in every
        # cohort, and in any other binary compiled since — a foreign one too, whose steps
        # there would then agree with every cohort's. A mark's keyed signs are all alike in
        # 2 of 2^N cohort sets (N = 64: never), so such positions are left out; for a single
        # cohort the signs still score (what is left is symmetric: the bound holds).
        keep &= ~np.logical_and.reduce([s == signs[0] for s in signs])
    at, signs = at[keep], [s[keep] for s in signs]
    d = _values(leaked, word, at) - _values(unmarked, word, at)
    if word == 1:  # a byte step, whether the HTP stores it signed or not
        d = (d + 128) % 256 - 128
    kind = np.float16 if word == 2 else np.uint8
    x = wm.filtered(d, np.frombuffer(unmarked, dtype=kind)[at])
    norm = math.sqrt(float(np.dot(x, x)))
    if norm <= 0:
        return wm.Identified(None, 0.0, 1.0, int(at.size))
    z = np.array([float(np.dot(x, s.astype(np.float64))) for s in signs]) / norm
    best = int(np.argmax(z))
    p = wm.false_positive(float(z[best]), len(signs))
    return wm.Identified(best if p <= max_false_positive else None, float(z[best]), p,
                         int(at.size))
