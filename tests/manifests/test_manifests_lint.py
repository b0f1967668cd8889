"""Publisher-side lint: valid manifests that probably do not do what was meant."""

from __future__ import annotations

from dataclasses import replace

from manifests import Filters, Patch, lint_manifest
from tests.manifests.manifest_builders import make_manifest, make_release, sha


def _codes(manifest) -> list[str]:
    return [f.code for f in lint_manifest(manifest)]


def test_a_newer_release_over_a_full_active_fallback_is_clean() -> None:
    fallback = make_release("1.0")
    fallback = replace(fallback, rollout=replace(fallback.rollout, mode="active", shadow=None))
    assert lint_manifest(make_manifest(releases=[make_release("2.0", 100_000), fallback])) == []


def test_missing_fallback_is_reported() -> None:
    findings = lint_manifest(make_manifest(releases=[make_release("2.0", 100_000)]))
    assert [f.code for f in findings] == ["no-fallback"]
    assert "detector@2.0: no-fallback" in str(findings[0])
    filtered = make_release("1.0", filters=Filters(os_versions=[">=14"]))
    filtered = replace(filtered, rollout=replace(filtered.rollout, mode="active", shadow=None))
    assert _codes(make_manifest(releases=[filtered])) == ["no-fallback"]


def test_release_problems_are_reported() -> None:
    rel = make_release("1.0", platforms=["android"])
    rel = replace(rel, rollout=replace(rel.rollout, mode="active", shadow=None))
    generic = rel.artifacts[0]
    specific = replace(generic, variant="qnn", target={"soc": "sm8650"})
    self_patch = replace(generic, variant="p",
                         patches=[Patch(generic.sha256, "u", 1, sha("x"), "bsdiff4")])
    broken = replace(rel, artifacts=[generic, specific, self_patch])
    empty = replace(rel, version="0.9", artifacts=[])
    codes = _codes(make_manifest(releases=[broken, empty]))
    assert codes == ["shadowed-artifact", "shadowed-artifact", "self-patch", "no-artifacts",
                     "salt-reused"]
    # Specific before generic is the right order: nothing shadowed.
    assert _codes(make_manifest(releases=[replace(rel, artifacts=[specific, generic])])) == []
