"""ModelFleet's signed manifest contract: documents, DSSE envelopes, trust rules, rollout rule.

Pure: no I/O, no clock (time is an integer of Unix seconds passed in). Depends only on pynacl
and the standard library. The normative spec is docs/manifest.md; test vectors for other
languages are in manifests/vectors/, JSON Schemas in manifests/schema/.
"""

from .capabilities import device_capabilities, htp_generation, preference, runs_on
from .cohorts import cohort_of
from .compressed import Compressed
from .envelope import (
    MANIFEST_PAYLOAD_TYPE,
    MAX_SIGNATURES,
    ROOT_PAYLOAD_TYPE,
    Envelope,
    Signature,
    pae,
    sign_envelope,
    verify_envelope,
)
from .errors import (
    EquivocationError,
    ExpiredError,
    MalformedError,
    ManifestError,
    OversizeError,
    RollbackError,
    RootRotationError,
    SignatureError,
    WrongChannelError,
    WrongTypeError,
)
from .keys import SigningKey, key_id, verify_signature
from .lint import LintFinding, lint_manifest
from .manifest import (
    PPM,
    Artifact,
    CohortArtifact,
    Cohorts,
    Filters,
    Manifest,
    ModelEntry,
    Patch,
    Release,
    Rollout,
    ShadowThresholds,
)
from .rollout import (
    PORTABLE_PLATFORM,
    DeviceProfile,
    artifact_matches,
    artifacts_for,
    bucket,
    filters_match,
    rollout_includes,
    select_artifact,
    select_release,
)
from .root import RELEASE_ROLE, ROOT_ROLE, PublicKey, Role, Root
from .sealed import Sealed, SealedError
from .strictjson import MAX_SAFE_INTEGER, JSONObject, JSONValue
from .trust import (
    MANIFEST_MAX_SIZE,
    ROOT_MAX_SIZE,
    TrustedManifest,
    load_trusted_root,
    verify_manifest,
    verify_root_update,
)
from .versions import VersionRange, compare_versions, parse_version

__all__ = [
    "MANIFEST_MAX_SIZE",
    "MANIFEST_PAYLOAD_TYPE",
    "MAX_SAFE_INTEGER",
    "MAX_SIGNATURES",
    "PORTABLE_PLATFORM",
    "PPM",
    "RELEASE_ROLE",
    "ROOT_MAX_SIZE",
    "ROOT_PAYLOAD_TYPE",
    "ROOT_ROLE",
    "Artifact",
    "CohortArtifact",
    "Cohorts",
    "Compressed",
    "DeviceProfile",
    "Envelope",
    "EquivocationError",
    "ExpiredError",
    "Filters",
    "JSONObject",
    "JSONValue",
    "LintFinding",
    "MalformedError",
    "Manifest",
    "ManifestError",
    "ModelEntry",
    "OversizeError",
    "Patch",
    "PublicKey",
    "Release",
    "Role",
    "RollbackError",
    "Rollout",
    "Root",
    "RootRotationError",
    "Sealed",
    "SealedError",
    "ShadowThresholds",
    "Signature",
    "SignatureError",
    "SigningKey",
    "TrustedManifest",
    "VersionRange",
    "WrongChannelError",
    "WrongTypeError",
    "artifact_matches",
    "artifacts_for",
    "bucket",
    "cohort_of",
    "compare_versions",
    "device_capabilities",
    "filters_match",
    "htp_generation",
    "key_id",
    "lint_manifest",
    "load_trusted_root",
    "pae",
    "parse_version",
    "preference",
    "rollout_includes",
    "runs_on",
    "select_artifact",
    "select_release",
    "sign_envelope",
    "verify_envelope",
    "verify_manifest",
    "verify_root_update",
    "verify_signature",
]
