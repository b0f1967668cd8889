"""One contract every compiler passes (qnn-hub through its fake client)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from fake_qai_hub import FakeHub

from server.compile import Compiler, CompileRequest, SourceFormat
from server.compile.compilers.coreml import CoreMLCompiler
from server.compile.compilers.onnx import OnnxCompiler
from server.compile.compilers.qnn import QnnCompiler
from server.compile.compilers.qnn_hub import QnnHubCompiler
from server.compile.source import load_samples

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
        assert t.platform == platform and t.variant and t.format and t.runtime and t.arch
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


def test_core_ml_says_plainly_it_did_not_run_on_linux(convnet, tmp_path):
    if sys.platform == "darwin":
        pytest.skip("on macOS Core ML artifacts do run")
    (art,) = CoreMLCompiler().compile(
        CompileRequest(convnet.pt2, SourceFormat.EXPORTED_PROGRAM, convnet.inputs), tmp_path)
    assert not art.runnable_here
    assert art.not_runnable_reason.startswith("not run (needs macOS)")
