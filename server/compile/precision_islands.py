"""QNN's answer when the HTP's FP16 loses a model at a node: keep that node (the smallest region
needed) at FP32 on the device's CPU EP inside the same artifact (server/compile/qnn_islands.py),
chosen from the numeric gate's evidence — the analogue of Core ML's FP32 default
(server/compile/fp32_default.py), for a target that has no FP32 of its own.

The retry is taken only when the FP16 build failed its numeric gate, the faithful layer walk
names the node where agreement is first lost, and the precision diagnosis says FP16 is the
cause there:
- **underflow / overflow**: the source at FP16 storage itself holds an infinity or NaN (its
  SNR against FP32 is -inf) — FP16 cannot hold the values — and the FP32 source's tensors
  feeding the named node (or its own output) lie outside FP16's normal range. The island is
  the named node plus its producers, upstream, as long as their outputs are such tensors
  (`MAX_REGION` nodes at most): the region FP16 cannot represent.
- **arithmetic**: FP16 storage alone keeps the model (the source at FP16 passes the faithful
  thresholds against FP32) yet the HTP loses it at the named node, whose output still agrees
  at cosine >= `ARITHMETIC_MIN_COSINE`, with an error shaped like rounding noise
  (`noise_like`: its cosine and SNR agree as uncorrelated noise's do): a precision loss
  accumulated in the HTP's FP16 arithmetic (an LSTM's 160 steps), not a wrong result. The
  island is that node.
A compile bug — a node whose HTP output is far from the FP16 source's (cosine below the bound),
or off systematically (a scaled weight: cosine 1.0 at 10 dB) while FP16 storage is fine —
matches neither, so it fails as before, never masked. An island build that does not pass
leaves the HTP-only build's failure (its layer walk) as the outcome, with the island's.

Bounded: one extra compile per failing region, at most `MAX_ROUNDS` regions. It is 1: a
second region would have to come from the island build's own layer walk, and an island
artifact (several context binaries) exposes no intermediate tensors to it, so a second guess
would be blind — the island build's failure is reported instead, naming the island. The
island's share of the graph is capped by the compiler (`ISLAND_MIN_HTP_SHARE`). A version
turns it off with the qnn setting `precision_islands: off`, or names its own islands with
`fp32_nodes` (then no automatic retry).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from server.compile.compilers.base import settings_for
from server.compile.types import CompileRequest

MAX_ROUNDS = 1
MAX_REGION = 12  # nodes in one underflow region
ARITHMETIC_MIN_COSINE = 0.99
FP16_MIN_NORMAL = 2.0 ** -14  # below it FP16 is subnormal, and the HTP flushes to zero
FP16_MAX = 65504.0
LOST_SHARE = 0.01  # a tensor is "outside FP16" when this share of its nonzero values is


@dataclass(frozen=True)
class Finding:
    kind: str  # "underflow" | "arithmetic"
    node: str  # where the faithful walk first lost agreement
    region: tuple[str, ...]
    why: str
    request: CompileRequest  # the same build with the region added to fp32_nodes


def enabled(request: CompileRequest, platform: str) -> bool:
    opts = settings_for(request, platform)
    value = str(opts.get("precision_islands", "auto")).lower()
    if value not in ("auto", "off"):
        from server.compile.errors import InvalidSourceError

        raise InvalidSourceError(f"qnn precision_islands must be auto or off, not {value!r}")
    return platform == "qnn" and value == "auto" and str(
        opts.get("precision", "default")) in ("default", "fp16")


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def diagnose(platform: str, request: CompileRequest, outcomes: list[Any], islands: tuple[str, ...],
             feeds: dict[str, Any]) -> Finding | None:
    """The next island for a failed FP16 QNN build, or None when the evidence does not say
    FP16 is the cause (or there is nothing left to try)."""
    if len(outcomes) != 1 or not enabled(request, platform):
        return None
    o = outcomes[0]
    num = o.gates.get("numeric") or {}
    if o.state != "failed" or o.precision != "fp16" or num.get("status") != "failed":
        return None
    first = ((num.get("layers") or {}).get("faithful") or {}).get("first_below") or {}
    node = str(first.get("node") or "")
    cost = num.get("precision_cost") or {}
    snrs = [_num(r.get("snr_db")) for r in cost.get("outputs") or []]
    if not node or not snrs or node in islands:
        return None
    assert request.onnx_path is not None
    if any(not math.isfinite(s) for s in snrs):
        region = underflow_region(request.onnx_path, node, feeds)
        if not region:
            return None
        kind = "underflow"
        why = (f"FP16 cannot hold this model's values (the source at FP16 gives SNR -inf "
               f"against FP32) and the HTP build first departs at {first.get('op')} node "
               f"{node!r}, fed by tensors outside FP16's range")
    else:
        required = _num((num.get("thresholds") or {}).get("min_snr_db"))
        cos, snr = _num(first.get("cosine")), _num(first.get("snr_db"))
        if not (cos >= ARITHMETIC_MIN_COSINE and math.isfinite(required)
                and min(snrs) > required and noise_like(cos, snr)):
            return None
        region, kind = (node,), "arithmetic"
        why = (f"FP16 storage keeps this model (source at FP16: SNR {min(snrs):.1f} dB against "
               f"FP32) but the HTP's FP16 arithmetic loses it at {first.get('op')} node "
               f"{node!r} (cosine {_num(first.get('cosine')):.6f}, SNR "
               f"{_num(first.get('snr_db')):.1f} dB against the source at FP16)")
    opts = settings_for(request, platform)
    nodes = tuple(dict.fromkeys([*islands, *region]))
    again = replace(request, settings={**request.settings,
                                       platform: {**opts, "fp32_nodes": list(nodes)}})
    return Finding(kind, node, region, why, again)


def noise_like(cos: float, snr: float) -> bool:
    """Whether a node's error (cosine, SNR against the FP16 source) looks like rounding noise,
    uncorrelated with the signal: then cosine = 1 / sqrt(1 + 10^(-SNR/10)). A systematic
    fault — a scaled weight, a wrong bias — moves the SNR without the matching loss of
    cosine (a 1.3× conv has cosine 1.0 at 10 dB), so it is not taken for FP16 arithmetic."""
    if not (math.isfinite(cos) and math.isfinite(snr)):
        return False
    expected = 1.0 - 1.0 / math.sqrt(1.0 + 10.0 ** (-snr / 10.0))
    return expected > 0 and 0.5 <= (1.0 - cos) / expected <= 2.0


def lost(values: Any) -> bool:
    """Whether FP16 (subnormals flushed, as the HTP does) loses this tensor: a share of its
    nonzero finite values below FP16's normal range or above its maximum."""
    v = np.abs(np.asarray(values, dtype=np.float64))
    v = v[np.isfinite(v) & (v > 0)]
    return bool(v.size) and float(np.mean((v < FP16_MIN_NORMAL) | (v > FP16_MAX))) >= LOST_SHARE


