"""The client SDK's typed errors: one base class, one subclass per failure a caller can act on.

    ClientSDKError                    base; ``str(e)`` says what went wrong and how to fix it
    ├── ConfigError                   the UpdaterConfig / arguments are unusable (fix the caller)
    ├── FetchError                    network or HTTP failure (transient: retry later, backoff)
    │   └── DeadlineExceededError     the overall update deadline passed (slow server)
    ├── OversizeError                 a response exceeded its cap (endless-data attack)
    ├── TrustError                    a root or manifest failed verification (security failure)
    │   └── MetadataExpiredError      the trusted root or the manifest is past its expiry
    ├── IntegrityError                a download's length or sha256 differs from the manifest
    ├── PatchFailedError              a patch could not be applied (the updater falls back to full)
    ├── InstallError                  the bundle store on disk could not be written or read
    ├── TelemetryError                the server refused the device's enrolment or reports
    ├── ProtectionError               a protected release cannot be opened here
    │   ├── ContentKeyError           the server gave no content key (not enrolled, revoked,
    │   │                             not offered the release) or it did not open
    │   └── LocalKeyError             the device-local key is missing or does not open a file
    └── RuntimeSDKError               inference-side failures
        ├── ModelNotLoadedError       no active bundle for that model (nothing installed yet)
        ├── BackendUnavailableError   the backend cannot run here (e.g. Core ML off macOS)
        └── BackendError              a backend failed while predicting (circuit breaker input)

Third-party errors are translated where they enter (``raise X from e``).
"""

from __future__ import annotations


class ClientSDKError(Exception):
    """Base class of every error the client SDK raises on purpose."""


class ConfigError(ClientSDKError):
    """The configuration or an argument is invalid; the message names the field."""


class FetchError(ClientSDKError):
    """A network or HTTP failure; retry later (the updater backs off exponentially)."""


class DeadlineExceededError(FetchError):
    """The overall update deadline passed before the data arrived (slow or stalled server)."""


class OversizeError(ClientSDKError):
    """A response was longer than its declared length or configured cap (endless data)."""


class TrustError(ClientSDKError):
    """A root or manifest failed verification; nothing was trusted or installed.

    ``kind`` is the name of the underlying ``manifests`` error class (e.g. ``RollbackError``)
    so apps and telemetry can tell attacks apart without parsing messages.
    """

    def __init__(self, message: str, kind: str = "TrustError") -> None:
        super().__init__(message)
        self.kind = kind


class MetadataExpiredError(TrustError):
    """The trusted root or the channel manifest has expired (a freeze attack, or a server that
    stopped re-signing): nothing newer is trusted until the server publishes fresh metadata.

    ``kind`` stays ``"ExpiredError"`` (the ``manifests`` name) for callers that compare kinds.
    """

    def __init__(self, message: str, kind: str = "ExpiredError") -> None:
        super().__init__(message, kind)


class IntegrityError(ClientSDKError):
    """Downloaded bytes do not match the signed length or sha256 (tampered or corrupted)."""


class PatchFailedError(ClientSDKError):
    """A delta patch could not be applied or produced the wrong bytes."""


class InstallError(ClientSDKError):
    """The on-disk bundle store could not be written or is inconsistent."""


class TelemetryError(ClientSDKError):
    """The server refused the device's enrolment or reports; the message says why."""


class ProtectionError(ClientSDKError):
    """A protected release cannot be opened on this device (docs/security.md)."""


class ContentKeyError(ProtectionError):
    """The server gave this device no content key for the release, or it did not open."""


class LocalKeyError(ProtectionError):
    """The device-local key (``KeyStore``) is missing or does not open a stored file."""


class RuntimeSDKError(ClientSDKError):
    """Base of the inference-side errors raised by ModelRuntime."""


class ModelNotLoadedError(RuntimeSDKError):
    """No bundle is active for the requested model; run an update first."""


class BackendUnavailableError(RuntimeSDKError):
    """The backend cannot run on this machine (missing library, wrong OS)."""


class BackendError(RuntimeSDKError):
    """A backend failed during inference."""
