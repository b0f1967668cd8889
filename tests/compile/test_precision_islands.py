"""Precision islands on the HTP (server/compile/precision_islands.py, qnn_islands.py): when the
HTP's FP16 loses a model at a node — a log-power front end, `log(x² + 1e-10)`, whose small
squares and 1e-10 are 0 in FP16 — the default QNN build keeps that region at FP32 on the
device's CPU EP inside the same EPContext artifact, judged as shipped and reported; a model
FP16 serves gets no island; an island that does not recover the model fails naming it; and
the device SDK runs an island artifact end to end."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from server.compile import BuildSpec, InputSpec, Pipeline, SourceFormat
from server.compile.errors import ConversionError
from server.compile.pipeline import BuildOutcome
from server.compile.precision_islands import lost, noise_like, underflow_region
from server.compile.qnn_islands import convex, cut
from tests.compile.compile_models import onnx_model

F = TensorProto.FLOAT
REGION = ("log_power", "add_eps", "square")


def _branch(nodes: list, x: str, tag: str, chain: int) -> str:
    """`log(x² + eps)` then `chain` HTP-friendly scalings (×2, ×0.5: exact in FP16)."""
    nodes += [helper.make_node("Mul", [x, x], [f"power{tag}"], name=f"square{tag}"),
              helper.make_node("Add", [f"power{tag}", "eps"], [f"floored{tag}"],
                               name=f"add_eps{tag}"),
              helper.make_node("Log", [f"floored{tag}"], [f"logp{tag}"], name=f"log_power{tag}")]
    out = f"logp{tag}"
    for k in range(chain):
        nodes.append(helper.make_node("Mul", [out, "two" if k % 2 == 0 else "half"],
                                      [f"s{tag}{k}"], name=f"scale{tag}{k}"))
        out = f"s{tag}{k}"
    return out


def _log_power(path: Path, eps: float, chain: int = 30, branches: int = 1) -> Path:
    nodes: list = []
    outs = [_branch(nodes, "x", "", chain)]
    if branches == 2:  # a second log-power on x / 2, which an island on the first misses
        nodes.append(helper.make_node("Mul", ["x", "half"], ["xh"], name="halve"))
        outs.append(_branch(nodes, "xh", "_b", chain))
    names = [f"y{i}" for i in range(len(outs))]
    for n in nodes:  # each branch's last tensor is a graph output
        n.output[:] = [names[outs.index(o)] if o in outs else o for o in n.output]
    return onnx_model(path, nodes, [helper.make_tensor_value_info("x", F, [1, 64])],
                      [helper.make_tensor_value_info(n, F, [1, 64]) for n in names],
                      # A floor per bin: the log-power rewrite (log_rescale.py) scales only
                      # scalar floors, so FP16 still loses this model, as these tests need.
                      [numpy_helper.from_array(np.full((1, 64), eps, np.float32), "eps"),
                       numpy_helper.from_array(np.array(2.0, np.float32), "two"),
                       numpy_helper.from_array(np.array(0.5, np.float32), "half")])


def _spectrum(low: float) -> np.ndarray:
    rng = np.random.default_rng(0)
    # Quiet and loud bins, as a spectrum has: amplitudes from `low` to 1.
    return (10.0 ** rng.uniform(np.log10(low), 0, (2, 1, 64))).astype(np.float32)


def _build(tmp_path: Path, model: Path, low: float = 1e-6, **qnn: str) -> BuildOutcome:
    np.savez(tmp_path / "ref.npz", x=_spectrum(low))
    spec = BuildSpec(model, SourceFormat.ONNX, {"default": (InputSpec("x", (1, 64)),)},
                     platforms=("qnn",), settings={"qnn": dict(qnn)},
                     reference_path=tmp_path / "ref.npz")
    (out,) = Pipeline().build(spec, tmp_path / "build")
    return out


def test_fp16_loss_tensor_test_flags_underflow_and_overflow_only() -> None:
    assert lost(np.array([1e-6, 1e-7, 0.5], np.float32))
    assert lost(np.array([1e5, 1.0], np.float32))
    assert not lost(np.array([1e-3, 0.5, 0.0, 3e4], np.float32))


def test_rounding_noise_is_told_from_a_systematic_fault() -> None:
    # speaker-lstm's third LSTM on the HTP (cosine, SNR against the FP16 source): noise-like
    assert noise_like(0.999270, 28.3)
    # a conv whose weights a broken compile scaled by 1.3: cosine 1.0 at 10 dB
    assert not noise_like(1.0, 10.6)
    # a wrong result: far less cosine than the SNR's noise would cost
    assert not noise_like(0.9, 28.3)


def test_underflow_region_walks_up_through_the_tensors_fp16_cannot_hold(tmp_path: Path) -> None:
    src = _log_power(tmp_path / "m.onnx", 1e-10, chain=2)
    feeds = {"x": _spectrum(1e-6)[0]}
    # Log reads x² + 1e-10, Add reads x² (both below FP16's range); x itself is an input.
    assert underflow_region(src, "log_power", feeds) == REGION
    # No underflow feeds the first scaling after the Log: no evidence, no region.
    assert underflow_region(src, "scale0", feeds) == ()


def test_island_is_made_convex_and_unknown_nodes_are_refused(tmp_path: Path) -> None:
    model = onnx.load(str(_log_power(tmp_path / "m.onnx", 1e-10, chain=2)))
    # square and log_power bound add_eps between them: it joins the island.
    assert convex(model, ["log_power", "square"]) == ["square", "add_eps", "log_power"]
    with pytest.raises(Exception, match="does not have: nope"):
        convex(model, ["nope"])


def test_fp16_underflow_the_htp_loses_is_kept_at_fp32_on_the_cpu_and_passes(
        tmp_path: Path) -> None:
    out = _build(tmp_path, _log_power(tmp_path / "m.onnx", 1e-10))
    assert out.state == "ready", out.error
    island = out.gates["precision_islands"]
    assert island["kind"] == "underflow" and island["chosen"] is True
    assert island["nodes"] == list(REGION)
    assert "numeric gate failed" in island["failed_error"]  # the HTP-only build, before
    assert island["node_share"] >= 0.9
    assert out.compile_settings["fp32_nodes"] == ",".join(REGION)
    assert out.compile_settings["cpu_nodes"] == 3
    htp = out.gates["htp"]
    assert {n["node"] for n in htp["cpu_nodes"]} == set(REGION)
    num = out.gates["numeric"]
    assert num["status"] == "passed"
    # Judged against the source at FP16 with the island at FP32 — and far better than the
    # HTP-only build against FP32 (which was -inf: log 0).
    assert "except the FP32 precision island" in num["basis"]
    assert min(float(m["snr_db"]) for m in num["vs_fp32"]) > 30
    shipped = onnx.load(str(out.artifact.path))
    ops = [n.op_type for n in shipped.graph.node]
    assert ops[:3] == ["Mul", "Add", "Log"] and set(ops[3:]) == {"EPContext"}
    assert any("precision island chosen by default" in n for n in out.notes)


def test_a_model_fp16_serves_gets_no_island_and_one_build(tmp_path: Path) -> None:
    out = _build(tmp_path, _log_power(tmp_path / "m.onnx", 1e-2), low=0.1)
    assert out.state == "ready", out.error
    assert "precision_islands" not in out.gates and "fp32_nodes" not in out.compile_settings
    assert not (tmp_path / "build" / "default" / "qnn" / "island0").exists()


def test_an_island_that_does_not_recover_the_model_fails_naming_it(tmp_path: Path) -> None:
    out = _build(tmp_path, _log_power(tmp_path / "m.onnx", 1e-10, chain=15, branches=2))
    assert out.state == "failed"
    island = out.gates["precision_islands"]
    assert island["chosen"] is False and island["nodes"] == list(REGION)
    assert "kept 3 node(s) at FP32 on the device's CPU EP (log_power, add_eps, square)" \
        in out.error
    assert "the build with that island failed too" in out.error
    assert "output 1" in out.error  # the second log-power, which the island does not cover
    # the outcome stays the HTP-only build's, whose layer walk says where the HTP loses it
    assert out.gates["numeric"]["layers"]["faithful"]["first_below"]["node"] == "log_power"
    # bounded: one extra compile, no second guess
    assert not (tmp_path / "build" / "default" / "qnn" / "island1").exists()


def test_islands_off_keeps_the_htp_only_failure(tmp_path: Path) -> None:
    out = _build(tmp_path, _log_power(tmp_path / "m.onnx", 1e-10), precision_islands="off")
    assert out.state == "failed" and "precision_islands" not in out.gates
    assert "no threshold accepts it" in out.error


def test_an_island_taking_more_than_the_default_share_off_the_htp_fails_by_name(
        tmp_path: Path) -> None:
    from server.compile import CompileRequest
    from server.compile.compilers.qnn import QnnCompiler

    src = _log_power(tmp_path / "m.onnx", 1e-10, chain=2)  # 3 of 5 nodes
    request = CompileRequest(src, SourceFormat.ONNX, (InputSpec("x", (1, 64)),), onnx_path=src,
                             settings={"qnn": {"fp32_nodes": "log_power,add_eps,square"}})
    with pytest.raises(ConversionError) as err:
        QnnCompiler().compile(request, tmp_path)
    msg = str(err.value)
    assert "precision island (log_power, add_eps, square)" in msg
    assert "40.0% of nodes on the HTP, below 0.9" in msg and "min_htp_share" in msg


def test_device_sdk_runs_an_island_artifact_end_to_end(tmp_path: Path) -> None:
    from client_sdk import ModelRuntime
    from client_sdk.errors import BackendUnavailableError
    from client_sdk.install import BundleStore, Member

    out = _build(tmp_path, _log_power(tmp_path / "m.onnx", 1e-10))
    assert out.state == "ready", out.error
    data = out.artifact.path.read_bytes()
    x = _spectrum(1e-6)[1]
    expected = np.log(x.astype(np.float64) ** 2 + 1e-10)
    store = BundleStore(tmp_path / "device")

    def stage(version: str, settings: dict[str, object]):
        src = tmp_path / f"shipped-{version}.onnx"  # staging moves the file into the store
        src.write_bytes(data)
        member = Member("primary", "onnx-epcontext", "android", out.variant, "primary.onnx",
                        hashlib.sha256(data).hexdigest(), len(data),
                        compile_settings=settings)
        return store.stage("pitch", version, [(member, src)])

    p = ModelRuntime(tmp_path / "device").prepare(
        stage("1.0", dict(out.compile_settings))).run({"x": x})
    assert p.backend == "onnxruntime-qnn"
    np.testing.assert_allclose(p.outputs["y0"], expected, atol=0.05)
    # Without the signed declaration of its CPU nodes the device refuses the artifact rather
    # than running nodes on the CPU silently.
    undeclared = {k: v for k, v in out.compile_settings.items() if k != "cpu_nodes"}
    with pytest.raises(BackendUnavailableError):
        ModelRuntime(tmp_path / "device").prepare(stage("1.1", undeclared)).run({"x": x})


def _shared_constant(path: Path) -> Path:
    """A constant subgraph (Constant → Expand) read on both sides of an island and by it."""
    shape = numpy_helper.from_array(np.array([1, 64], np.int64), "shape")
    nodes = [helper.make_node("Constant", [], ["c"], name="const",
                              value=numpy_helper.from_array(np.array([0.25], np.float32))),
             helper.make_node("Expand", ["c", "shape"], ["floor"], name="expand"),
             helper.make_node("Add", ["x", "floor"], ["a"], name="before"),
             helper.make_node("Add", ["a", "floor"], ["b"], name="island"),
             helper.make_node("Mul", ["b", "floor"], ["y"], name="after")]
    return onnx_model(path, nodes, [helper.make_tensor_value_info("x", F, [1, 64])],
                      [helper.make_tensor_value_info("y", F, [1, 64])], [shape])


def test_constants_are_copied_to_each_side_of_the_cut(tmp_path: Path) -> None:
    parts = cut(onnx.load(str(_shared_constant(tmp_path / "m.onnx"))), ["island"])
    assert [[n.name for n in g] for g in (parts.before, parts.island, parts.after)] == [
        ["const", "expand", "before"], ["const", "expand", "island"],
        ["const", "expand", "after"]]


def test_island_artifact_with_constants_on_both_sides_runs_and_matches(tmp_path: Path) -> None:
    # Measured: an EPContext input fed by a constant fails at run time ("The count of graph
    # inputs should be at least the count of tensor_wrapper"), so constants never cross.
    from server.compile import CompileRequest
    from server.compile.compilers.qnn import QnnCompiler
    from server.compile.source import run_onnx_cpu

    src = _shared_constant(tmp_path / "m.onnx")
    request = CompileRequest(src, SourceFormat.ONNX, (InputSpec("x", (1, 64)),), onnx_path=src,
                             settings={"qnn": {"fp32_nodes": "island", "min_htp_share": "0.5"}})
    compiler = QnnCompiler()
    [art] = compiler.compile(request, tmp_path)
    assert art.compile_settings["cpu_nodes"] == 1
    assert [n["node"] for n in art.extra["htp"]["cpu_nodes"]] == ["island"]
    feeds = [{"x": np.linspace(-1, 1, 64, dtype=np.float32)[None]}]
    np.testing.assert_allclose(compiler.run(art, feeds)[0][0], run_onnx_cpu(src, feeds)[0][0],
                               atol=1e-2)
