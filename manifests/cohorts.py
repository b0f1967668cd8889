"""The watermark cohort rule: which of a release's N cohorts a device belongs to (issue 23).
Pure and portable, like the rollout bucket (manifests/rollout.py):

    cohort = first 8 bytes of sha256(UTF-8 of "cohort:" + salt + ":" + device_id),
             big-endian, mod N

The "cohort:" prefix keeps it independent of the rollout bucket of the same salt, so a
cohort is not a slice of the rollout share. Test vectors: manifests/vectors/cohorts.json.
"""

from __future__ import annotations

import hashlib

MAX_COHORTS = 4096


def cohort_of(salt: str, device_id: str, cohorts: int) -> int:
    """The device's cohort in [0, cohorts) for a release with this salt."""
    if not 1 <= cohorts <= MAX_COHORTS:
        raise ValueError(f"cohorts must be 1..{MAX_COHORTS}, not {cohorts}")
    digest = hashlib.sha256(f"cohort:{salt}:{device_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % cohorts
