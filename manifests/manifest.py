"""The ``manifest`` document: what one channel offers, per model, per platform, to whom.

JSON (payloadType ``application/vnd.modelfleet.manifest+json``)::

    {"type": "manifest", "channel": "prod", "serial": 7, "expires": 1767225600,
     "models": {"<model>": {"releases": [<release>, ...]}}}

    release  = {"version", "rollout": <rollout>, "artifacts": [<artifact>, ...],
                "failed_platforms": [str, ...]}               (optional; absent = none)
    artifact = {"platform", "variant", "format", "url", "length", "sha256",
                "compile_settings": {str: str|int|bool}, "target": {str: str},
                "patches": [{"from_sha256", "url", "length", "sha256", "algorithm"}],
                "requires": [str, ...],        (optional; absent = nothing beyond the target)
                "compressed": {"codec", "url", "length", "sha256"}}  (optional; compressed.py)
    rollout  = {"share_ppm", "salt", "mode": "active"|"shadow", "filters": <filters>,
                "shadow": {"max_kl_micro", "max_latency_p99_us", "min_samples"} | null}
    filters  = {"platforms", "socs", "archs", "os_versions", "app_versions",
                "device_allow", "device_deny"}            (lists of strings; empty = any)

Every object keeps unknown fields in ``extra`` and writes them back unchanged.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import ClassVar, Literal, cast

from . import strictjson
from ._fields import Fields, is_name, merge_extra, nonempty_string_item, string_item
from .cohorts import MAX_COHORTS, cohort_of
from .compressed import Compressed, optional_compressed
from .errors import MalformedError, WrongTypeError
from .sealed import Sealed
from .strictjson import JSONObject, JSONValue
from .versions import VersionRange

PPM = 1_000_000
Mode = Literal["active", "shadow"]
SettingValue = str | int | bool


@dataclass(frozen=True)
class Patch:
    """A delta from the artifact whose sha256 is ``from_sha256`` to this artifact."""

    from_sha256: str
    url: str
    length: int
    sha256: str
    algorithm: str
    extra: JSONObject = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: JSONValue, path: str = "patch") -> Patch:
        f = Fields(value, path)
        return cls(f.sha256("from_sha256"), f.url("url"), f.integer("length"),
                   f.sha256("sha256"), f.name("algorithm"), f.extra())

    def to_dict(self) -> JSONObject:
        return merge_extra({"from_sha256": self.from_sha256, "url": self.url,
                            "length": self.length, "sha256": self.sha256,
                            "algorithm": self.algorithm}, self.extra)


def _capability(value: JSONValue, path: str) -> str:
    text = string_item(value, path)
    if not is_name(text):
        raise MalformedError(f"{path} must be a name (letters, digits, . _ + -)")
    return text


def _sealed(f: Fields, path: str) -> Sealed | None:
    raw = f.optional_object("sealed")
    return None if raw is None else Sealed.from_dict(raw, f"{path}.sealed")


@dataclass(frozen=True)
class CohortArtifact:
    """One watermark cohort's copy of an artifact: its own bytes, seal and patches."""

    url: str
    length: int
    sha256: str
    patches: list[Patch] = field(default_factory=list)
    sealed: Sealed | None = None
    extra: JSONObject = field(default_factory=dict)
    compressed: Compressed | None = None  # this cohort's compressed copy (written when set)

    @classmethod
    def from_dict(cls, value: JSONValue, path: str = "cohort") -> CohortArtifact:
        f = Fields(value, path)
        return cls(url=f.url("url"), length=f.integer("length"), sha256=f.sha256("sha256"),
                   patches=f.array("patches", Patch.from_dict, required=False),
                   sealed=_sealed(f, path), compressed=optional_compressed(f, path),
                   extra=f.extra())

    def to_dict(self) -> JSONObject:
        patches: list[JSONValue] = [p.to_dict() for p in self.patches]
        known: JSONObject = {"url": self.url, "length": self.length, "sha256": self.sha256,
                             "patches": patches}
        if self.sealed is not None:
            known["sealed"] = self.sealed.to_dict()
        if self.compressed is not None:
            known["compressed"] = self.compressed.to_dict()
        return merge_extra(known, self.extra)


