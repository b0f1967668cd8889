"""ONNX's backend node cases (`onnx.backend.test.case.node.collect_testcases()`) run through
ONNX → MIL → `ct.convert` → the MIL reference executor, against the cases' expected outputs.

A case belongs to the op its name tests (`test_layer_normalization_…` → LayerNormalization).
It is *in scope* when the converter claims that op and every other op in its graph, and its
inputs and outputs are tensors of a dtype Core ML computes in (float32, float16, int32, int64
held as int32, bool) and no tensor needs rank > 5 (Core ML's limit, `RankLimit`); other cases
are counted as out of scope with the reason, never dropped silently. An input that a rule
needs at conversion time (an axes or shape input, a conv weight) is bound as an initializer,
as in an exported model; `bound` counts such cases.

Tolerances: FP32 programs `|got − want| ≤ atol + rtol·|want|` with the case's own rtol / atol
raised to at least 1e-4 / 1e-5 (ONNX's defaults are 1e-3 / 1e-7, written for float64
references; MIL computes float32 throughout); integer and bool outputs exactly; NaN matches
NaN. FP16 programs (reported, not gated): rtol 1e-2, atol 1e-2.
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from server.compile.errors import ConversionError
from server.compile.heap import frozen_heap

_DTYPES = (np.float32, np.float16, np.int64, np.int32, np.bool_)
_BIND_LIMIT = 8


@dataclass
class CaseResult:
    name: str
    op: str
    status: str  # passed | failed | refused | out-of-scope
    detail: str = ""
    bound: bool = False


@dataclass
class OpRow:
    op: str
    cases: int = 0
    in_scope: int = 0
    passed: int = 0
    bound: int = 0
    fp16_passed: int = 0
    fp16_run: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.passed / self.in_scope if self.in_scope else 1.0


def _snake(op: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", op).lower()


# Case-name stems that are neither the op's snake_case nor its lowercase name.
_ALIASES = {"sce": "SoftmaxCrossEntropyLoss", "nllloss": "NegativeLogLikelihoodLoss",
            "batchnorm": "BatchNormalization", "instancenorm": "InstanceNormalization",
            "simple_rnn": "RNN", "rnn_seq_length": "RNN", "gru_seq_length": "GRU",
            "lstm_with_peepholes": "LSTM", "l1normalization": "LpNormalization",
            "l2normalization": "LpNormalization", "training_dropout": "Dropout",
            "basic_conv": "Conv", "conv_with": "Conv", "strnormalizer": "StringNormalizer",
            "reflect_pad": "Pad", "edge_pad": "Pad", "constant_pad": "Pad", "wrap_pad": "Pad",
            "top_k": "TopK", "basic_deform": "DeformConv", "deform_conv": "DeformConv",
            "flexattention": "FlexAttention", "tfidfvectorizer": "TfIdfVectorizer",
            "quantizelinear": "QuantizeLinear", "dequantizelinear": "DequantizeLinear",
            "castlike": "CastLike", "logsoftmax": "LogSoftmax", "gridsample": "GridSample",
            "bitshift": "BitShift", "mvn": "MeanVarianceNormalization"}


def primary_op(case_name: str, ops: Iterable[str]) -> str:
    """The op a case tests, from its name: the longest stem (the op's snake_case, its
    lowercase name, or an alias) that the case name starts with."""
    name = case_name.removeprefix("test_")
    stems = dict(_ALIASES)
    for op in ops:
        stems.setdefault(_snake(op), op)
        stems.setdefault(op.lower(), op)
    best = ""
    for stem in stems:
        if (name == stem or name.startswith(stem + "_")) and len(stem) > len(best):
            best = stem
    return stems[best] if best else ""


def _bind(model: Any, tensor: str, value: np.ndarray) -> Any:
    from onnx import numpy_helper

    m = type(model)()
    m.CopyFrom(model)
    keep = [vi for vi in m.graph.input if vi.name != tensor]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    m.graph.initializer.append(numpy_helper.from_array(value, tensor))
    return m


def _close(want: np.ndarray, got: np.ndarray, rtol: float, atol: float) -> str:
    got = np.asarray(got)
    if want.shape != got.shape:
        if want.size == got.size and want.size <= 1:
            got = got.reshape(want.shape)
        else:
            return f"shape {got.shape} != expected {want.shape}"
    if want.dtype.kind in "biu":
        ok = np.array_equal(got.astype(np.int64), want.astype(np.int64))
        return "" if ok else "integer values differ"
    g, w = got.astype(np.float64), want.astype(np.float64)
    bad = ~(np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True))
    if bad.any():
        return f"max |diff| {np.nanmax(np.abs(g - w)):.3g} at {int(bad.sum())} of {w.size}"
    return ""


def _scope(case: Any) -> str:
    if not case.data_sets:
        return "no data sets"
    ins, outs = case.data_sets[0]
    for a in [*ins, *outs]:
        if not isinstance(a, np.ndarray):
            return "sequence / optional values"
        if a.dtype.type not in _DTYPES:
            return f"dtype {a.dtype}"
        if a.size == 0:
            return "zero-sized tensor"
    return ""


def run_case(case: Any, fp16: bool = False) -> tuple[CaseResult, bool | None]:
    """One case: its result at FP32, and (when `fp16`) whether the FP16 program also passes."""
    import coremltools as ct

    from server.compile.onnx_mil.context import NeedsConstant, RankLimit
    from server.compile.onnx_mil.convert import convert_model

    ins, outs = case.data_sets[0]
    model = case.model
    names = [vi.name for vi in model.graph.input]
    feeds = dict(zip(names, ins, strict=False))
    bound = False
    for _ in range(_BIND_LIMIT):
        try:
            prog = convert_model(model, {n: a.shape for n, a in feeds.items()},
                                 ct.target.iOS18)
            break
        except NeedsConstant as e:
            if e.tensor not in feeds:
                return CaseResult(case.name, "", "refused", str(e)[:300]), None
            model = _bind(model, e.tensor, feeds.pop(e.tensor))
            bound = True
        except RankLimit as e:
            return CaseResult(case.name, "", "out-of-scope", "tensor rank > 5 (Core ML's "
                              f"limit): {str(e)[:200]}"), None
        except ConversionError as e:
            return CaseResult(case.name, "", "refused", str(e)[:300], bound), None
    else:
        return CaseResult(case.name, "", "refused", "too many constant inputs"), None
    rtol, atol = max(float(case.rtol), 1e-4), max(float(case.atol), 1e-5)
    result = _execute(prog, feeds, outs, "fp32", rtol, atol)
    res = CaseResult(case.name, "", "failed" if result else "passed", result, bound)
    fp16_ok = None
    if fp16 and not result:
        fp16_ok = not _execute(prog, feeds, outs, "fp16", 1e-2, 1e-2)
    return res, fp16_ok


def execute_program(prog: Any, feeds: dict[str, np.ndarray], precision: str = "fp32"
                    ) -> list[np.ndarray]:
    """`ct.convert`s a MIL program as the Core ML compile does and runs the package it wrote
    with the MIL reference executor; the outputs in program order."""
    import coremltools as ct

    from server.compile.milexec import MilExecutor
    from server.compile.onnx_mil.context import mil_name
    from server.compile.quiet import quiet

    with quiet(), frozen_heap():  # its closing gc.collect() skips what was loaded before
        mlmodel = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=(
            ct.target.iOS18), compute_precision=(ct.precision.FLOAT16 if precision == "fp16"
                                                 else ct.precision.FLOAT32))
    # ct.convert has already written the .mlpackage (a temporary one, removed only at exit):
    # run that one instead of a saved copy, and remove it now.
    try:
        ex = MilExecutor(mlmodel.package_path)
        got = ex.run({mil_name(k): v for k, v in feeds.items()})
        return [got[n] for n in ex.output_names]
    finally:
        shutil.rmtree(mlmodel.package_path, ignore_errors=True)


def execute_onnx(model: Any, feeds: dict[str, np.ndarray], precision: str = "fp32"
                 ) -> list[np.ndarray]:
    """ONNX model → MIL (at the feeds' shapes) → .mlpackage → executor outputs."""
    import coremltools as ct

    from server.compile.onnx_mil.convert import convert_model

    prog = convert_model(model, {k: v.shape for k, v in feeds.items()}, ct.target.iOS18)
    return execute_program(prog, feeds, precision)


def _execute(prog: Any, feeds: dict[str, np.ndarray], outs: list[np.ndarray], precision: str,
             rtol: float, atol: float) -> str:
    """"" when the converted program's outputs match `outs`, else what differs."""
    try:
        values = execute_program(prog, feeds, precision)
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:300]}"
    for i, (w, g) in enumerate(zip(outs, values, strict=True)):
        why = _close(w, g, rtol, atol)
        if why:
            return f"output {i}: {why}"
    return ""


