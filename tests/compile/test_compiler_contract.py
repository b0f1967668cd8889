"""One contract every compiler passes (qnn-hub through its fake client)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from server.compile import Compiler, CompileRequest, SourceFormat
from server.compile.compilers.coreml import CoreMLCompiler
from server.compile.compilers.onnx import OnnxCompiler
from server.compile.compilers.qnn import QnnCompiler
from server.compile.compilers.qnn_hub import QnnHubCompiler
from server.compile.source import load_samples, run_onnx_cpu
from tests.compile.fake_qai_hub import FakeHub

COMPILERS = {
    "onnx": OnnxCompiler,
    "coreml": CoreMLCompiler,
    "qnn": QnnCompiler,
    "qnn-hub": lambda: QnnHubCompiler(FakeHub()),
}


@pytest.mark.parametrize("platform", sorted(COMPILERS))
@pytest.mark.parametrize("fmt", [SourceFormat.ONNX, SourceFormat.EXPORTED_PROGRAM])
def test_compiler_contract(platform, fmt, convnet, tmp_path):
    compiler = COMPILERS[platform]()
    assert isinstance(compiler, Compiler) and compiler.platform == platform
    req = CompileRequest(convnet.path(fmt), fmt, convnet.inputs,
                         settings={"qnn-hub": {"device": "Snapdragon 8 Elite QRD"}})
    artifacts = compiler.compile(req, tmp_path)

    assert artifacts
    for art in artifacts:
        # Output lives in the work dir, is non-empty, and says exactly what it targets.
        assert art.path.exists() and tmp_path in art.path.parents
        size = sum(p.stat().st_size for p in art.path.rglob("*")) if art.path.is_dir() \
            else art.path.stat().st_size
        assert size > 0
        t = art.target
        assert t.platform == platform and t.variant and t.format and t.runtime
        # soc/arch are selection constraints in the manifest (a non-empty value must equal the
        # device's): portable artifacts leave them empty, hardware-bound ones name the target.
        if platform in ("onnx", "coreml"):
            assert not t.soc and not t.arch
        elif platform == "qnn":
            assert t.soc and t.arch
        assert all(isinstance(v, (str, int, bool)) for v in art.compile_settings.values())
        if art.runnable_here:
            feeds = load_samples(convnet.reference, convnet.inputs)
            outs = compiler.run(art, feeds)
            assert len(outs) == len(feeds) and outs[0][0].shape == (1, 10)
            assert np.isfinite(outs[0][0]).all()
        else:
            assert art.not_runnable_reason and art.not_runnable_reason in art.notes
            with pytest.raises(RuntimeError):
                compiler.run(art, [])


def test_core_ml_on_linux_runs_its_mil_program_and_says_it_was_not_core_ml(convnet, tmp_path):
    if sys.platform == "darwin":
        pytest.skip("on macOS Core ML itself predicts")
    (art,) = CoreMLCompiler().compile(
        CompileRequest(convnet.pt2, SourceFormat.EXPORTED_PROGRAM, convnet.inputs), tmp_path)
    assert art.runnable_here and not art.not_runnable_reason
    assert art.extra["numeric_runner"] == "mil reference executor (numpy, fp16)"
    assert any("not by Core ML itself" in n for n in art.notes)
    feeds = load_samples(convnet.reference, convnet.inputs)
    (got,) = CoreMLCompiler().run(art, feeds[:1])[0]
    expected = run_onnx_cpu(convnet.onnx, feeds[:1])[0][0]
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert np.abs(got - expected).max() < 1e-2 * max(1.0, float(np.abs(expected).max()))


@pytest.mark.parametrize("compression", ["int8", "palettize4"])
def test_core_ml_weight_compression_is_in_the_compiled_spec(convnet, tmp_path, compression):
    from server.compile.gates.operators import check_mlpackage, deny_list
    def build(settings: dict, name: str):  # type: ignore[no-untyped-def]
        (tmp_path / name).mkdir()
        req = CompileRequest(convnet.pt2, SourceFormat.EXPORTED_PROGRAM, convnet.inputs,
                             settings={"coreml": settings})
        (art,) = CoreMLCompiler().compile(req, tmp_path / name)
        ops = check_mlpackage(art.path, "coreml", deny_list("coreml", "mil"))
        return art, ops

    plain, plain_ops = build({}, "plain")
    # The test model's weights are tiny, so lower the size threshold to compress them all.
    art, ops = build({"weight_compression": compression, "weight_threshold": 0}, "small")
    assert art.target.variant == f"fp16-{compression}" and ops.passed
    assert any(op.startswith("constexpr_") for op in ops.operators_seen), ops.operators_seen
    assert not any(op.startswith("constexpr_") for op in plain_ops.operators_seen)
    weights = "Data/com.apple.CoreML/weights/weight.bin"
    assert (art.path / weights).stat().st_size < (plain.path / weights).stat().st_size
