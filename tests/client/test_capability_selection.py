"""Artifacts per capability: a release may list several builds a device could run, each with
the hardware capabilities it `requires`; the SDK takes the one its hardware runs best (an HTP
with FP16 the FP16 build, one without the INT8 build) and today's choice when nothing is
required. Both directions of compatibility: the SDK as it is on main reads a new manifest and
still picks a runnable artifact; this SDK reads an old manifest and picks what main picks."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from client_sdk.selection import select
from manifests import (
    PPM,
    Artifact,
    DeviceProfile,
    MalformedError,
    Manifest,
    ModelEntry,
    Release,
    Rollout,
    device_capabilities,
)

REPO = Path(__file__).resolve().parents[2]
FORMATS = ("onnx", "onnx-epcontext")


def _art(variant: str, arch: str, requires: list[str], soc: str = "") -> Artifact:
    sha = hashlib.sha256(variant.encode()).hexdigest()
    target = {"arch": arch, **({"soc": soc} if soc else {})}
    return Artifact(platform="qnn", variant=variant, format="onnx-epcontext",
                    url=f"v1/artifacts/{sha}", length=10, sha256=sha, target=target,
                    compile_settings={"precision": variant.split("-")[0]}, requires=requires)


def _manifest(artifacts: list[Artifact]) -> Manifest:
    release = Release(version="1.0", rollout=Rollout(share_ppm=PPM, salt="s"),
                      artifacts=artifacts)
    return Manifest(channel="prod", serial=1, expires=2_000_000_000,
                    models={"clf": ModelEntry(releases=[release])})


# Both builds for v75 (INT8 first: the one every reader can run), one INT8 build for v68.
NEW = _manifest([_art("int8-v75", "v75", ["htp_int8"]), _art("fp16-v75", "v75", ["htp_fp16"]),
                 _art("int8-v68", "v68", ["htp_int8"])])
V75 = DeviceProfile("phone-a", "qnn", arch="v75")
V68 = DeviceProfile("phone-b", "qnn", arch="v68")


def _pick(manifest: Manifest, device: DeviceProfile) -> str:
    (plan,) = select(manifest, device, formats=FORMATS).plans
    return plan.artifacts[0][1].variant


def test_hardware_capabilities_follow_the_htp_generation() -> None:
    assert device_capabilities(V75) == ("htp_fp16", "htp_int8")
    assert device_capabilities(V68) == ("htp_int8",)
    assert device_capabilities(DeviceProfile("box", "onnx", arch="x86_64")) is None


def test_fp16_htp_takes_the_fp16_build_and_an_older_htp_the_int8_one() -> None:
    assert _pick(NEW, V75) == "fp16-v75"
    assert _pick(NEW, V68) == "int8-v68"


def test_an_artifact_needing_what_the_hardware_lacks_is_never_picked() -> None:
    generic = _manifest([_art("fp16-any", "", ["htp_fp16"]), _art("int8-any", "", ["htp_int8"])])
    assert _pick(generic, V68) == "int8-any"
    assert _pick(generic, V75) == "fp16-any"
    only_fp16 = _manifest([_art("fp16-any", "", ["htp_fp16"])])
    assert select(only_fp16, V68, formats=FORMATS).plans == ()


def test_new_sdk_on_an_old_manifest_keeps_todays_choice() -> None:
    old = _manifest([_art("int8-v75", "v75", []), _art("fp16-v75", "v75", [])])
    assert _pick(old, V75) == "int8-v75"  # the first that matches, as before `requires`


def test_requires_is_additive_in_the_document() -> None:
    doc = NEW.to_dict()
    arts = doc["models"]["clf"]["releases"][0]["artifacts"]  # type: ignore[index]
    assert [a.get("requires") for a in arts] == [["htp_int8"], ["htp_fp16"], ["htp_int8"]]
    assert "requires" not in _art("x", "", []).to_dict()  # unset: not written
    assert Manifest.from_dict(doc) == NEW


def test_malformed_requires_is_refused() -> None:
    doc = _art("x", "", ["htp_int8"]).to_dict()
    for bad in (["../etc"], "htp_int8", [1], ["a"] * 17):
        with pytest.raises(MalformedError):
            Artifact.from_dict({**doc, "requires": bad})


# The last commit of main before `requires` existed: the SDK devices in the field run.
OLD_SDK_COMMIT = "f994633"


def _main_sdk(tmp: Path) -> Path:
    """The manifests/ and client_sdk/ packages as they were on main before `requires`."""
    out = tmp / "main_sdk"
    out.mkdir()
    tar = subprocess.run(["git", "-C", str(REPO), "archive", OLD_SDK_COMMIT, "manifests",
                          "client_sdk"],
                         capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(out, filter="data")
    return out


OLD_READER = """
import json, sys
import manifests
from manifests import Manifest, DeviceProfile
from client_sdk.selection import select
doc = json.loads(sys.stdin.read())
m = Manifest.from_dict(doc)
out = {}
for dev, arch in (("a", "v75"), ("b", "v68")):
    (plan,) = select(m, DeviceProfile(dev, "qnn", arch=arch),
                     formats=["onnx", "onnx-epcontext"]).plans
    out[arch] = plan.artifacts[0][1].variant
out["round_trip"] = m.to_dict() == doc
out["file"] = manifests.__file__
print(json.dumps(out))
"""


def test_main_sdk_parses_a_new_manifest_and_picks_an_artifact_its_device_runs(
        tmp_path: Path) -> None:
    sdk = _main_sdk(tmp_path)
    assert "requires" not in (sdk / "manifests" / "manifest.py").read_text()  # really old
    done = subprocess.run([sys.executable, "-c", OLD_READER], cwd=sdk, env={"PYTHONPATH": str(sdk)},
                          input=json.dumps(NEW.to_dict()), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got.pop("file").startswith(str(sdk)), "the old SDK's own code must run"
    # The old reader ignores `requires` (kept as an unknown field) and takes the first match:
    # the INT8 build publishers list first, which a v75 HTP runs too.
    assert got == {"v75": "int8-v75", "v68": "int8-v68", "round_trip": True}
