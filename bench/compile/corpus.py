"""Compiles the real-model corpus for onnx, coreml and qnn and prints model × platform:

    python -m bench.compile.corpus [--models a,b] [--platforms onnx,coreml,qnn] [--markdown]
                                   [--json out.json] [--precision auto [--mixed]]
    python -m bench.compile.corpus --cells a.json b.json …   # the table of saved cells
    (--log prints each build's log with the seconds since its cell began)

Each cell runs the same pipeline a worker runs (operator gate, compile, numeric gate on 2
reference samples, packing) and shows the outcome, compile seconds, cosine / SNR of the
artifact against the source at its precision (what the gate judges), the precision's own cost
(source at the precision against FP32), the HTP share (qnn) and the artifact bytes; a failed
cell shows the named operator/node and the fix from the build's error (in full in the list
under the table). Models are built or fetched into ~/.cache/modelfleet/corpus
(tests/corpus). Core ML numerics run on Linux through the MIL reference executor.

`--precision auto` runs the precision search (server/compile/precision_search.py) for coreml
and qnn instead and prints, per model and platform, the chosen candidate, the shipped
artifact's bytes against the FP32 ONNX (its compressed copy when the build makes one, with
the content's bytes beside it; `inflate_mb_s` in `--json` is the device-side decompression
speed; MF_BENCH_KEEP=<dir> keeps both files), its figures against FP32 and the
candidates tried; the summary
counts the cells that ship at most 0.3× the FP32 size passing the INT8 thresholds (or the
FP16 gate for an FP16 winner). The corpus's reference inputs are also its calibration inputs
(the only real data the corpus has), and Core ML targets iOS18 (`--coreml-target`) so the
block-wise candidates are in the search.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform as host
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PLATFORMS = ("onnx", "coreml", "qnn")


def run_cell(model: Any, plat: str, workdir: Path, extra: dict[str, Any] | None = None,
             log: Any = None) -> dict[str, Any]:
    from server.compile.pipeline import BuildSpec, Pipeline
    from server.compile.settings_map import pipeline_settings

    auto = bool(extra) and plat in AUTO_PLATFORMS
    flat = {**model.platforms[plat], **(extra or {}).get(plat, {})} if auto \
        else model.platforms[plat]
    spec = BuildSpec(source_path=model.path, source_format=model.fmt,
                     variants={"default": model.inputs}, platforms=(plat,),
                     settings=pipeline_settings(plat, flat),
                     reference_path=model.reference,
                     calibration_path=model.reference if auto else None)
    started = time.monotonic()
    try:
        outcomes = Pipeline(log=log).build(spec, workdir)
    except Exception as e:  # a crash is a failed cell with its reason
        return {"model": model.name, "platform": plat, "state": "failed",
                "error": f"{type(e).__name__}: {e}", "seconds": time.monotonic() - started}
    out = outcomes[0]
    if auto:
        return search_cell(model.name, plat, out, time.monotonic() - started)
    num = out.gates.get("numeric", {})
    metrics = num.get("outputs") or [{}]
    htp = out.gates.get("htp", {})
    cost = num.get("precision_cost", {}).get("outputs") or []
    return {
        # The two questions: artifact vs source at its precision (gates), and the precision's
        # own cost (source at precision vs FP32); then artifact vs FP32 end to end.
        "cost_cosine": min((float(m["cosine"]) for m in cost), default=None),
        "cost_snr_db": min((float(m["snr_db"]) for m in cost), default=None),
        "fp32_cosine": min((float(m["cosine"]) for m in num.get("vs_fp32") or []),
                           default=None),
        "fp32_snr_db": min((float(m["snr_db"]) for m in num.get("vs_fp32") or []),
                           default=None),
        "loss_starts": (num.get("layers", {}).get("precision") or {}).get("first_below"),
        "model": model.name, "platform": plat, "state": out.state,
        "seconds": round(out.compile_seconds or (time.monotonic() - started), 1),
        "numeric": num.get("status", ""),
        "cosine": min((float(m.get("cosine", 1.0)) for m in metrics), default=None)
        if num.get("status") in ("passed", "failed") else None,
        "snr_db": min((float(m.get("snr_db", 0.0)) for m in metrics), default=None)
        if num.get("status") in ("passed", "failed") else None,
        "htp_share": htp.get("node_share"),
        "precision": out.precision,
        "fp32_by_default": bool((out.gates.get("precision_default") or {}).get("chosen")),
        "islands": [str(n) for n in (out.gates.get("precision_islands") or {}).get("nodes", [])
                    if n] if (out.gates.get("precision_islands") or {}).get("chosen") else [],
        "bytes": out.artifact.length if out.artifact else None,
        "error": out.error,
    }


def _cell(c: dict[str, Any]) -> str:
    if c["state"] != "ready":
        return f"**failed** ({c['seconds']}s): {c['error'][:160]}"
    parts = [f"ok {c['seconds']}s"]
    if c.get("fp32_by_default"):
        parts.append("FP32 by default (FP16 itself loses the model; both builds' seconds)")
    if c.get("islands"):
        parts.append(f"precision island: {len(c['islands'])} node(s) at FP32 on the CPU EP "
                     f"({', '.join(c['islands'][:3])}{', …' if len(c['islands']) > 3 else ''}"
                     "; both builds' seconds)")
    if c.get("cosine") is not None:
        parts.append(f"cos {c['cosine']:.5f}, {c['snr_db']:.1f} dB")
    if c.get("cost_cosine") is not None:
        parts.append(f"precision cost cos {c['cost_cosine']:.5f}, {c['cost_snr_db']:.1f} dB")
    if c.get("islands") and c.get("fp32_cosine") is not None:
        parts.append(f"vs FP32 cos {c['fp32_cosine']:.5f}, {c['fp32_snr_db']:.1f} dB")
    elif c.get("numeric"):
        parts.append(f"numeric {c['numeric'].split(' ')[0].replace('_', ' ')}")
    if c.get("htp_share") is not None:
        parts.append(f"HTP {100 * c['htp_share']:.0f}%")
    if c.get("bytes"):
        parts.append(f"{c['bytes'] / 1e6:.1f} MB")
    return ", ".join(parts)


def table(models: list[Any], cells: list[dict[str, Any]], plats: list[str]) -> str:
    by = {(c["model"], c["platform"]): c for c in cells}
    lines = ["| model | family | exporter | dims | params | " + " | ".join(plats) + " |",
             "|---|---|---|---|---|" + "---|" * len(plats)]
    for m in models:
        row = [m.name, m.family, m.exporter, m.dims, f"{m.params / 1e6:.1f}M"]
        row += [_cell(by[(m.name, p)]) if (m.name, p) in by else "—" for p in plats]
        lines.append("| " + " | ".join(row) + " |")
    # A re-run cell replaces the earlier one (by model and platform).
    kept = [by[(m.name, p)] for m in models for p in plats if (m.name, p) in by]
    ok = {p: sum(1 for c in kept if c["platform"] == p and c["state"] == "ready")
          for p in plats}
    n = {p: sum(1 for c in kept if c["platform"] == p) for p in plats}
    lines.append("")
    lines.append("Succeeded: " + ", ".join(
        f"{p} {ok[p]}/{n[p]} ({100 * ok[p] / max(n[p], 1):.0f}%)" for p in plats))
    failed = [c for c in kept if c["state"] != "ready"]
    if failed:
        lines += ["", "Failing cells, with the node and the fix from each build's error:", ""]
        lines += [f"- {c['model']} ({c['platform']}): {c['error']}" for c in failed]
    return "\n".join(lines)


AUTO_PLATFORMS = ("coreml", "qnn")
GOAL_RATIO = 0.3


def search_cell(model: str, plat: str, out: Any, seconds: float) -> dict[str, Any]:
    """One `--precision auto` cell: the winner, its size against FP32 and its figures."""
    frontier = out.gates.get("precision_search", {})
    winner = frontier.get("winner") or {}
    row = next((r for r in frontier.get("tried", []) if r["candidate"] ==
                winner.get("candidate")), {})
    fp32 = frontier.get("fp32_bytes")
    content = out.artifact.length if out.artifact else None
    # What ships: the compressed copy a device downloads when the build makes one
    # (server/publish/copies.compress_copy, the same call the build runner makes).
    shipped = _shipped(out.artifact.path, f"{model}-{plat}") if out.artifact else {}
    size = shipped.get("bytes", content)
    # No candidate passed: the build fell back to the default precision (FP16, FP32 or
    # islands), judged by the version's own gate, not the INT8 thresholds: never the goal.
    fallback = "fallback" in frontier
    return {"model": model, "platform": plat, "state": out.state, "auto": True,
            "chosen": "default, after the search" if fallback else winner.get("candidate", ""),
            "fallback": fallback, "precision": out.precision,
            "bytes": size, "content_bytes": content, "fp32_bytes": fp32,
            "ratio": round(size / fp32, 4) if size and fp32 else None,
            "content_ratio": round(content / fp32, 3) if content and fp32 else None,
            "inflate_mb_s": shipped.get("inflate_mb_s"), "codec": shipped.get("codec"),
            "vs_fp32": _gate_figures(out) if fallback else row.get("vs_fp32", {}), "tried": [
                f"{r['candidate']}:{'ok' if r['outcome'] == 'passed' else 'x'}"
                for r in frontier.get("tried", [])],
            "search_seconds": frontier.get("spent_seconds"), "seconds": round(seconds, 1),
            "reasons": {r["candidate"]: str(r.get("reason") or r.get("error") or "")[:300]
                        for r in frontier.get("tried", []) if r["outcome"] != "passed"},
            "why": winner.get("why", ""), "error": out.error}


def _gate_figures(out: Any) -> dict[str, Any]:
    """The worst output's figures against FP32 (the numeric gate's `vs_fp32` where it ran
    one, else its own comparison)."""
    num = out.gates.get("numeric") or {}
    outputs = num.get("vs_fp32") or num.get("outputs") or []
    if not outputs:
        return {}
    return {k: min((o[k] for o in outputs if o.get(k) is not None), default=None)
            for k in ("cosine", "snr_db")}


def _shipped(path: Path, cell: str) -> dict[str, Any]:
    """The compressed copy's bytes and the device-side inflate speed (MB of content per
    second, best of 3), or {} when the build would ship the content as it is."""
    from client_sdk import compression
    from server.publish.copies import compress_copy

    copy = path.with_name(path.name + ".zst")
    made = compress_copy(path, copy)
    if made is None:
        return {}
    best = float("inf")
    for _ in range(3):
        with copy.open("rb") as src, open(os.devnull, "wb") as sink:
            t = time.perf_counter()
            compression.decompress(src, sink, path.stat().st_size, made[2])
            best = min(best, time.perf_counter() - t)
    keep = os.environ.get("MF_BENCH_KEEP")  # a directory: keep content and copy for bench/
    if keep:
        import shutil

        Path(keep).mkdir(parents=True, exist_ok=True)  # a search's whole cell is lost otherwise
        for p in (path, copy):
            shutil.copyfile(p, Path(keep) / f"{cell}-{p.name}")
    return {"bytes": made[1], "codec": made[2],
            "inflate_mb_s": round(path.stat().st_size / best / 1e6, 1)}


def _at_most_goal(c: dict[str, Any]) -> bool:
    """At most GOAL_RATIO of the FP32 bytes, on the bytes (the rounded ratio printed beside
    it would count 0.3001× as 0.3×)."""
    return bool(c["bytes"] and c["fp32_bytes"] and c["bytes"] <= GOAL_RATIO * c["fp32_bytes"])


def _size(c: dict[str, Any]) -> str:
    """Shipped bytes against FP32; with the uncompressed content's when a copy ships."""
    text = f"{c['bytes']:,} / {c['fp32_bytes']:,} = {c['ratio']}×"
    content = c.get("content_bytes")
    if content and content != c["bytes"]:
        text += f" (content {content:,} = {c.get('content_ratio')}×" + (
            f", {c['codec']}" if c.get("codec") else "") + ")"
    return text


