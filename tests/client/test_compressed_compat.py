"""Compressed copies and compatibility, both directions: the SDK as it is on main (before
`compressed` existed) installs from a manifest that offers copies, downloading the content
as it always did; this SDK reads manifests with and without the field, and a watermark
cohort's device takes its own cohort's copy."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from client_sdk import compression
from manifests import Artifact, CohortArtifact, Cohorts, Compressed, MalformedError, cohort_of
from tests.client.onnx_models import scaled_model

REPO = Path(__file__).resolve().parents[2]
# The last commit of main before `compressed` existed: the SDK devices in the field run.
OLD_SDK_COMMIT = "b496974"
# The last commit of main whose SDK knows only the plain zstd codec (before zstd-shuffle2/4).
ZSTD_ONLY_SDK_COMMIT = "9229ba3"

SHA = "ab" * 32
COPY = Compressed("zstd", "v1/artifacts/" + "cd" * 32, 7, "cd" * 32)


def _art(**kw) -> Artifact:
    return Artifact(platform="onnx", variant="", format="onnx", url="v1/artifacts/" + SHA,
                    length=10, sha256=SHA, **kw)


def test_compressed_round_trips_and_is_written_only_when_set() -> None:
    art = _art(compressed=COPY)
    doc = art.to_dict()
    assert doc["compressed"] == {"codec": "zstd", "url": COPY.url, "length": 7,
                                 "sha256": COPY.sha256}
    assert Artifact.from_dict(doc) == art
    assert "compressed" not in _art().to_dict()
    assert Artifact.from_dict(_art().to_dict()).compressed is None  # an old document


def test_malformed_compressed_is_refused() -> None:
    doc = _art(compressed=COPY).to_dict()
    for bad in ({**COPY.to_dict(), "sha256": "x"}, {**COPY.to_dict(), "length": -1},
                {**COPY.to_dict(), "codec": "../zstd"}, "zstd", {"codec": "zstd"}):
        with pytest.raises(MalformedError):
            Artifact.from_dict({**doc, "compressed": bad})


def test_cohort_device_takes_its_own_cohorts_copy() -> None:
    copies = [Compressed("zstd", f"v1/artifacts/{c:064x}", 5 + c, f"{c:064x}") for c in (1, 2)]
    cohorts = Cohorts("clf", [CohortArtifact(url=f"v1/artifacts/{c:064x}", length=10,
                                             sha256=f"{c + 10:064x}", compressed=copies[c - 1])
                              for c in (1, 2)])
    art = _art(compressed=copies[0], cohorts=cohorts)
    assert Artifact.from_dict(art.to_dict()) == art
    device = next(d for d in (f"dev-{i}" for i in range(100)) if cohort_of("clf", d, 2) == 1)
    assert art.for_device(device).compressed == copies[1]
    bare = _art(cohorts=Cohorts("clf", [CohortArtifact("v1/artifacts/x", 1, SHA)] * 2),
                compressed=COPY)
    assert bare.for_device(device).compressed is None  # never another cohort's copy


OLD_DEVICE = r"""
import json, sys
from pathlib import Path
import manifests
from manifests import MANIFEST_PAYLOAD_TYPE, Filters, Manifest, ModelEntry, Release, Rollout
from manifests import sign_envelope, strictjson
from client_sdk import DeviceProfile, Updater, UpdaterConfig
from tests.client.simulator import BASE, FakeClock, RepositorySimulator
content, copy = Path(sys.argv[1]).read_bytes(), Path(sys.argv[2]).read_bytes()
data_dir, codec = sys.argv[3], sys.argv[4]
clock = FakeClock()
sim = RepositorySimulator(clock)
art = sim.artifact(content)
url, sha = sim.add_blob(copy, "blobs/compressed-copy")
release = Release("1.0", Rollout(1_000_000, "s", "active", Filters(), None), [art])
doc = Manifest("prod", 1, int(clock.time()) + 86400, {"clf": ModelEntry([release])}).to_dict()
doc["models"]["clf"]["releases"][0]["artifacts"][0]["compressed"] = {
    "codec": codec, "url": url, "length": len(copy), "sha256": sha}
sim.manifest_override["prod"] = sign_envelope(strictjson.dumps(doc), MANIFEST_PAYLOAD_TYPE,
                                              sim.release_keys)
up = Updater(UpdaterConfig(base_url=BASE, channel="prod", pinned_root=sim.pinned_root,
                           device=DeviceProfile("d", "linux", arch="x86_64"),
                           data_dir=Path(data_dir), clock=clock, transport=sim,
                           formats=["onnx"]))
result = up.check_once()
bundle = up.store.active("clf")
fetched = [f.path for f in sim.fetched("/blobs/")]
print(json.dumps({"outcome": result.outcome.value, "fetched": fetched,
                  "installed": bundle.members[0].sha256, "verified": up.store.verify(bundle),
                  "content_url": "/" + art.url, "file": manifests.__file__,
                  "knows_compressed": hasattr(manifests, "Compressed")}))
"""


def _main_sdk(tmp: Path, commit: str = OLD_SDK_COMMIT) -> Path:
    out = tmp / "main_sdk"
    out.mkdir()
    tar = subprocess.run(["git", "-C", str(REPO), "archive", commit, "manifests",
                          "client_sdk", "tests/__init__.py", "tests/client", "tests/support"],
                         capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(out, filter="data")
    return out


def _old_device(sdk: Path, tmp_path: Path, content: bytes, codec: str) -> dict:
    copy = io.BytesIO()
    compression.compress(io.BytesIO(content), copy, len(content), codec=codec)
    (tmp_path / "content").write_bytes(content)
    (tmp_path / "copy").write_bytes(copy.getvalue())
    done = subprocess.run([sys.executable, "-c", OLD_DEVICE, str(tmp_path / "content"),
                           str(tmp_path / "copy"), str(tmp_path / "device"), codec], cwd=sdk,
                          env={"PYTHONPATH": str(sdk)}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    got: dict = json.loads(done.stdout)
    assert got["file"].startswith(str(sdk))
    return got


def test_main_sdk_installs_the_content_from_a_manifest_offering_a_compressed_copy(
        tmp_path: Path) -> None:
    sdk = _main_sdk(tmp_path)
    content = scaled_model(1.0, padding=40_000)
    got = _old_device(sdk, tmp_path, content, compression.CODEC)
    assert not got["knows_compressed"], "really old"
    assert got["outcome"] == "updated" and got["verified"]
    assert got["installed"] == hashlib.sha256(content).hexdigest()
    # It ignored the field it does not know and downloaded what it always downloaded.
    assert got["fetched"] == [got["content_url"]]


@pytest.mark.parametrize("codec", sorted(compression.SHUFFLED))
def test_zstd_only_sdk_installs_the_content_when_the_copy_is_shuffled(tmp_path: Path,
                                                                      codec: str) -> None:
    """An SDK that reads `compressed` but knows only plain zstd does not inflate a shuffled
    copy (it would inflate to shuffled bytes, refused by the sha256 but a wasted download):
    it downloads the content, as for any codec it does not know."""
    sdk = _main_sdk(tmp_path, ZSTD_ONLY_SDK_COMMIT)
    content = scaled_model(1.0, padding=40_000)
    got = _old_device(sdk, tmp_path, content, codec)
    assert got["knows_compressed"]
    assert got["outcome"] == "updated" and got["verified"]
    assert got["installed"] == hashlib.sha256(content).hexdigest()
    assert got["fetched"] == [got["content_url"]]
