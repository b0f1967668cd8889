"""The manifest's additive `cohorts` object (docs/manifest.md 7.4): it round-trips, a
client picks its cohort's copy (bytes, patches, seal) by the cohort rule, a client that
predates it reads the artifact itself (cohort 0's copy), and malformed entries are refused."""

from __future__ import annotations

import pytest

from client_sdk.selection import members
from manifests import (
    Artifact,
    CohortArtifact,
    Cohorts,
    DeviceProfile,
    MalformedError,
    Patch,
    Release,
    Rollout,
    cohort_of,
)
from manifests.manifest import PPM


def sha(i: int) -> str:
    return f"{i:064x}"


def watermarked(n: int = 4) -> Artifact:
    copies = [CohortArtifact(url=f"v1/artifacts/{sha(100 + c)}", length=10 + c,
                             sha256=sha(100 + c),
                             patches=[Patch(sha(200 + c), f"v1/patches/{sha(300 + c)}", 3,
                                            sha(300 + c), "bsdiff4")])
              for c in range(n)]
    return Artifact(platform="onnx", variant="", format="onnx", url=copies[0].url,
                    length=copies[0].length, sha256=copies[0].sha256,
                    cohorts=Cohorts(salt="clf", artifacts=copies))


def test_cohorts_round_trip_and_an_old_reader_sees_cohort_zero():
    art = watermarked()
    doc = art.to_dict()
    assert Artifact.from_dict(doc) == art
    # An SDK that predates cohorts keeps the unknown member as `extra` and takes the
    # artifact's own url: cohort 0's copy.
    old = dict(doc)
    assert old["sha256"] == old["cohorts"]["artifacts"][0]["sha256"]


def test_each_device_selects_its_cohorts_copy_with_its_patches():
    art = watermarked()
    release = Release(version="1.0.0", rollout=Rollout(share_ppm=PPM, salt="s"),
                      artifacts=[art])
    seen = set()
    for i in range(40):
        device = DeviceProfile(f"d{i}", "onnx")
        ((member, chosen),) = members(release, device, ("onnx",))
        c = cohort_of("clf", device.device_id, 4)
        assert chosen.sha256 == member.sha256 == sha(100 + c)
        assert chosen.length == 10 + c and chosen.patches[0].from_sha256 == sha(200 + c)
        assert chosen.cohorts is None
        seen.add(c)
    assert seen == {0, 1, 2, 3}
    plain = Artifact(platform="onnx", variant="", format="onnx", url="a", length=1,
                     sha256=sha(1))
    assert plain.for_device("d1") is plain  # not watermarked: nothing changes


@pytest.mark.parametrize("cohorts", [{"salt": "x", "artifacts": []},
                                     {"artifacts": [{"url": "u", "length": 1, "sha256": "0"}]},
                                     {"salt": "x", "artifacts": [{"url": "u", "length": -1,
                                                                  "sha256": "0" * 64}]}])
def test_malformed_cohorts_are_refused(cohorts):
    doc = watermarked().to_dict()
    doc["cohorts"] = cohorts
    with pytest.raises(MalformedError):
        Artifact.from_dict(doc)