@dataclass(frozen=True)
class Cohorts:
    """A watermarked artifact's per-cohort copies (issue 23): a device takes
    ``artifacts[cohort_of(salt, device_id, len(artifacts))]`` (manifests/cohorts.py) instead
    of the artifact's own url. Additive: an SDK that predates it ignores the field and takes
    the artifact's url, which is cohort 0's copy."""

    salt: str
    artifacts: list[CohortArtifact]
    extra: JSONObject = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: JSONValue, path: str = "cohorts") -> Cohorts:
        f = Fields(value, path)
        salt = f.string("salt", max_len=256)
        artifacts = f.array("artifacts", CohortArtifact.from_dict, max_items=MAX_COHORTS)
        if not artifacts:
            raise f.fail("artifacts", "must list at least one cohort")
        return cls(salt, artifacts, f.extra())

    def to_dict(self) -> JSONObject:
        artifacts: list[JSONValue] = [a.to_dict() for a in self.artifacts]
        return merge_extra({"salt": self.salt, "artifacts": artifacts}, self.extra)


def _setting(value: JSONValue, path: str) -> SettingValue:
    if not isinstance(value, (str, int, bool)):
        raise MalformedError(f"{path} must be a string, integer or boolean")
    return value


@dataclass(frozen=True)
class Artifact:
    """One compiled model file for one platform (and optionally one SoC / arch)."""

    platform: str
    variant: str
    format: str
    url: str
    length: int
    sha256: str
    compile_settings: dict[str, SettingValue] = field(default_factory=dict)
    target: dict[str, str] = field(default_factory=dict)
    patches: list[Patch] = field(default_factory=list)
    extra: JSONObject = field(default_factory=dict)
    # A protected release's artifact (manifests/sealed.py): url, length and sha256 are the
    # sealed bytes'; this names the plaintext. Written only when set.
    sealed: Sealed | None = None
    # Capabilities the device's hardware must have (manifests/capabilities.py), e.g.
    # ["htp_fp16"]. Written only when set, so old documents and old clients are unchanged.
    requires: list[str] = field(default_factory=list)
    # A watermarked release's per-cohort copies (written only when set).
    cohorts: Cohorts | None = None
    # A compressed copy a newer SDK may download instead (manifests/compressed.py); url,
    # length and sha256 above stay the content's. Written only when set.
    compressed: Compressed | None = None

    @classmethod
    def from_dict(cls, value: JSONValue, path: str = "artifact") -> Artifact:
        f = Fields(value, path)
        sealed = _sealed(f, path)
        raw_cohorts = f.optional_object("cohorts")
        cohorts = None if raw_cohorts is None else Cohorts.from_dict(raw_cohorts,
                                                                     f"{path}.cohorts")
        return cls(
            platform=f.name("platform"),
            variant=f.name("variant", allow_empty=True),
            format=f.name("format"),
            url=f.url("url"),
            length=f.integer("length"),
            sha256=f.sha256("sha256"),
            compile_settings=f.mapping("compile_settings", _setting, required=False),
            target=f.mapping("target", string_item, required=False),
            patches=f.array("patches", Patch.from_dict, required=False),
            requires=f.array("requires", _capability, required=False, max_items=16),
            compressed=optional_compressed(f, path),
            extra=f.extra(),  # last: the keys no accessor above asked for
            sealed=sealed,
            cohorts=cohorts,
        )

    def to_dict(self) -> JSONObject:
        settings: JSONObject = dict(self.compile_settings)
        target: JSONObject = dict(self.target)
        patches: list[JSONValue] = [p.to_dict() for p in self.patches]
        known: JSONObject = {
            "platform": self.platform, "variant": self.variant, "format": self.format,
            "url": self.url, "length": self.length, "sha256": self.sha256,
            "compile_settings": settings, "target": target, "patches": patches,
        }
        if self.sealed is not None:
            known["sealed"] = self.sealed.to_dict()
        if self.requires:
            known["requires"] = list(self.requires)
        if self.cohorts is not None:
            known["cohorts"] = self.cohorts.to_dict()
        if self.compressed is not None:
            known["compressed"] = self.compressed.to_dict()
        return merge_extra(known, self.extra)

    def for_device(self, device_id: str) -> Artifact:
        """The artifact this device downloads: its cohort's copy when watermarked."""
        if self.cohorts is None:
            return self
        c = self.cohorts.artifacts[cohort_of(self.cohorts.salt, device_id,
                                             len(self.cohorts.artifacts))]
        return replace(self, url=c.url, length=c.length, sha256=c.sha256,
                       patches=list(c.patches), sealed=c.sealed, cohorts=None,
                       compressed=c.compressed)

    def patch_from(self, base_sha256: str) -> Patch | None:
        """The first patch that applies to a local file with hash ``base_sha256``, if any."""
        return next((p for p in self.patches if p.from_sha256 == base_sha256), None)