def run_suite(pattern: str = "", fp16: bool = False, ops: set[str] | None = None,
              shard: tuple[int, int] = (0, 1), cases: Iterable[Any] | None = None
              ) -> tuple[dict[str, OpRow], list[CaseResult]]:
    """Every node case (or those whose name contains `pattern`, or whose op is in `ops`);
    `shard=(k, n)` runs every n-th case from the k-th (merge shards with `merge`). `cases`:
    the node cases already collected (the tests keep them in a cache: collecting runs
    every case's reference implementation); default `collect_testcases()`."""
    from server.compile.onnx_mil import claimed_ops
    from server.compile.quiet import quiet

    if cases is None:
        from onnx.backend.test.case.node import collect_testcases

        with quiet():
            cases = collect_testcases()
    claimed = claimed_ops() | {"Constant"}
    cases = [c for c in cases if c.model is not None]
    all_ops = {n.op_type for c in cases for n in c.model.graph.node}
    rows: dict[str, OpRow] = {}
    results: list[CaseResult] = []
    for i, case in enumerate(cases):
        if (pattern and pattern not in case.name) or i % shard[1] != shard[0]:
            continue
        model = case.model
        assert model is not None
        op = primary_op(case.name, all_ops | claimed) or (
            model.graph.node[0].op_type if len(model.graph.node) == 1 else "(other)")
        if ops is not None and op not in ops:
            continue
        row = rows.setdefault(op, OpRow(op))
        row.cases += 1
        graph_ops = {n.op_type for n in model.graph.node}
        why = "" if op in claimed else "op not claimed"
        why = why or (f"uses unclaimed {sorted(graph_ops - claimed)}"
                      if graph_ops - claimed else _scope(case))
        if why:
            results.append(CaseResult(case.name, op, "out-of-scope", why))
            continue
        res, fp16_ok = run_case(case, fp16)
        res.op = op
        results.append(res)
        if res.status == "out-of-scope":
            continue
        row.in_scope += 1
        row.bound += res.bound
        if res.status == "passed":
            row.passed += 1
            if fp16_ok is not None:
                row.fp16_run += 1
                row.fp16_passed += fp16_ok
        else:
            row.failures.append(f"{case.name}: {res.detail}")
    return rows, results


