"""The QNN quantizer seam (server/compile/quantizers/): every backend passes one contract —
its output is a QDQ graph of the asked scheme that the unchanged QNN compile takes onto the
HTP and that runs close to FP32 — and the seam's own rules: `qnn.quantizer` picks the backend,
an unknown name is refused, AIMET without its interpreter says "not installed" before any
work, and in a build AIMET runs inside the compile sandbox with the deployment's interpreter,
never one a version's settings name.

The AIMET cases need a venv with aimet-onnx (it pins its own torch); they run when
MODELFLEET_AIMET_PYTHON names its python and are skipped with the reason otherwise (CI does
not install AIMET: scripts/setup stays light).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from server.compile import CompileRequest, SourceFormat
from server.compile.compilers.qnn import QnnCompiler
from server.compile.errors import CompilerUnavailableError, InvalidSourceError
from server.compile.gates.metrics import snr_db
from server.compile.pipeline import BuildSpec
from server.compile.quantizers.aimet import AimetQuantizer
from server.compile.quantizers.base import QdqScheme, Quantizer, Samples
from server.compile.quantizers.ort import OrtQdqQuantizer
from server.compile.quantizers.registry import default_quantizers
from server.compile.sandbox import (
    JobDirs,
    SandboxedPipeline,
    SandboxPolicy,
    bwrap_command,
    foreign_python_paths,
    run_child,
)
from server.compile.source import load_samples, run_onnx_cpu
from tests.compile.compile_models import ModelFiles
from tests.compile.quant_models import mlp

AIMET_PYTHON = os.environ.get("MODELFLEET_AIMET_PYTHON", "")
needs_aimet = pytest.mark.skipif(
    not (AIMET_PYTHON and os.access(AIMET_PYTHON, os.X_OK)),
    reason="AIMET not configured: set MODELFLEET_AIMET_PYTHON to the python of a venv with "
           "`pip install aimet-onnx` (too heavy for scripts/setup, so CI skips these)")
# (weight QDQ element type, activation QDQ element type) each scheme must produce
SCHEME_TYPES = {"w8a8": ({onnx.TensorProto.INT8, onnx.TensorProto.UINT8},
                         {onnx.TensorProto.UINT8}),
                "w8a16": ({onnx.TensorProto.INT8, onnx.TensorProto.UINT8},
                          {onnx.TensorProto.UINT16})}


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> ModelFiles:
    return mlp(tmp_path_factory.mktemp("quantizers"), "mlp", (64, 64, 32))


class Recording:
    """A real backend with a record of what the compiler asked of it."""

    def __init__(self, inner: Quantizer) -> None:
        self.inner, self.name = inner, inner.name
        self.calls: list[tuple[QdqScheme, int]] = []

    def unavailable(self) -> str:
        return self.inner.unavailable()

    def quantize(self, src: Path, out: Path, calibration: Samples,
                 scheme: QdqScheme) -> Path:
        self.calls.append((scheme, len(calibration)))
        return self.inner.quantize(src, out, calibration, scheme)


def _request(net: ModelFiles, **qnn: object) -> CompileRequest:
    return CompileRequest(net.onnx, SourceFormat.ONNX, net.inputs, onnx_path=net.onnx,
                          calibration_path=net.calibration, settings={"qnn": dict(qnn)})


def _qdq_types(model: onnx.ModelProto) -> tuple[set[int], set[int]]:
    """Integer types of the DequantizeLinear feeding the weights (input 1) and the
    activations (input 0) of the graph's MatMuls — whether a backend stores a weight already
    quantized (onnxruntime) or as float behind a QuantizeLinear (AIMET)."""
    inits = {i.name: i for i in model.graph.initializer}
    dq = {n.output[0]: inits[n.input[2]].data_type for n in model.graph.node
          if n.op_type == "DequantizeLinear" and len(n.input) > 2 and n.input[2] in inits}
    matmuls = [n for n in model.graph.node if n.op_type == "MatMul"]
    return ({dq[n.input[1]] for n in matmuls if n.input[1] in dq},
            {dq[n.input[0]] for n in matmuls if n.input[0] in dq})


BACKENDS = [pytest.param("ort", id="ort"),
            pytest.param("aimet", id="aimet", marks=needs_aimet),
            pytest.param("aimet-seqmse", id="aimet-seqmse", marks=needs_aimet)]


@pytest.mark.parametrize("scheme", ["w8a8", "w8a16"])
@pytest.mark.parametrize("name", BACKENDS)
def test_every_quantizer_makes_a_qdq_graph_the_qnn_compile_takes_and_runs(
        net: ModelFiles, tmp_path: Path, name: str, scheme: str) -> None:
    backend = Recording(default_quantizers(AIMET_PYTHON)[name])
    compiler = QnnCompiler({name: backend})
    (art,) = compiler.compile(_request(net, precision=scheme, quantizer=name), tmp_path)
    # The compiler went through the seam with the scheme it was asked for.
    bits = {"w8a8": (8, 8), "w8a16": (8, 16)}[scheme]
    assert [(s.weight_bits, s.activation_bits) for s, _ in backend.calls] == [bits]
    assert backend.calls[0][1] == 32  # every calibration sample
    qdq = onnx.load(str(art.extra["qdq_model"]))
    weight, act = _qdq_types(qdq)
    assert weight and weight <= SCHEME_TYPES[scheme][0], weight
    assert act and act <= SCHEME_TYPES[scheme][1], act
    # Unchanged downstream: the whole graph on the HTP, and it runs close to FP32.
    assert not art.extra["cpu_fallback"] and art.extra["htp"]["node_share"] == 1.0
    assert art.target.variant == f"{scheme}-sm8650" and art.precision.value == "int8"
    feeds = load_samples(net.reference, net.inputs)
    (got,) = compiler.run(art, feeds[:1])[0]
    expected = run_onnx_cpu(net.onnx, feeds[:1])[0][0]
    assert snr_db(expected, got) > (25.0 if scheme == "w8a8" else 30.0)
    assert not np.array_equal(expected, got)  # it really ran quantized
    if name != "ort":
        assert art.compile_settings["quantizer"] == name
        assert f"quantized by {name}" in art.notes


def test_the_default_quantizer_is_onnxruntimes_own(net: ModelFiles, tmp_path: Path) -> None:
    ort = Recording(OrtQdqQuantizer())
    (art,) = QnnCompiler({"ort": ort}).compile(_request(net, precision="w8a8"), tmp_path)
    assert len(ort.calls) == 1 and "quantizer" not in art.compile_settings


def test_an_unknown_quantizer_is_refused_naming_the_known_ones(net: ModelFiles,
                                                               tmp_path: Path) -> None:
    with pytest.raises(InvalidSourceError, match=r"aimet-adaround.*not 'gptq'"):
        QnnCompiler(default_quantizers("")).compile(
            _request(net, precision="w8a8", quantizer="gptq"), tmp_path)


def test_aimet_without_its_interpreter_says_not_installed_before_any_work(
        net: ModelFiles, tmp_path: Path) -> None:
    with pytest.raises(CompilerUnavailableError,
                       match=r"not installed.*MODELFLEET_AIMET_PYTHON"):
        QnnCompiler(default_quantizers("")).compile(
            _request(net, precision="w8a8", quantizer="aimet"), tmp_path)
    assert list(tmp_path.iterdir()) == []  # refused before the export or any quantization
    missing = AimetQuantizer(str(tmp_path / "no-such-python"))
    assert "not an executable" in missing.unavailable()


def test_a_failing_aimet_run_is_a_conversion_error_with_its_reason(net: ModelFiles,
                                                                   tmp_path: Path) -> None:
    # `python` here is the server's own interpreter: it has no aimet_onnx, so the worker
    # fails to import it, and the build error says so instead of hanging or passing.
    from server.compile.errors import ConversionError

    with pytest.raises(ConversionError, match=r"AIMET minmax w8a8 failed.*aimet_onnx"):
        AimetQuantizer(sys.executable).quantize(
            net.onnx, tmp_path / "out.qdq.onnx", [{"x": np.zeros((1, 4), np.float32)}],
            QdqScheme(8, 8))


def _conv_then_batchnorm(path: Path) -> Path:
    """paddle2onnx's pattern: a Conv without bias, then a BatchNormalization."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("w", rng.standard_normal((8, 3, 3, 3))), ("scale", rng.uniform(0.5, 2, 8)),
        ("bias", rng.standard_normal(8)), ("mean", rng.standard_normal(8)),
        ("var", rng.uniform(0.1, 1, 8)))]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"],
                          name="bn")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    return path