@dataclass(frozen=True)
class ShadowThresholds:
    """Limits for shadow mode, integers only: KL divergence × 10^6 and p99 latency in µs."""

    max_kl_micro: int
    max_latency_p99_us: int
    min_samples: int
    extra: JSONObject = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: JSONValue, path: str = "shadow") -> ShadowThresholds:
        f = Fields(value, path)
        return cls(f.integer("max_kl_micro"), f.integer("max_latency_p99_us"),
                   f.integer("min_samples"), f.extra())

    def to_dict(self) -> JSONObject:
        return merge_extra({"max_kl_micro": self.max_kl_micro,
                            "max_latency_p99_us": self.max_latency_p99_us,
                            "min_samples": self.min_samples}, self.extra)


def _range_item(value: JSONValue, path: str) -> str:
    text = nonempty_string_item(value, path)
    try:
        VersionRange.parse(text)
    except MalformedError as e:
        raise MalformedError(f"{path}: {e}") from None
    return text


@dataclass(frozen=True)
class Filters:
    """Who may receive a release. Each empty list means "any"; see ``rollout.rollout_includes``."""

    platforms: list[str] = field(default_factory=list)
    socs: list[str] = field(default_factory=list)
    archs: list[str] = field(default_factory=list)
    os_versions: list[str] = field(default_factory=list)
    app_versions: list[str] = field(default_factory=list)
    device_allow: list[str] = field(default_factory=list)
    device_deny: list[str] = field(default_factory=list)
    extra: JSONObject = field(default_factory=dict)

    LISTS: ClassVar[tuple[str, ...]] = (
        "platforms", "socs", "archs", "os_versions", "app_versions", "device_allow", "device_deny",
    )

    @classmethod
    def from_dict(cls, value: JSONValue, path: str = "filters") -> Filters:
        f = Fields(value, path)
        lists = {
            name: f.array(name, _range_item if name.endswith("_versions")
                          else nonempty_string_item, required=False)
            for name in cls.LISTS
        }
        return cls(**lists, extra=f.extra())

    def to_dict(self) -> JSONObject:
        known: JSONObject = {name: list(getattr(self, name)) for name in self.LISTS}
        return merge_extra(known, self.extra)


@dataclass(frozen=True)
class Rollout:
    """Share of the fleet (parts per million), its salt, mode and filters."""

    share_ppm: int
    salt: str
    mode: Mode = "active"
    filters: Filters = field(default_factory=Filters)
    shadow: ShadowThresholds | None = None
    extra: JSONObject = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: JSONValue, path: str = "rollout") -> Rollout:
        f = Fields(value, path)
        share = f.integer("share_ppm", maximum=PPM)
        salt = f.string("salt", max_len=256)
        mode = cast(Mode, f.literal("mode", ("active", "shadow")))
        raw_filters = f.optional_object("filters")
        filters = (Filters() if raw_filters is None
                   else Filters.from_dict(raw_filters, f"{path}.filters"))
        raw_shadow = f.optional_object("shadow")
        shadow = (None if raw_shadow is None
                  else ShadowThresholds.from_dict(raw_shadow, f"{path}.shadow"))
        if mode == "shadow" and shadow is None:
            raise f.fail("shadow", "is required when mode is 'shadow' (the limits that halt it)")
        return cls(share, salt, mode, filters, shadow, f.extra())

    def to_dict(self) -> JSONObject:
        return merge_extra({
            "share_ppm": self.share_ppm, "salt": self.salt, "mode": self.mode,
            "filters": self.filters.to_dict(),
            "shadow": None if self.shadow is None else self.shadow.to_dict(),
        }, self.extra)