def merge(parts: Iterable[tuple[dict[str, OpRow], list[CaseResult]]]
          ) -> tuple[dict[str, OpRow], list[CaseResult]]:
    """The rows and results of several shards as one run's."""
    rows: dict[str, OpRow] = {}
    results: list[CaseResult] = []
    for part_rows, part_results in parts:
        results.extend(part_results)
        for op, r in part_rows.items():
            m = rows.setdefault(op, OpRow(op))
            m.cases += r.cases
            m.in_scope += r.in_scope
            m.passed += r.passed
            m.bound += r.bound
            m.fp16_passed += r.fp16_passed
            m.fp16_run += r.fp16_run
            m.failures.extend(r.failures)
    return rows, results


def table(rows: dict[str, OpRow], fp16: bool = False) -> str:
    """The per-op table (markdown) of claimed ops, then the totals."""
    head = "| op | cases | in scope | passed | bound consts |" + (" FP16 passed |" if fp16
                                                                  else "")
    lines = [head, "|---|---|---|---|---|" + ("---|" if fp16 else "")]
    total: Counter[str] = Counter()
    for op in sorted(rows):
        r = rows[op]
        if not r.in_scope:
            continue
        total.update(cases=r.cases, in_scope=r.in_scope, passed=r.passed)
        extra = f" {r.fp16_passed}/{r.fp16_run} |" if fp16 else ""
        lines.append(f"| {op} | {r.cases} | {r.in_scope} | {r.passed} "
                     f"({100 * r.rate:.0f}%) | {r.bound} |{extra}")
    lines.append(f"| **all claimed** | {total['cases']} | {total['in_scope']} | "
                 f"{total['passed']} | |" + (" |" if fp16 else ""))
    return "\n".join(lines)