def underflow_region(onnx_path: Path, node: str, feeds: dict[str, Any]) -> tuple[str, ...]:
    """`node` and its producers, upstream, whose FP32 outputs FP16 loses; () when neither
    the node's inputs nor its output are outside FP16's range (no underflow evidence)."""
    import onnx

    from server.compile.gates.layers import cpu_session, run_tensors

    model = onnx.load(str(onnx_path))
    by_name = {n.name: n for n in model.graph.node}
    producer = {o: n for n in model.graph.node for o in n.output if o}
    if node not in by_name:
        return ()
    region = [node]
    frontier = [by_name[node]]
    evidence = False
    seen: dict[str, bool] = {}
    while frontier and len(region) < MAX_REGION:
        n = frontier.pop(0)
        ins = [i for i in n.input if i in producer and producer[i].op_type != "Constant"]
        wanted = [t for t in [*ins, *([n.output[0]] if n.name == node else [])]
                  if t not in seen]
        if wanted:
            values = run_tensors(model, wanted, feeds, cpu_session)
            seen.update({t: lost(v) for t, v in values.items()})
        if n.name == node and seen.get(n.output[0]):
            evidence = True  # the node's own output overflows / underflows
        for t in ins:
            p = producer[t]
            if seen.get(t) and p.name not in region and len(region) < MAX_REGION:
                evidence = True
                region.append(p.name)
                frontier.append(p)
    return tuple(region) if evidence else ()


def why_island(finding: Finding) -> str:
    return (f"{finding.why}: kept {len(finding.region)} node(s) at FP32 on the device's CPU EP "
            f"({', '.join(finding.region[:6])}" + (", …" if len(finding.region) > 6 else "")
            + ")")


def chosen(failed: Any, island: Any, finding: Finding) -> Any:
    """The island build's outcome when it is ready, carrying what the failed attempt measured;
    else the HTP-only build's failure (its gate and layer walk say where the HTP loses the
    model), with what the island build measured."""
    htp = island.gates.get("htp") or {}
    record = {"kind": finding.kind, "node": finding.node, "region": list(finding.region),
              "nodes": [str(n) for n in finding.request.settings["qnn"]["fp32_nodes"]],
              "why": finding.why, "chosen": island.state == "ready",
              "node_share": htp.get("node_share"), "mac_share": htp.get("mac_share"),
              "failed_error": failed.error[:2000],
              "failed_compile_seconds": round(failed.compile_seconds, 3)}
    record["island_error"] = island.error[:2000] if island.state != "ready" else ""
    failed.compile_seconds += island.compile_seconds
    island.compile_seconds = failed.compile_seconds  # what the build cost, both attempts
    if island.state == "ready":
        island.gates["precision_islands"] = record
        island.notes.insert(0, f"precision island chosen by default: {why_island(finding)}; "
                               f"HTP share {htp.get('node_share')} of nodes, "
                               f"{htp.get('mac_share')} of MACs. Set precision_islands=off to "
                               "insist on the HTP alone")
        return island
    failed.gates["precision_islands"] = record
    failed.error = (f"{failed.error} A precision island was tried — {why_island(finding)} — "
                    f"and the build with that island failed too: {island.error[:1500]}")
    return failed
