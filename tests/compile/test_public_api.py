"""`server.compile`'s public surface is what `__all__` lists, and importing it stays light."""

from __future__ import annotations

import subprocess
import sys

import server.compile as compile_pkg


def test_all_names_exist_and_are_exported():
    assert sorted(compile_pkg.__all__) == sorted(set(compile_pkg.__all__))
    for name in compile_pkg.__all__:
        assert getattr(compile_pkg, name) is not None


def test_importing_the_package_does_not_load_the_toolchains():
    # The API process imports server.compile for types; torch/coremltools/onnxruntime load
    # only when a build actually runs.
    code = ("import sys, server.compile, server.api.builds; "
            "print(sorted(m for m in ('torch', 'coremltools', 'onnxruntime', 'onnx2torch', "
            "'qai_hub') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"
