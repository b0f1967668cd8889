"""The rollouts area's error tree: one base, one subclass per failure a caller can act on.

    RolloutError (ServiceError)                 base
    ├── ChannelExistsError       409  a channel of that name exists already
    ├── RolloutNotFoundError     404  no such rollout
    ├── VersionNotFoundError     404  no such model or model version
    ├── VersionNotReadyError     409  the version has no ready artifacts yet
    ├── InvalidRolloutError      422  a request that can never succeed as written (percentage
    │                                 outside 0–100 or finer than 1 ppm, unknown platform …)
    ├── RolloutStateError        409  not allowed in the rollout's current state (ramping a
    │                                 halted release, resuming one that is not paused …)
    └── RolloutExistsError       409  this version already has a rollout on the channel

A channel that does not exist is the publisher's ChannelNotFoundError (server/publish/errors.py):
it is where the channel is looked up. Subclassing server.errors.ServiceError gives each its
HTTP status through the API's one error table.
"""

from __future__ import annotations

from server.errors import ServiceError


class RolloutError(ServiceError):
    """Base of every error raised by server.rollouts."""


class ChannelExistsError(RolloutError):
    status_code = 409
    code = "channel_exists"


class RolloutNotFoundError(RolloutError):
    status_code = 404
    code = "rollout_not_found"


class VersionNotFoundError(RolloutError):
    status_code = 404
    code = "version_not_found"


class VersionNotReadyError(RolloutError):
    """The model version exists but has nothing ready to publish."""

    status_code = 409
    code = "version_not_ready"


class InvalidRolloutError(RolloutError):
    """The rollout request is invalid in itself (values, filters)."""

    status_code = 422
    code = "invalid_rollout"


class RolloutStateError(RolloutError):
    """The change is not allowed in the rollout's current state."""

    status_code = 409
    code = "invalid_rollout_state"


class RolloutExistsError(RolloutError):
    status_code = 409
    code = "rollout_exists"
