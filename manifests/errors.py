"""The manifest contract's errors: one base class, one subclass per failure a caller can act on.

::

    ManifestError
    ├── MalformedError      not a well-formed envelope/document (bad JSON, duplicate keys,
    │                       NaN/Infinity, floats, integers beyond ±(2^53-1), missing/ill-typed
    │                       fields)
    ├── OversizeError       input larger than the caller's byte cap (or too many signatures)
    ├── SignatureError      signatures do not reach the threshold of trusted keys
    ├── WrongTypeError      payloadType or document ``type`` is not the expected one
    ├── WrongChannelError   a correctly signed manifest for another channel (mix-and-match)
    ├── RollbackError       serial lower than the one already trusted (replay)
    ├── EquivocationError   same serial as the trusted one, different bytes
    ├── ExpiredError        ``expires`` is not in the future (freeze attack or stale server)
    └── RootRotationError   a root update that is not exactly version N+1

Every message says what went wrong and what to do about it; ``diagnostics()`` adds the hint on
its own line for humans (CLI), ``str()`` stays one line for logs.
"""

from __future__ import annotations


class ManifestError(Exception):
    """Base of every error raised by ``manifests``."""

    hint: str = ""

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        if hint:
            self.hint = hint

    def diagnostics(self) -> str:
        """The message plus how to fix it, for humans."""
        return f"{self}\n  fix: {self.hint}" if self.hint else str(self)


class MalformedError(ManifestError):
    """The bytes are not a well-formed envelope or document."""

    hint = "the publisher produced invalid data; re-publish with a conforming signer"


class OversizeError(ManifestError):
    """The input exceeds a size cap (bytes, or number of signatures)."""

    hint = "refuse the input; if a genuine document is this large, raise the cap deliberately"


class SignatureError(ManifestError):
    """Valid signatures from distinct trusted keys do not reach the threshold."""

    hint = "the data was tampered with or signed by keys this client does not trust; do not use it"


class WrongTypeError(ManifestError):
    """payloadType or the document's ``type`` field is not the one expected here."""

    hint = "a root was offered where a manifest was expected (or vice versa); check the URL"


class WrongChannelError(ManifestError):
    """A correctly signed manifest that belongs to a different channel."""

    hint = "the server returned another channel's manifest; check the channel URL"


class RollbackError(ManifestError):
    """The serial (or version) is lower than the one already trusted: a replay."""

    hint = "keep the trusted manifest; an old signed manifest was served (replay or stale mirror)"


class EquivocationError(ManifestError):
    """Same serial as the trusted manifest but different signed bytes."""

    hint = "the publisher signed two different manifests with one serial; keep the trusted one"


class ExpiredError(ManifestError):
    """The document's ``expires`` time is not in the future."""

    hint = "the server must re-sign before expiry; keep the trusted state and retry later"


class RootRotationError(ManifestError):
    """A root update that breaks the rotation rules (version must be exactly N+1)."""

    hint = "fetch root versions in order, one at a time: N+1, N+2, ..."
