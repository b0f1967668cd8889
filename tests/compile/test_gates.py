"""Operator gate (ONNX graphs incl. subgraphs, Core ML specs incl. nested blocks) and the
numeric metrics and thresholds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper

from server.compile.gates import numeric
from server.compile.gates.operators import check_mil_spec, check_onnx, deny_list
from server.compile.types import Precision
from tests.compile.compile_models import onnx_model


def f32(name, shape):  # type: ignore[no-untyped-def]
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def test_operator_inside_an_if_branch_is_found_with_its_path(tmp_path):
    then_g = helper.make_graph([helper.make_node("DeformConv", ["x", "w", "off"], ["t"],
                                                 name="deform")], "then", [], [f32("t", [1])])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                               [f32("e", [1])])
    node = helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g,
                            else_branch=else_g)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL,
                                                                          [])], [f32("y", [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])

    report = check_onnx(model, "qnn", deny_list("qnn", "onnx"))
    found = {(f.name, f.where) for f in report.findings if f.kind == "operator"}
    assert ("If", "graph/branch") in found
    assert ("DeformConv", "graph/branch.then_branch/deform") in found
    assert not report.passed and "DeformConv" in report.summary()


def test_data_dependent_shape_is_rejected_naming_the_producer(tmp_path):
    path = onnx_model(tmp_path / "nz.onnx", [helper.make_node("NonZero", ["x"], ["idx"],
                                                             name="nz")],
                      [f32("x", [2, 3])], [helper.make_tensor_value_info("idx", TensorProto.INT64,
                                                                         [2, "n"])])
    report = check_onnx(path, "onnx", deny_list("onnx", "onnx", {"operator_gate": {
        "allow": ["NonZero"]}}))
    assert [(f.kind, f.name) for f in report.findings] == [("dynamic_shape", "idx")]
    assert "NonZero" in report.findings[0].detail


def test_per_version_lists_extend_and_relax_the_platform_default():
    settings = {"operator_gate": {"deny": ["Softmax"], "allow": ["GridSample"]}}
    assert "Softmax" in deny_list("onnx", "onnx", settings)
    assert "GridSample" in deny_list("qnn", "onnx")
    assert "GridSample" not in deny_list("qnn", "onnx", settings)


def test_core_ml_gate_walks_nested_blocks_and_finds_nms_and_control_flow():
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 8, 4)), mb.TensorSpec(shape=(1, 8, 2))],
                opset_version=ct.target.iOS17)
    def prog(boxes, scores):  # type: ignore[no-untyped-def]
        def true_fn():  # type: ignore[no-untyped-def]
            return mb.non_maximum_suppression(boxes=boxes, scores=scores, iou_threshold=0.5,
                                              max_boxes=4)[0]

        def false_fn():  # type: ignore[no-untyped-def]
            return mb.slice_by_size(x=boxes, begin=[0, 0, 0], size=[1, 4, 4])

        pred = mb.greater(x=mb.reduce_sum(x=scores), y=0.0)
        return mb.cond(pred=pred, _true_fn=true_fn, _false_fn=false_fn)

    model = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS17)
    report = check_mil_spec(model.get_spec(), "coreml", deny_list("coreml", "mil"))

    kinds = {f.name: f.where for f in report.findings}
    assert "cond" in kinds and "non_maximum_suppression" in kinds
    assert ".block[0]" in kinds["non_maximum_suppression"]  # found inside the cond's branch
    assert not report.passed


def test_core_ml_input_with_flexible_shape_is_rejected():
    import coremltools as ct
    import torch

    traced = torch.jit.trace(torch.nn.ReLU().eval(), torch.zeros(1, 4))
    model = ct.convert(traced, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS17,
                       inputs=[ct.TensorType(name="x", shape=(ct.RangeDim(1, 8), 4))])
    report = check_mil_spec(model.get_spec(), "coreml", deny_list("coreml", "mil"))
    assert [(f.kind, f.name) for f in report.findings] == [("dynamic_shape", "x")]


# ---- numeric ------------------------------------------------------------------------------


def test_identical_outputs_are_perfect():
    a = np.random.default_rng(0).standard_normal((4, 10)).astype(np.float32)
    assert numeric.cosine(a, a) == pytest.approx(1.0)
    assert numeric.snr_db(a, a) == math.inf
    assert numeric.topk_agreement(a, a, 5) == 1.0


def test_snr_matches_the_definition():
    ref = np.ones(1000)
    noisy = ref + 0.01  # noise power 1e-4 vs signal 1 -> 40 dB
    assert numeric.snr_db(ref, noisy) == pytest.approx(40.0)


def test_topk_is_only_reported_for_classifier_outputs():
    """Top-k needs the model's task to say classifier, not the shape alone: a 2-D embedding
    of a model whose task is not classification gets none."""
    rng = np.random.default_rng(1)
    logits = [[rng.standard_normal((1, 10))] for _ in range(3)]
    embedding = [[rng.standard_normal((1, 256))] for _ in range(3)]
    hidden = [[rng.standard_normal((1, 16, 32))] for _ in range(3)]
    assert numeric.compare(logits, logits, classifier=True)[0].topk_agreement == 1.0
    assert numeric.compare(embedding, embedding)[0].topk_agreement is None
    assert numeric.compare(hidden, hidden, classifier=True)[0].topk_agreement is None


def test_fp16_defaults_and_overrides():
    # Faithful check (artifact vs source at FP16): the evidence-based defaults.
    t = numeric.thresholds_for(Precision.FP16)
    assert (t.min_cosine, t.min_snr_db, t.margin_db) == (0.999, 30.0, 10.0)
    # The seed's thresholds stay available for the precision cost.
    seed = numeric.SEED_THRESHOLDS
    assert (seed[Precision.FP16].min_cosine, seed[Precision.FP16].min_snr_db,
            seed[Precision.FP16].max_abs_diff) == (0.999, 60.0, 1e-3)
    assert (seed[Precision.INT8].min_cosine, seed[Precision.INT8].min_snr_db,
            seed[Precision.INT8].max_abs_diff) == (0.995, 40.0, 0.5)
    t = numeric.thresholds_for(Precision.FP16, {"numeric": {"fp16": {"min_snr_db": 45}}})
    assert t.min_snr_db == 45 and t.min_cosine == 0.999
    with pytest.raises(ValueError, match="unknown numeric threshold"):
        numeric.thresholds_for(Precision.FP16, {"numeric": {"fp16": {"min_snr": 45}}})


def test_small_noise_passes_fp16_and_large_noise_fails_naming_the_metric():
    rng = np.random.default_rng(2)
    ref = [[rng.standard_normal((1, 100))] for _ in range(4)]
    close = [[r[0] * (1 + 1e-4)] for r in ref]
    far = [[r[0] + rng.standard_normal((1, 100)) * 0.04] for r in ref]  # ~28 dB
    t = numeric.thresholds_for(Precision.FP16)
    assert numeric.evaluate(numeric.compare(ref, close), Precision.FP16, t, 4, "x").passed
    bad = numeric.evaluate(numeric.compare(ref, far), Precision.FP16, t, 4, "x")
    assert bad.status == "failed" and "SNR" in bad.reason and "cosine" not in bad.reason
    assert bad.to_dict()["outputs"][0]["snr_db"] < 30


def test_not_run_is_never_a_pass():
    r = numeric.not_run(Precision.FP16, "not run (needs macOS)")
    assert not r.passed and r.to_dict()["status"] == "not_run"
