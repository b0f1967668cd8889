"""`manifests` imports and works with only pynacl + the standard library (the core install)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import manifests

REPO = Path(__file__).resolve().parents[2]

# Runs in a fresh interpreter: blocks every heavy or server-side package, then imports and
# exercises manifests, then lists the non-stdlib top-level modules that got loaded.
PROBE = r"""
import sys
BLOCKED = {"server", "client_sdk", "numpy", "fastapi", "pydantic", "sqlalchemy", "boto3",
           "torch", "onnx", "onnxruntime", "coremltools", "qai_hub", "zstandard", "bsdiff4",
           "jsonschema", "hypothesis", "typer", "httpx", "requests"}
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked import of {name}")
        return None
sys.meta_path.insert(0, Block())
before = set(sys.modules)
import manifests
k = manifests.SigningKey.from_seed(bytes(32))
env = manifests.Envelope.from_bytes(
    manifests.sign_envelope(b"{}", manifests.ROOT_PAYLOAD_TYPE, [k]), 1000)
assert manifests.verify_envelope(env, {k.keyid: k.public_key}, 1,
                                 manifests.ROOT_PAYLOAD_TYPE) == b"{}"
new = {m.split(".")[0] for m in set(sys.modules) - before}
loaded = sorted(new - set(sys.stdlib_module_names))
print(" ".join(loaded))
"""


def test_manifests_imports_with_only_pynacl_and_stdlib() -> None:
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.split())
    assert "manifests" in loaded and "nacl" in loaded
    assert loaded <= {"manifests", "nacl", "_sodium", "_cffi_backend", "cffi"}, loaded


def test_public_names_are_exported_exactly() -> None:
    public = {n for n in dir(manifests) if not n.startswith("_")}
    modules = {"capabilities", "cohorts", "compressed", "envelope", "errors", "keys", "lint",
               "manifest", "root", "rollout", "sealed", "strictjson", "trust", "versions"}
    assert set(manifests.__all__) == public - modules
    assert len(manifests.__all__) == len(set(manifests.__all__))
