"""ONNX's backend node cases through ONNX → MIL → ct.convert → the MIL reference executor:

    python -m bench.compile.onnx_conformance [--pattern test_resize] [--fp16] [--failures]
                                             [--jobs 2] [--json out.json]

Prints the per-op table docs/compile.md carries (cases, in scope, passed at FP32, cases where
an input was bound as a constant; with --fp16 also how many FP32 passes also pass as an FP16
program), the out-of-scope reasons, and the ops of the corpus that no rule claims. Scope and
tolerances: server/compile/onnx_mil/conformance.py. `--jobs N` runs N processes (shards).
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import sys
import time
from collections import Counter
from typing import Any


def _shard(args: tuple[str, bool, int, int]) -> Any:
    from server.compile.onnx_mil.conformance import run_suite

    pattern, fp16, k, n = args
    return run_suite(pattern, fp16=fp16, shard=(k, n))


def main(argv: list[str] | None = None) -> int:
    from server.compile.onnx_mil import claimed_ops
    from server.compile.onnx_mil.conformance import merge, table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pattern", default="", help="only cases whose name contains this")
    ap.add_argument("--fp16", action="store_true", help="also run passing cases at FP16")
    ap.add_argument("--failures", action="store_true", help="list every failing case")
    ap.add_argument("--json", default="", help="write per-case results here")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    args = ap.parse_args(argv)
    started = time.monotonic()
    jobs = [(args.pattern, args.fp16, k, args.jobs) for k in range(args.jobs)]
    if args.jobs == 1:
        rows, results = _shard(jobs[0])
    else:
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            rows, results = merge(pool.map(_shard, jobs))
    print(f"ONNX backend node cases, {datetime.date.today()}, "
          f"{time.monotonic() - started:.0f} s\n")
    print(table(rows, fp16=args.fp16))
    below = [r for r in rows.values() if r.in_scope and r.rate < 0.95]
    print(f"\nclaimed ops below 95%: {', '.join(r.op for r in below) or 'none'}")
    reasons = Counter(r.detail.split(": Core ML")[0] for r in results
                      if r.status == "out-of-scope")
    print("\nout of scope:", "; ".join(f"{k} ({v})" for k, v in reasons.most_common()))
    unclaimed = sorted({r.op for r in results if r.detail == "op not claimed"})
    print(f"\nops with cases but no rule ({len(unclaimed)}): {', '.join(unclaimed)}")
    print(f"\nclaimed ({len(claimed_ops())}): {', '.join(sorted(claimed_ops()))}")
    if args.failures:
        for r in results:
            if r.status in ("failed", "refused"):
                print(f"{r.status}: {r.name} [{r.op}]: {r.detail}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([r.__dict__ for r in results], f, indent=1)
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