def auto_table(cells: list[dict[str, Any]]) -> str:
    lines = ["| model | platform | chosen | bytes / FP32 | cosine | SNR dB | max abs | tried "
             "| search s |", "|---|---|---|---|---|---|---|---|---|"]
    goal = 0
    for c in cells:
        if c["state"] != "ready":
            lines.append(f"| {c['model']} | {c['platform']} | **failed** | | | | | "
                         f"{' '.join(c.get('tried', []))} | {c.get('search_seconds')} |")
            lines[-1] = lines[-1][:-1] + f" {c['error'][:140]} |"
            continue
        f = c["vs_fp32"]
        goal += bool(not c.get("fallback") and c["ratio"] is not None
                     and _at_most_goal(c))
        lines.append(
            f"| {c['model']} | {c['platform']} | {c['chosen']} ({c['precision']}) | "
            f"{_size(c)} | {f.get('cosine')} | "
            f"{f.get('snr_db')} | {f.get('max_abs_diff')} | {' '.join(c['tried'])} | "
            f"{c['search_seconds']} |")
    ready = sum(c["state"] == "ready" for c in cells)
    fallback = sum(bool(c.get("fallback")) and c["state"] == "ready" for c in cells)
    lines += ["", f"Cells passing their gate: {ready}/{len(cells)} ({fallback} at the default "
              f"precision after no candidate passed); at most {GOAL_RATIO}× the FP32 size and "
              f"passing the search's gate: {goal}/{len(cells)} "
              f"({100 * goal / max(len(cells), 1):.0f}%, goal 90%)"]
    return "\n".join(lines)


