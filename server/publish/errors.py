"""The publishing area's error tree: one base, one subclass per failure a caller can act on.

    PublishError (ServiceError)                 base
    ├── KeyStoreError            503  key files missing, unreadable, too open, or already present
    ├── RotationError            409  a root rotation cannot be made (keys missing, threshold)
    ├── ChannelNotFoundError     404  no such channel
    ├── ChannelExistsError       409  a channel of that name exists already
    ├── RolloutNotFoundError     404  no such rollout
    ├── VersionNotFoundError     404  no such model or model version
    ├── VersionNotReadyError     409  the version has no ready artifacts yet
    ├── InvalidRolloutError      422  a request that can never succeed as written (percentage
    │                                 outside 0–100 or finer than 1 ppm, unknown platform …)
    ├── RolloutStateError        409  not allowed in the rollout's current state (ramping a
    │                                 halted release, resuming one that is not paused …)
    ├── RolloutExistsError       409  this version already has a rollout on the channel
    ├── ManifestTooLargeError    409  the channel offers more than devices accept (size cap)
    └── SerialConflictError      503  concurrent publishes kept colliding on the channel serial

Subclassing server.errors.ServiceError gives each its HTTP status through the API's one error
table; the CLI prints `.message` and `.fix`.
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


class ChannelExistsError(PublishError):
    status_code = 409
    code = "channel_exists"


class RolloutNotFoundError(PublishError):
    status_code = 404
    code = "rollout_not_found"


class VersionNotFoundError(PublishError):
    status_code = 404
    code = "version_not_found"


class VersionNotReadyError(PublishError):
    """The model version exists but has nothing ready to publish."""

    status_code = 409
    code = "version_not_ready"


class InvalidRolloutError(PublishError):
    """The rollout request is invalid in itself (values, filters)."""

    status_code = 422
    code = "invalid_rollout"


class RolloutStateError(PublishError):
    """The change is not allowed in the rollout's current state."""

    status_code = 409
    code = "invalid_rollout_state"


class RolloutExistsError(PublishError):
    status_code = 409
    code = "rollout_exists"


class ManifestTooLargeError(PublishError):
    """The signed manifest would exceed the size devices accept."""

    status_code = 409
    code = "manifest_too_large"


class SerialConflictError(PublishError):
    """Publishing lost the race for the next serial too many times in a row."""

    status_code = 503
    code = "serial_conflict"
