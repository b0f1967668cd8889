"""The publishing area's error tree: one base, one subclass per failure a caller can act on.

    PublishError (ServiceError)                 base
    ├── KeyStoreError            503  key files missing, unreadable, too open, or already present
    ├── RotationError            409  a root rotation cannot be made (keys missing, threshold)
    ├── ChannelNotFoundError     404  no such channel
    ├── ManifestTooLargeError    409  the channel offers more than devices accept (size cap)
    └── SerialConflictError      503  concurrent publishes kept colliding on the channel serial

Rollout errors are server/rollouts/errors.py. Subclassing server.errors.ServiceError gives
each its HTTP status through the API's one error table; the CLI prints `.message` and `.fix`.
"""

from __future__ import annotations

from server.errors import ServiceError


class PublishError(ServiceError):
    """Base of every error raised by server.publish."""


class KeyStoreError(PublishError):
    """Signing key files are missing, malformed, world-readable, or would be overwritten."""

    status_code = 503
    code = "signing_keys_unavailable"


class RotationError(PublishError):
    """A root rotation cannot be produced as requested."""

    status_code = 409
    code = "rotation_refused"


class ChannelNotFoundError(PublishError):
    status_code = 404
    code = "channel_not_found"


class ManifestTooLargeError(PublishError):
    """The signed manifest would exceed the size devices accept."""

    status_code = 409
    code = "manifest_too_large"


class SerialConflictError(PublishError):
    """Publishing lost the race for the next serial too many times in a row."""

    status_code = 503
    code = "serial_conflict"
