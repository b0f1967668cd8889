"""A version's builds and gate reports for a person: one block per build, wrapped to the
terminal (80 columns in a pipe), nothing cut — errors, fix hints and why a gate did not run are
shown whole. Shared by `modelfleet builds` (database) and `modelfleet publish|versions show`
(HTTP); it reads only the JSON document of GET …/builds, so it needs rich and nothing else.

The numeric gate shows its two questions on two rows: `numeric` (the artifact against the
source at its precision: the verdict, with the first disagreeing layer under `layers` when it
failed) and `precision` (what that precision costs the model against FP32, and where the loss
starts). A `precision: auto` build adds a `search` row: the frontier of candidates tried
and skipped, and why the winner won.

"shape variant" is the input-shape set a build compiled (metadata `shapes`, `default` when
there is one); "build variant" is what the compiler made of it (precision, SoC target).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text


def _fmt(x: Any) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def _artifact(art: dict[str, Any]) -> str:
    return (f"build variant {art['variant']}, {art['format']}, {art['sha256'][:12]}…, "
            f"{art['length']:,} B")


def _operators(gates: dict[str, Any]) -> str | None:
    ops = gates.get("operators") or []
    if not ops:
        return None
    if all(o.get("passed") for o in ops):
        return "passed"
    return "; ".join(f"{o.get('summary', 'rejected')}" + (f" — {o['advice']}"
                                                          if o.get("advice") else "")
                     for o in ops if not o.get("passed"))


def _rows_text(rows: list[dict[str, Any]]) -> str:
    m = rows[0] if rows else {}
    if m.get("cosine") is None:
        return ""
    return f"cos {_fmt(m['cosine'])}, SNR {_fmt(m.get('snr_db'))} dB"


def _numeric(gates: dict[str, Any]) -> str | None:
    """The gate's verdict on question 1 (artifact vs the source at its precision)."""
    num = gates.get("numeric")
    if not num:
        return None
    text = str(num.get("status", ""))
    figures = _rows_text(num.get("outputs") or [])
    if figures:
        text += f" ({figures}" + (f" vs {num['basis']}" if num.get("basis") else "") + ")"
    reason = str(num.get("reason") or "")
    if text == "not_run":
        # The reason usually says "not run (…)" itself.
        if reason.startswith("not run"):
            return reason
        return f"not run: {reason or 'no reason recorded'}"
    return f"{text}: {reason}" if reason else text


def _precision(gates: dict[str, Any]) -> str | None:
    """Question 2: what the precision itself costs this model, and where that loss starts."""
    num = gates.get("numeric") or {}
    cost = num.get("precision_cost") or {}
    if not cost or cost.get("status") == "none":
        return None
    if cost.get("status") == "not_measured":
        return f"not measured: {cost.get('reason', '')}"
    text = f"{str(num.get('precision', '')).upper()} vs FP32: {_rows_text(cost['outputs'])}"
    text += ", within the seed thresholds" if cost["status"] == "within_seed" else \
        f", below the seed thresholds ({'enforced' if cost.get('enforced') else 'reported only'})"
    where = (num.get("layers") or {}).get("precision") or {}
    if where.get("summary"):
        text += f"; {where['summary']}"
    return text


def _search(gates: dict[str, Any]) -> str | None:
    """`precision: auto`: each candidate tried (bytes, figures against FP32, verdict), each
    skipped, and why the winner won."""
    found = gates.get("precision_search")
    if not found:
        return None
    parts = []
    for r in found.get("tried") or []:
        f = r.get("vs_fp32") or {}
        figures = (f", cos {_fmt(f['cosine'])}, SNR {_fmt(f['snr_db'])} dB, max abs "
                   f"{_fmt(f['max_abs_diff'])}" if f else "")
        size = f", {r['bytes']:,} B" if r.get("bytes") else ""
        why = r.get("reason") or r.get("error") or ""
        parts.append(f"{r['candidate']}{size}{figures}, {r.get('compile_seconds', 0)} s: "
                     f"{r['outcome']}" + (f" ({why})" if why and r["outcome"] != "passed"
                                          else ""))
    parts += [f"{r['candidate']} skipped: {r['why']}" for r in found.get("skipped") or []]
    winner = found.get("winner") or {}
    if winner.get("why"):
        parts.append(f"chosen: {winner['why']}")
    return "; ".join(parts) or None


def _notes(gates: dict[str, Any]) -> str | None:
    notes = (gates.get("numeric") or {}).get("notes") or []
    return " ".join(str(n) for n in notes) or None


def _layers(gates: dict[str, Any]) -> str | None:
    loc = ((gates.get("numeric") or {}).get("layers") or {}).get("faithful") or {}
    return str(loc.get("summary") or loc.get("unavailable") or "") or None


def build_block(build: dict[str, Any]) -> Group:
    """One build: a heading line, then label/value rows whose values wrap under themselves
    (as Text: server strings such as "[ONNXRuntimeError]" are never read as rich markup)."""
    attempts = build.get("attempts", 0)
    head = Text.assemble(
        (build["platform"], "bold"), f" · shape variant {build['variant']} · ",
        (build["state"], "green" if build["state"] == "succeeded" else
         "red" if build["state"] == "failed" else "yellow"),
        f" ({attempts} attempt{'s' if attempts != 1 else ''})" if attempts else "")
    rows = Table.grid(padding=(0, 2))
    rows.add_column(no_wrap=True)
    rows.add_column(overflow="fold")
    arts = build.get("artifacts") or ([build["artifact"]] if build.get("artifact") else [])
    for art in arts:
        rows.add_row("  artifact", Text(_artifact(art)))
    gates = build.get("gates") or {}
    by_artifact = gates.get("by_artifact") or {}
    for label, gate_set in ([("", gates)] if not by_artifact else
                            [(f" {name}", g) for name, g in by_artifact.items()]):
        for name, value in (("operators", _operators(gate_set)), ("numeric", _numeric(gate_set)),
                            ("layers", _layers(gate_set)), ("precision", _precision(gate_set)),
                            ("search", _search(gate_set)), ("note", _notes(gate_set))):
            if value is not None:
                rows.add_row(Text(f"  {name}{label}"), Text(value))
    if build.get("error"):
        rows.add_row("  error", Text(build["error"]))
    return Group(head, rows)


def patches_line(patches: dict[str, Any] | None) -> str | None:
    """The version's delta-patch job in one line (None when it had none)."""
    if not patches:
        return None
    if patches["state"] == "failed":
        return (f"delta patches: failed ({patches['error']}); devices download the full "
                "artifact")
    return f"delta patches: {patches['state']}, {patches['patches']} made"


def print_builds(console: Console, doc: dict[str, Any]) -> None:
    """`doc`: {"model", "version", "state", "builds": [GET …/builds entries], and optionally
    "patches" (the version's patch job)}."""
    console.print(Text.assemble((f"{doc['model']} {doc['version']}", "bold"),
                                f": {doc['state']}"))
    line = patches_line(doc.get("patches"))
    if line is not None:
        console.print(Text(line))
    for build in doc["builds"]:
        console.print(build_block(build))
