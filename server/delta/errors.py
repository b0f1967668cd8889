"""Errors of patch creation (``server.delta``): one base, one subclass per caller action.

    DeltaError
     └── DeltaInputError   an input is missing, over the size cap, or not what it claims
                           (fix the input or the policy; the artifact can still ship in full)

A created patch that fails verification is not an error here: it is logged and dropped.
"""

from __future__ import annotations


class DeltaError(Exception):
    """Patch creation failed."""


class DeltaInputError(DeltaError):
    """An input artifact is unreadable, too large, or does not match its sha256."""
