"""Precision per QNN target: each HTP generation gets an artifact at a precision it runs.

A version's qnn targets may name a precision each (`target_precision` = "SM8350=int8,
SM8650=fp16"); a target whose HTP generation has no FP16 (v68 and older, see
manifests/capabilities.py) is built at INT8 unless the version says otherwise, and asking for
FP16 on one is refused with the fix. `split` turns one QNN compile request into one request
per precision (the QNN compiler builds one precision per call), each with its own targets;
a request without per-target precision is returned unchanged. The precision search
(`precision: auto` trying candidates) is not this module's: it only decides what the hardware
forces or the version states.
"""

from __future__ import annotations

from dataclasses import replace

from server.compile.errors import InvalidSourceError
from server.compile.types import CompileRequest

PRECISIONS = ("fp16", "int8")
# First HTP generation with native FP16. The device side reads the same fact from
# manifests/capabilities.py (the sandbox that runs this module has no `manifests`); a test
# keeps the two equal.
HTP_FP16_SINCE = 69


def htp_generation(arch: str) -> int | None:
    """75 for a target's htp_arch "75" (or "v75"); None when it is not a number."""
    digits = arch[1:] if arch[:1] == "v" else arch
    return int(digits) if digits.isdigit() and len(digits) <= 3 else None


def target_precision(target: dict[str, str], version_precision: str) -> str:
    """The precision `target` is built at ("" = the version's own qnn precision)."""
    stated = target.get("precision", "")
    gen = htp_generation(str(target.get("htp_arch", "")))
    no_fp16 = gen is not None and gen < HTP_FP16_SINCE
    name = target.get("name", target.get("soc_model", "?"))
    if stated and stated not in PRECISIONS:
        raise InvalidSourceError(f"qnn target {name}: precision must be fp16 or int8, not "
                                 f"{stated!r}")
    if no_fp16 and (stated or version_precision) == "fp16":
        raise InvalidSourceError(
            f"qnn target {name} (HTP v{gen}) has no FP16: HTP generations before "
            f"v{HTP_FP16_SINCE} run INT8 only. Set target_precision {name}=int8 (with "
            "calibration inputs) or drop the target.")
    if no_fp16 and not stated and version_precision in ("", "auto"):
        return "int8"
    return stated


def split(request: CompileRequest) -> list[CompileRequest]:
    """One request per precision the qnn targets need (unchanged when all share the
    version's)."""
    block = dict(request.settings.get("qnn") or {})
    targets = block.get("targets")
    if not isinstance(targets, list):
        return [request]
    version_precision = str(block.get("precision", "auto"))
    groups: dict[str, list[dict[str, str]]] = {}
    for t in targets:
        p = target_precision(t, version_precision)
        groups.setdefault(p, []).append({k: v for k, v in t.items() if k != "precision"})
    if list(groups) == [""] and not any("precision" in t for t in targets):
        return [request]
    out = []
    for p, group in groups.items():
        sub = {**block, "targets": group, **({"precision": p} if p else {})}
        out.append(replace(request, settings={**request.settings, "qnn": sub}))
    return out