def _saved(paths: list[Path]) -> int:
    """The table of saved cells (in corpus order), e.g. of one `--json` run per model."""
    from tests.corpus.models import corpus, names

    cells = [c for p in paths for c in json.loads(p.read_text())]
    seen = {c["model"] for c in cells}
    if cells and all(c.get("auto") for c in cells):  # --precision auto runs: their table
        order = {n: i for i, n in enumerate(names())}
        print(auto_table(sorted(cells, key=lambda c: (order.get(c["model"], len(order)),
                                                      c["platform"]))))
        return 0
    models = corpus([n for n in names() if n in seen])
    plats = [p for p in PLATFORMS if any(c["platform"] == p for c in cells)]
    print(table(models, cells, plats))
    return 0


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.corpus.models import corpus

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="comma-separated corpus model names (default: all)")
    ap.add_argument("--platforms", default=",".join(PLATFORMS))
    ap.add_argument("--markdown", action="store_true", help="print only the markdown table")
    ap.add_argument("--json", type=Path, help="also write the cells as JSON here")
    ap.add_argument("--precision", choices=("as-set", "auto"), default="as-set",
                    help="auto: the precision search for coreml and qnn")
    ap.add_argument("--mixed", action="store_true", help="with auto: mixed precision")
    ap.add_argument("--coreml-target", default="iOS18", help="with auto: Core ML target")
    ap.add_argument("--log", action="store_true",
                    help="print each build's log to stderr, with seconds since the cell began")
    ap.add_argument("--cells", nargs="+", type=Path,
                    help="print the table of cells saved by earlier --json runs (one model "
                         "per run, say) instead of compiling")
    args = ap.parse_args(argv)
    if args.cells:
        return _saved(args.cells)
    plats = [p for p in args.platforms.split(",") if p]
    extra: dict[str, Any] = {}
    if args.precision == "auto":
        plats = [p for p in plats if p in AUTO_PLATFORMS]
        mixed = {"mixed": "true"} if args.mixed else {}
        extra = {"coreml": {"precision": "auto", "minimum_deployment_target":
                            args.coreml_target, **mixed},
                 "qnn": {"precision": "auto", **mixed}}
    models = corpus(args.models.split(",") if args.models else None)
    cells = []
    with tempfile.TemporaryDirectory(prefix="corpus-bench-") as tmp:
        for m in models:
            for p in plats:
                cell = run_cell(m, p, Path(tmp) / m.name / p, extra,
                                _timed_log(f"{m.name}/{p}") if args.log else None)
                cells.append(cell)
                if not args.markdown:
                    print(f"{m.name:24} {p:7} " + (json.dumps(cell) if extra else _cell(cell)),
                          file=sys.stderr, flush=True)
    print(f"Corpus compile{' --precision auto' if extra else ''}"
          f"{' --mixed' if args.mixed else ''}, {datetime.date.today().isoformat()}, "
          f"{host.machine()} {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f}, Python {host.python_version()}\n")
    print(auto_table(cells) if extra else table(models, cells, plats))
    if args.json:
        args.json.write_text(json.dumps(cells, indent=1))
    return 0


def _timed_log(cell: str) -> Any:
    started = time.monotonic()
    return lambda msg: print(f"[{time.monotonic() - started:7.1f}s {cell}] {msg}",
                             file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