def test_aimet_quantizes_the_graph_prepared_for_the_htp(tmp_path: Path) -> None:
    """Seen on PP-OCR's detector: AIMET given the raw graph kept each standalone
    BatchNormalization as a QDQ op the HTP does not claim, and the compile failed; it gets
    the graph onnxruntime's flow gets (BatchNormalization folded into the Conv)."""
    from server.compile.errors import ConversionError

    seen = tmp_path / "seen.onnx"
    # An interpreter that keeps the graph the job names, then fails like a broken AIMET.
    python = tmp_path / "python"
    python.write_text(f"#!{sys.executable}\nimport json, shutil, sys\n"
                      f"job = json.load(open(sys.argv[-1]))\n"
                      f"shutil.copy(job['source'], {str(seen)!r})\nsys.exit(1)\n")
    python.chmod(0o755)
    src = _conv_then_batchnorm(tmp_path / "m.onnx")
    with pytest.raises(ConversionError, match="AIMET minmax w8a16 failed"):
        AimetQuantizer(str(python)).quantize(
            src, tmp_path / "out.qdq.onnx",
            [{"x": np.zeros((1, 3, 8, 8), np.float32)}], QdqScheme(8, 16))
    got = onnx.load(str(seen))
    assert [n.op_type for n in got.graph.node] == ["Conv"], got.graph.node
    feeds = [{"x": np.random.default_rng(4).standard_normal((1, 3, 8, 8)).astype(np.float32)}]
    assert snr_db(run_onnx_cpu(src, feeds)[0][0], run_onnx_cpu(seen, feeds)[0][0]) > 100


