"""Delta patch benchmark: mfdelta1 vs bsdiff4, zstd --patch-from and xdelta3 on model pairs.

    python -m bench.delta                     # 5 and 50 MB, every scenario (~20 min: bsdiff4)
    python -m bench.delta --sizes 5,50,200    # add 200 MB (bsdiff4 skipped above 64 MB)
    python -m bench.delta --bsdiff4-max-mb 0  # bsdiff4 at every size (200 MB: ~3.5 GB, minutes)
    python -m bench.delta --write-docs        # also rewrite our section of docs/benchmarks.md
    python -m bench.delta --scenarios fp16_to_int8,int8_finetune --section precision-delta \
        --title "Delta patches across precisions" --write-docs   # its own section

Every create and apply runs in its own process; its wall time (for our Python tools: the
operation alone, without interpreter start-up) and its peak RSS are recorded, and every
applied output is checked against the new file's sha256. Peak RSS comes from GNU time's %M,
not from our own wait4: Linux carries the parent's RSS high-water mark into a child across
vfork+exec, so wait4 here would report this (large) benchmark process instead. Model pairs
are generated once into ``--workdir`` and reused.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.delta.models import SCENARIOS, write_pair  # noqa: E402

DOC = ROOT / "docs" / "benchmarks.md"
OURS = "mfdelta1"


@dataclass
class Row:
    size_mb: int
    scenario: str
    tool: str
    new_bytes: int
    patch_bytes: int | None = None
    create_s: float | None = None
    create_mb: float | None = None
    apply_s: float | None = None
    apply_mb: float | None = None
    note: str = ""

    @property
    def percent(self) -> float | None:
        return None if self.patch_bytes is None else 100 * self.patch_bytes / self.new_bytes


GNU_TIME = "/usr/bin/time"


def _measure(cmd: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MB, stdout) of one child process; raises on failure."""
    if not Path(GNU_TIME).exists():
        raise SystemExit("GNU time is needed for peak RSS: apt-get install time")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with tempfile.NamedTemporaryFile() as rss:
        start = time.perf_counter()
        done = subprocess.run(
            [GNU_TIME, "-o", rss.name, "-f", "%M", *cmd],
            capture_output=True, env=env, cwd=ROOT, check=False,
        )
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"{cmd[0]} failed: {done.stderr.decode(errors='replace')[-500:]}")
        peak_kb = int(Path(rss.name).read_text().split()[-1])
    return elapsed, peak_kb / 1024, done.stdout.decode()


def _python(action: str, algorithm: str, *paths: Path) -> tuple[float, float]:
    cmd = [sys.executable, "-m", "bench.delta.worker", action, algorithm, *map(str, paths)]
    _, peak, stdout = _measure(cmd)
    return json.loads(stdout)["seconds"], peak


def _commands(tool: str, base: Path, new: Path, patch: Path, out: Path) -> tuple[list, list]:
    if tool == "zstd -3 --patch-from":
        return (
            ["zstd", "-q", "-f", "-3", f"--patch-from={base}", str(new), "-o", str(patch)],
            ["zstd", "-q", "-f", "-d", "--memory=2048MB", f"--patch-from={base}", str(patch),
             "-o", str(out)],
        )
    if tool == "xdelta3":
        return (
            ["xdelta3", "-e", "-f", "-s", str(base), str(new), str(patch)],
            ["xdelta3", "-d", "-f", "-s", str(base), str(patch), str(out)],
        )
    raise ValueError(tool)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def run_one(tool: str, base: Path, new: Path, work: Path, row: Row) -> None:
    patch, out = work / "patch", work / "out"
    for leftover in (patch, out):
        leftover.unlink(missing_ok=True)
    if tool in (OURS, "bsdiff4"):
        row.create_s, row.create_mb = _python("create", tool, base, new, patch)
        row.apply_s, row.apply_mb = _python("apply", tool, base, patch, out)
    else:
        create, apply = _commands(tool, base, new, patch, out)
        row.create_s, row.create_mb, _ = _measure(create)
        row.apply_s, row.apply_mb, _ = _measure(apply)
    row.patch_bytes = patch.stat().st_size
    if _sha256(out) != _sha256(new):
        row.note = "WRONG OUTPUT"
    if tool == OURS:
        from server.delta.inspect import op_summary

        row.note = row.note or ", ".join(
            f"{name} {100 * produced / row.new_bytes:.0f}%"
            for name, (_, produced) in sorted(op_summary(patch).items(), key=lambda i: -i[1][1])
            if produced >= row.new_bytes / 100
        )
    patch.unlink(missing_ok=True)
    out.unlink(missing_ok=True)


