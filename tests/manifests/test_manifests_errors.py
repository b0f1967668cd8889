"""The error tree: one base, a subclass per failure, each with a fix for humans."""

from __future__ import annotations

import manifests
from manifests import ManifestError, SignatureError

LEAVES = ["MalformedError", "OversizeError", "SignatureError", "WrongTypeError",
          "WrongChannelError", "RollbackError", "EquivocationError", "ExpiredError",
          "RootRotationError"]


def test_every_failure_has_its_own_subclass_with_a_hint() -> None:
    classes = [getattr(manifests, name) for name in LEAVES]
    assert len(set(classes)) == len(LEAVES)
    for cls in classes:
        assert issubclass(cls, ManifestError) and cls is not ManifestError
        assert cls.hint, cls
        # Leaves are siblings: catching one never swallows another.
        assert not any(issubclass(cls, other) for other in classes if other is not cls)


def test_diagnostics_adds_the_fix_on_its_own_line() -> None:
    e = SignatureError("0 valid signature(s) from trusted keys, threshold is 1")
    assert str(e) == "0 valid signature(s) from trusted keys, threshold is 1"
    assert e.diagnostics().splitlines() == [str(e), f"  fix: {SignatureError.hint}"]
    custom = SignatureError("x", hint="rotate the keys")
    assert custom.diagnostics().endswith("fix: rotate the keys")
    assert SignatureError.hint != "rotate the keys"  # per instance, not per class
