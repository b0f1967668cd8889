"""Delta patch creation: bsdiff4 (any file) and the tensor-aware mfdelta1.

Publishing/job code calls :func:`make_patches` (per new artifact, the last K bases) or
:func:`choose_best` (one base); both verify every patch with the SDK's ``apply_patch``
before returning it. The mfdelta1 byte format is specified in ``docs/delta.md``.
"""

from server.delta.errors import DeltaError, DeltaInputError
from server.delta.mfdelta1 import create_mfdelta1
from server.delta.select import CREATORS, DeltaPolicy, PatchResult, choose_best, make_patches

__all__ = [
    "CREATORS",
    "DeltaError",
    "DeltaInputError",
    "DeltaPolicy",
    "PatchResult",
    "choose_best",
    "create_mfdelta1",
    "make_patches",
]