def tools_available() -> list[str]:
    tools = [OURS, "bsdiff4"]
    if shutil.which("zstd"):
        tools.append("zstd -3 --patch-from")
    if shutil.which("xdelta3"):
        tools.append("xdelta3")
    return tools


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def table(rows: list[Row]) -> str:
    lines = [
        "| size | scenario | tool | patch % of new | create s | create peak MB | apply s "
        "| apply peak MB | notes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.size_mb} MB | {r.scenario} | {r.tool} | {_fmt(r.percent, '.2f')} "
            f"| {_fmt(r.create_s, '.2f')} | {_fmt(r.create_mb, '.0f')} | {_fmt(r.apply_s, '.2f')} "
            f"| {_fmt(r.apply_mb, '.0f')} | {r.note} |"
        )
    return "\n".join(lines)


def goals(rows: list[Row]) -> str:
    """Per pair at >= 50 MB: our patch vs bsdiff4 in size, create time and peak memory."""
    lines = []
    by_pair: dict[tuple[int, str], dict[str, Row]] = {}
    for r in rows:
        by_pair.setdefault((r.size_mb, r.scenario), {})[r.tool] = r
    for (size, scenario), tools in by_pair.items():
        ours, bs = tools.get(OURS), tools.get("bsdiff4")
        if size < 50 or ours is None or bs is None or bs.patch_bytes is None:
            continue
        assert ours.patch_bytes and ours.create_s and ours.create_mb and bs.create_s
        assert bs.create_mb
        size_ok = ours.patch_bytes <= bs.patch_bytes
        speed = bs.create_s / ours.create_s
        memory = ours.create_mb / bs.create_mb
        verdict = "met" if size_ok and speed >= 20 and memory <= 0.5 else "MISSED"
        lines.append(
            f"- {size} MB {scenario}: size {ours.patch_bytes / bs.patch_bytes:.2f}× bsdiff4's, "
            f"created {speed:.0f}× faster with {memory:.2f}× its peak memory — goal {verdict}"
        )
    return "\n".join(lines)


def write_docs(section: str, name: str = "delta") -> None:
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{section}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    DOC.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.delta", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="5,50", help="pair sizes in MB (default 5,50)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--tools", default=None, help="comma list; default: every one installed")
    parser.add_argument(
        "--bsdiff4-max-mb", type=int, default=64,
        help="skip bsdiff4 above this size (it needs ~18x the file in RAM); 0 = never skip",
    )
    parser.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "mf-bench-delta"
    )
    parser.add_argument("--write-docs", action="store_true", help=f"update {DOC.name}")
    parser.add_argument("--section", default="delta",
                        help="the marked section of the docs to write (default: delta)")
    parser.add_argument("--title", default="Delta patches", help="the section's heading")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    scenarios = args.scenarios.split(",")
    tools = args.tools.split(",") if args.tools else tools_available()
    rows: list[Row] = []
    for size in sizes:
        for scenario in scenarios:
            pair_dir = args.workdir / f"{scenario}-{size}MB"
            if not (pair_dir / "new.onnx").exists():
                write_pair(scenario, size * 1_000_000, pair_dir, seed=size)
            base, new = pair_dir / "base.onnx", pair_dir / "new.onnx"
            for tool in tools:
                row = Row(size, scenario, tool, new.stat().st_size)
                if tool == "bsdiff4" and args.bsdiff4_max_mb and size > args.bsdiff4_max_mb:
                    row.note = f"skipped: > {args.bsdiff4_max_mb} MB (--bsdiff4-max-mb 0 to run)"
                else:
                    try:
                        run_one(tool, base, new, pair_dir, row)
                    except RuntimeError as e:
                        row.note = f"failed: {e}"[:200]
                rows.append(row)
                print(table([row]).splitlines()[-1], flush=True)
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    section = "\n".join([
        f"## {args.title}",
        "",
        f"`python -m bench.delta --sizes {args.sizes}"
        + (f" --scenarios {args.scenarios}" if args.scenarios != ",".join(SCENARIOS) else "")
        + f"` on {when}, {os.cpu_count()} cores "
        f"({platform.machine()}, shared with other work), Python {platform.python_version()}. "
        "Patch size is % of the new file; times are wall seconds of the create/apply alone; "
        "peak MB is the process's max RSS (GNU time %M). Every applied output matched the new "
        "file's sha256 unless noted. Notes on mfdelta1 rows: share of the new file each op "
        "kind produced.",
        "",
        table(rows),
        "",
        "Goals (at 50 MB and above: never larger than bsdiff4, ≥ 20× faster to create, ≤ half "
        "its peak memory):",
        "",
        goals(rows) or "- (no pair at 50 MB+ with bsdiff4 measured)",
    ])
    print()
    print(section)
    if args.write_docs:
        write_docs(section, args.section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