@dataclass(frozen=True)
class Release:
    """One version of a model that devices may pick, with its rollout and artifacts."""

    version: str
    rollout: Rollout
    artifacts: list[Artifact]
    extra: JSONObject = field(default_factory=dict)
    # Platforms whose build failed and that the release engineer released anyway: their
    # devices run the portable ONNX artifact (``rollout.artifacts_for``). Written only when
    # non-empty, so releases without it serialize exactly as before.
    failed_platforms: list[str] = field(default_factory=list)

    @classmethod
    def from_dict(cls, value: JSONValue, path: str = "release") -> Release:
        f = Fields(value, path)
        version = f.name("version")
        raw_rollout = f.optional_object("rollout")
        if raw_rollout is None:
            raise f.fail("rollout", "is required")
        rollout = Rollout.from_dict(raw_rollout, f"{path}.rollout")
        artifacts = f.array("artifacts", Artifact.from_dict)
        failed = f.array("failed_platforms", nonempty_string_item, required=False)
        return cls(version, rollout, artifacts, f.extra(), failed)

    def to_dict(self) -> JSONObject:
        artifacts: list[JSONValue] = [a.to_dict() for a in self.artifacts]
        known: JSONObject = {"version": self.version, "rollout": self.rollout.to_dict(),
                             "artifacts": artifacts}
        if self.failed_platforms:
            known["failed_platforms"] = list(self.failed_platforms)
        return merge_extra(known, self.extra)


@dataclass(frozen=True)
class ModelEntry:
    """The releases of one model, in the order devices try them (newest first, fallback last)."""

    releases: list[Release]
    extra: JSONObject = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: JSONValue, path: str = "model") -> ModelEntry:
        f = Fields(value, path)
        releases = f.array("releases", Release.from_dict)
        versions = [r.version for r in releases]
        if len(set(versions)) != len(versions):
            raise f.fail("releases", "lists one version twice")
        return cls(releases, f.extra())

    def to_dict(self) -> JSONObject:
        releases: list[JSONValue] = [r.to_dict() for r in self.releases]
        return merge_extra({"releases": releases}, self.extra)


@dataclass(frozen=True)
class Manifest:
    """One channel's signed offer. ``raw_sha256`` is set on documents parsed from bytes."""

    channel: str
    serial: int
    expires: int
    models: dict[str, ModelEntry]
    extra: JSONObject = field(default_factory=dict)
    raw_sha256: str | None = field(default=None, compare=False)

    TYPE: ClassVar[str] = "manifest"

    def is_expired(self, now: int) -> bool:
        return now >= self.expires

    @classmethod
    def from_dict(cls, value: JSONValue) -> Manifest:
        f = Fields(value, "manifest")
        doc_type = f.string("type", max_len=1 << 30, allow_empty=True)  # other: WrongType
        if doc_type != cls.TYPE:
            raise WrongTypeError(f"document type is {doc_type[:40]!r}, expected 'manifest'")
        channel = f.name("channel")
        serial = f.integer("serial", minimum=1)
        expires = f.integer("expires")
        models = f.mapping("models", ModelEntry.from_dict, key_check=is_name,
                           key_rule="a name (letters, digits, . _ + -)")
        return cls(channel, serial, expires, models, f.extra())

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Parse (not verify) manifest JSON bytes; sets ``raw_sha256``."""
        manifest = cls.from_dict(strictjson.loads(data, what="manifest"))
        return replace(manifest, raw_sha256=hashlib.sha256(data).hexdigest())

    def to_dict(self) -> JSONObject:
        return merge_extra({
            "type": self.TYPE, "channel": self.channel, "serial": self.serial,
            "expires": self.expires,
            "models": {k: v.to_dict() for k, v in self.models.items()},
        }, self.extra)

    def to_bytes(self) -> bytes:
        """Serialized for signing; refuses (MalformedError) a document no verifier would accept."""
        data = strictjson.dumps(self.to_dict())
        Manifest.from_bytes(data)
        return data
