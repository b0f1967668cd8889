"""What a device's hardware runs, and what an artifact needs of it (manifest spec §9.6).

An artifact may list ``requires``: capability names its hardware must have. Today's names are
the Hexagon HTP's: ``htp_int8`` (every HTP generation) and ``htp_fp16`` (generations v69 and
newer; v68 and older run FP16 graphs only through slow fallbacks). A device's capabilities
follow from its ``arch`` (``"v75"``), best first: an HTP with FP16 prefers the FP16 artifact
(no quantization loss), one without takes the INT8 one. An arch that names no HTP
generation has no known capabilities: nothing is filtered for it, as before ``requires``.
Pure: no I/O.
"""

from __future__ import annotations

import re

from .manifest import Artifact
from .rollout import DeviceProfile

HTP_INT8 = "htp_int8"
HTP_FP16 = "htp_fp16"
HTP_FP16_SINCE = 69  # first HTP generation with native FP16 (QNN SDK, HTP backend)
_HTP_ARCH = re.compile(r"v([0-9]{2,3})")


def htp_generation(arch: str) -> int | None:
    """73 for "v73" (or "73"); None when ``arch`` names no HTP generation."""
    m = _HTP_ARCH.fullmatch(arch) or re.fullmatch(r"([0-9]{2,3})", arch)
    return int(m.group(1)) if m else None


def device_capabilities(device: DeviceProfile) -> tuple[str, ...] | None:
    """The device's capabilities, best first, or None when its hardware is unknown."""
    gen = htp_generation(device.arch)
    if gen is None:
        return None
    return (HTP_FP16, HTP_INT8) if gen >= HTP_FP16_SINCE else (HTP_INT8,)


def runs_on(artifact: Artifact, capabilities: tuple[str, ...] | None) -> bool:
    """True when the device has every capability ``artifact`` requires (unknown hardware:
    always, as before ``requires`` existed)."""
    return capabilities is None or set(artifact.requires) <= set(capabilities)


def preference(artifact: Artifact, capabilities: tuple[str, ...] | None) -> int:
    """Sort key, lower is better: the rank of the best capability the artifact uses; an
    artifact requiring nothing ranks after every one that uses a capability."""
    if not capabilities or not artifact.requires:
        return len(capabilities or ())
    return min(capabilities.index(c) for c in artifact.requires)
