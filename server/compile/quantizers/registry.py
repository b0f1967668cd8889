"""The QDQ backends a QNN build may pick (`qnn.quantizer`), by name.

AIMET's three techniques are always listed, so a version that asks for one on a worker
without AIMET gets "not installed" and the fix, not "unknown quantizer".
"""

from __future__ import annotations

from server.compile.quantizers.aimet import TECHNIQUES, AimetQuantizer
from server.compile.quantizers.base import Quantizer
from server.compile.quantizers.ort import OrtQdqQuantizer


def default_quantizers(aimet_python: str = "") -> dict[str, Quantizer]:
    """"ort" plus "aimet", "aimet-adaround", "aimet-seqmse" run by `aimet_python` (the
    deployment's MODELFLEET_AIMET_PYTHON; empty: AIMET reports itself not installed)."""
    aimet = [AimetQuantizer(aimet_python, t) for t in TECHNIQUES]
    return {"ort": OrtQdqQuantizer(), **{q.name: q for q in aimet}}
