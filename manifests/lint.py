"""Publisher-side sanity checks of a well-formed manifest: valid, but probably not what was meant.

The parser enforces the contract; these findings are about intent (a model with no fallback
release, a build that can never be picked). The server runs them before signing and shows
them in dry runs; clients never need them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .manifest import PPM, Manifest, Release


@dataclass(frozen=True)
class LintFinding:
    """One suspicious spot: a stable ``code``, where it is, and what to do."""

    code: str
    model: str
    release: str
    message: str

    def __str__(self) -> str:
        where = f"{self.model}@{self.release}" if self.release else self.model
        return f"{where}: {self.code}: {self.message}"


def _reaches_everyone(release: Release) -> bool:
    f = release.rollout.filters
    attribute_filters = f.platforms or f.socs or f.archs or f.os_versions or f.app_versions
    return (release.rollout.share_ppm == PPM and release.rollout.mode == "active"
            and not attribute_filters and not f.device_deny)


def _lint_release(model: str, rel: Release, salts: dict[str, str]) -> list[LintFinding]:
    out: list[LintFinding] = []

    def add(code: str, message: str) -> None:
        out.append(LintFinding(code, model, rel.version, message))

    if not rel.artifacts:
        add("no-artifacts", "the release has no artifacts, so no device can select it")
    seen: list[tuple[str, str, str]] = []
    for art in rel.artifacts:
        soc, arch = art.target.get("soc", ""), art.target.get("arch", "")
        if any(p == art.platform and s in ("", soc) and a in ("", arch) for p, s, a in seen):
            add("shadowed-artifact",
                f"artifact {art.platform}/{art.variant} is never picked: an earlier artifact "
                "matches the same devices; list specific builds first")
        seen.append((art.platform, soc, arch))
        if any(p.from_sha256 == art.sha256 for p in art.patches):
            add("self-patch", f"artifact {art.platform}/{art.variant} has a patch from itself")
    if rel.rollout.salt in salts:
        add("salt-reused", f"same salt as release {salts[rel.rollout.salt]}: both reach the "
                           "same devices first; give each release its own salt")
    salts.setdefault(rel.rollout.salt, rel.version)
    return out


def lint_manifest(manifest: Manifest) -> list[LintFinding]:
    """Findings in document order; an empty list means nothing looked wrong.

    Codes: ``no-fallback`` (the last release of a model does not reach every device in active
    mode, so devices outside the newer cohorts — and every device after a halt — get nothing),
    ``no-artifacts``, ``shadowed-artifact`` (an earlier artifact of the release matches every
    device this one matches, so it is never picked), ``salt-reused`` (two releases of a model
    share a salt, so their cohorts are the same devices), ``self-patch`` (a patch from the
    artifact to itself).
    """
    findings: list[LintFinding] = []
    for model, entry in manifest.models.items():
        salts: dict[str, str] = {}
        for rel in entry.releases:
            findings.extend(_lint_release(model, rel, salts))
        if entry.releases and not _reaches_everyone(entry.releases[-1]):
            findings.append(LintFinding(
                "no-fallback", model, entry.releases[-1].version,
                "the last release does not reach every device in active mode (share 1000000, "
                "no attribute filters or deny-list); keep the previous fully rolled-out release "
                "last so every device has something to run"))
    return findings