def test_an_aimet_export_that_does_not_reproduce_its_simulation_is_caught(
        net: ModelFiles) -> None:
    """The worker's own check (seen with SeqMSE on aimet-onnx 2.42: a 44 dB simulation
    exported as a 7 dB graph): simulation and export are both measured against FP32."""
    from server.compile.quantizers import aimet_worker as worker

    feeds = load_samples(net.reference, net.inputs)
    fp32 = run_onnx_cpu(net.onnx, feeds)
    rng = np.random.default_rng(1)

    def noisy(scale: float) -> list[list[np.ndarray]]:
        return [[o + scale * np.std(o) * rng.standard_normal(o.shape) for o in outs]
                for outs in fp32]

    sim_db, bad_db = worker.export_check(fp32, noisy(0.01), noisy(0.4))  # ~40 dB vs ~8 dB
    assert 35 < sim_db < 45 and bad_db < sim_db - worker.EXPORT_MARGIN_DB
    sim_db, ok_db = worker.export_check(fp32, noisy(0.01), noisy(0.015))
    assert ok_db >= sim_db - worker.EXPORT_MARGIN_DB
    assert worker.worst_snr_db(fp32, fp32) == 200.0


def _spec(net: ModelFiles, **qnn: object) -> BuildSpec:
    return BuildSpec(source_path=net.onnx, source_format=SourceFormat.ONNX,
                     variants={"default": net.inputs}, platforms=("qnn",),
                     settings={"qnn": {"precision": "w8a8", **qnn}, "layer_diff": "off",
                               "numeric_samples": 2},
                     calibration_path=net.calibration, reference_path=net.reference)


def test_a_version_setting_cannot_choose_the_aimet_interpreter(net: ModelFiles,
                                                               tmp_path: Path) -> None:
    """The interpreter is the deployment's (policy); an upload naming one gets nothing run."""
    spec = _spec(net, quantizer="aimet", aimet_python="/bin/sh")
    out = SandboxedPipeline(SandboxPolicy()).build(spec, tmp_path / "work")
    assert [o.state for o in out] == ["failed"]
    assert "not installed" in out[0].error, out[0].error


@needs_aimet
def test_aimet_runs_inside_the_compile_sandbox(net: ModelFiles, tmp_path: Path) -> None:
    lines: list[str] = []
    out = SandboxedPipeline(SandboxPolicy(aimet_python=AIMET_PYTHON), lines.append).build(
        _spec(net, quantizer="aimet"), tmp_path / "work")
    assert [o.state for o in out] == ["ready"], [o.error for o in out]
    assert out[0].compile_settings["quantizer"] == "aimet"
    assert out[0].gates["numeric"]["status"] == "passed"
    assert any("compiling in bubblewrap" in line for line in lines)


@needs_aimet
def test_the_aimet_interpreter_in_the_sandbox_cannot_read_the_server_files(
        tmp_path: Path) -> None:
    secret = tmp_path / "data" / "release.key"
    secret.parent.mkdir()
    secret.write_text("secret")
    job = JobDirs(tmp_path / "job")
    job.create()
    probe = ("import aimet_onnx, os\n"
             f"try:\n    open({str(secret)!r}).read(); print('READ')\n"
             "except OSError as e:\n    print('DENIED', type(e).__name__)\n"
             "print('uid', os.getuid())")
    policy = SandboxPolicy(aimet_python=AIMET_PYTHON)
    lines: list[str] = []
    cmd = bwrap_command(policy, job, extra_ro=foreign_python_paths(AIMET_PYTHON),
                        program=[AIMET_PYTHON, "-s", "-c", probe])
    run = run_child(cmd, job, policy, lines.append)
    assert run.returncode == 0, run.failure()
    assert lines[0].startswith("DENIED") and "READ" not in lines
    if os.geteuid() == 0:
        assert lines[1] == "uid 65534"
