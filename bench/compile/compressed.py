"""Compressed artifact copies (manifests/compressed.py) on real corpus artifacts:

    MF_BENCH_KEEP=DIR python -m bench.compile.corpus --precision auto ...   # keeps artifacts
    python -m bench.compile.compressed --dir DIR [--markdown]

Table 1, per artifact: the content (what shipped before copies: the baseline) against our
codec (client_sdk/compression.py: zstd at `level_for(size)`, 8 MiB window, one frame) and
the two stdlib alternatives an SDK could use without a wheel (zlib 9, xz preset 9); bytes,
the server's compress seconds and the device-side inflate speed (MB of content per second,
best of 3, this machine), and what inflating adds to a full update next to the download time
it saves at 10 Mbit/s.

Table 2, per artifact: our level against level 19 for every size (the baseline: what copies
used until 2026-12-07) and level 3: bytes and the server's compress CPU seconds
(process time, so a loaded machine inflates them less than wall time).

Table 3, per Core ML package: a small update of its weights — a fine-tune (every float
weight moved by 1e-3 of its magnitude, one INT8 step on a random tenth of the weights) — as patch
bytes: mfdelta1 and bsdiff4 between contents (publishing ships the smaller: patches stay
between contents) against bsdiff4 between the compressed copies, zstd --patch-from (the base
copy as a raw dictionary) between the compressed copies, and the new compressed copy whole.

Table 4 (`--only shuffle` prints it alone), per artifact: plain zstd (the baseline: every
copy until 2026-12-07) against the shuffled codecs (`zstd-shuffle2` / `-shuffle4`: each 1 MiB
block's bytes transposed as 2- / 4-byte elements first) at our level, the codec
`best_codec` picks and its bytes against plain zstd, the server's CPU seconds for the
choice and the copy against plain zstd's, and the device-side inflate speed of both.
"""

from __future__ import annotations

import argparse
import datetime
import io
import lzma
import os
import platform
import shutil
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import bsdiff4
import numpy as np
import zstandard

from client_sdk import compression
from server.compile import packing, weights
from server.delta import create_mfdelta1

LINK_MBIT = 10


def _best(fn: Any, runs: int = 3) -> float:
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _zstd(data: bytes, level: int | None = None, codec: str = compression.CODEC) -> bytes:
    out = io.BytesIO()
    compression.compress(io.BytesIO(data), out, len(data), level, codec)
    return out.getvalue()


def _cpu(fn: Any) -> tuple[Any, float]:
    t = time.process_time()
    out = fn()
    return out, time.process_time() - t


def levels_row(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    ours, ours_s = _cpu(lambda: _zstd(data))
    l19, l19_s = _cpu(lambda: _zstd(data, 19))
    l3, l3_s = _cpu(lambda: _zstd(data, 3))
    return {"file": path.name, "content": len(data), "level": compression.level_for(len(data)),
            "ours": len(ours), "ours_s": ours_s, "l19": len(l19), "l19_s": l19_s,
            "l3": len(l3), "l3_s": l3_s}


def codecs_row(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    mb = len(data) / 1e6
    t = time.perf_counter()
    ours = _zstd(data)
    ours_s = time.perf_counter() - t
    z = zlib.compress(data, 9)
    x = lzma.compress(data, preset=9)

    def inflate_ours() -> None:
        with open(os.devnull, "wb") as sink:
            compression.decompress(io.BytesIO(ours), sink, len(data))

    row = {"file": path.name, "content": len(data), "zstd": len(ours), "zstd_s": ours_s,
           "zstd_mb_s": mb / _best(inflate_ours),
           "zlib": len(z), "zlib_mb_s": mb / _best(lambda: zlib.decompress(z)),
           "xz": len(x), "xz_mb_s": mb / _best(lambda: lzma.decompress(x))}
    row["inflate_s"] = mb / row["zstd_mb_s"]
    row["saved_s"] = (len(data) - len(ours)) * 8 / (LINK_MBIT * 1e6)
    return row


def shuffle_row(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    mb = len(data) / 1e6
    plain, plain_s = _cpu(lambda: _zstd(data))
    copies = {c: _zstd(data, codec=c) for c in compression.SHUFFLED}

    def choose_and_compress() -> tuple[str, bytes]:
        codec = compression.best_codec(io.BytesIO(data), len(data))
        return codec, _zstd(data, codec=codec)

    (codec, chosen), chosen_s = _cpu(choose_and_compress)

    def inflate(blob: bytes, c: str) -> None:
        with open(os.devnull, "wb") as sink:
            compression.decompress(io.BytesIO(blob), sink, len(data), c)

    return {"file": path.name, "content": len(data), "plain": len(plain), "plain_s": plain_s,
            **{c: len(b) for c, b in copies.items()}, "codec": codec, "chosen": len(chosen),
            "chosen_s": chosen_s, "plain_mb_s": mb / _best(lambda: inflate(plain, "zstd")),
            "chosen_mb_s": mb / _best(lambda: inflate(chosen, codec))}


def shuffle_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| artifact | content | zstd (baseline) | zstd-shuffle2 | zstd-shuffle4 | chosen | "
             "chosen / zstd | server CPU s: chosen (zstd) | inflate MB/s: chosen (zstd) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["content"]
        lines.append(
            f"| {r['file']} | {c:,} | {_pct(r['plain'], c)} | {_pct(r['zstd-shuffle2'], c)} | "
            f"{_pct(r['zstd-shuffle4'], c)} | {r['codec']} | {r['chosen'] / r['plain']:.3f} | "
            f"{r['chosen_s']:.2f} ({r['plain_s']:.2f}) | {r['chosen_mb_s']:.0f} "
            f"({r['plain_mb_s']:.0f}) |")
    n = len(rows)
    if n:
        ratios = sorted(r["chosen"] / r["plain"] for r in rows)
        lines.append(f"\nMedian chosen / zstd over {n} artifacts: {ratios[n // 2]:.3f}; "
                     f"shuffled chosen for {sum(r['codec'] != 'zstd' for r in rows)} of {n}.")
    return "\n".join(lines)


def _fine_tune(pkg: Path) -> None:
    rng = np.random.default_rng(7)

    def change(_name: str, v: np.ndarray) -> np.ndarray:
        if v.dtype.kind == "f":
            f = v.astype(np.float32)
            return (f * (1 + 1e-3 * rng.standard_normal(f.size).astype(np.float32))
                    ).astype(v.dtype)
        # One step up or down on a random tenth of the weights (a regular stride would be
        # a pattern bzip2 and zstd find, which a fine-tune does not make).
        step = np.zeros(v.size, dtype=np.int16)
        moved = rng.random(v.size) < 0.1
        step[moved] = rng.choice(np.array([-1, 1], dtype=np.int16), int(moved.sum()))
        info = np.iinfo(v.dtype)
        return np.clip(v.astype(np.int16) + step, info.min, info.max).astype(v.dtype)

    weights.rewrite(pkg, change)


def patch_row(tar: Path, work: Path) -> dict[str, Any]:
    base_pkg = packing.unpack_directory(tar, work / "base")
    new_dir = work / "new"
    new_dir.mkdir()
    new_pkg = Path(shutil.copytree(base_pkg, new_dir / base_pkg.name))
    _fine_tune(new_pkg)
    new_tar = packing.pack_directory(new_pkg, work / "new.tar").path
    base, new = tar.read_bytes(), new_tar.read_bytes()
    zbase, znew = _zstd(base), _zstd(new)
    create_mfdelta1(tar, new_tar, work / "p.mfdelta1")
    ref = zstandard.ZstdCompressionDict(zbase, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    params = zstandard.ZstdCompressionParameters.from_level(
        19, window_log=max(23, (len(zbase) + len(znew)).bit_length()))
    patch_from = zstandard.ZstdCompressor(dict_data=ref, compression_params=params).compress(znew)
    return {"file": tar.name, "new": len(new), "new_zstd": len(znew),
            "mfdelta1": (work / "p.mfdelta1").stat().st_size,
            "bsdiff4": len(bsdiff4.diff(base, new)),
            "bsdiff4_zstd": len(bsdiff4.diff(zbase, znew)), "patch_from_zstd": len(patch_from)}


def _pct(part: int, whole: int) -> str:
    return f"{part:,} ({100 * part / whole:.1f}%)"


def tables(rows: list[dict[str, Any]], levels: list[dict[str, Any]],
           patches: list[dict[str, Any]]) -> str:
    lines = ["| artifact | content (baseline) | zstd (ours) | compress s | inflate MB/s | "
             "zlib 9 | inflate MB/s | xz 9 | inflate MB/s | inflate s / download s saved "
             f"at {LINK_MBIT} Mbit/s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["content"]
        lines.append(
            f"| {r['file']} | {c:,} | {_pct(r['zstd'], c)} | {r['zstd_s']:.2f} | "
            f"{r['zstd_mb_s']:.0f} | {_pct(r['zlib'], c)} | {r['zlib_mb_s']:.0f} | "
            f"{_pct(r['xz'], c)} | {r['xz_mb_s']:.0f} | "
            f"{r['inflate_s'] * 1000:.1f} ms / {r['saved_s']:.2f} s |")
    lines += ["", "| artifact | content | ours: level | bytes | CPU s | level 19 (baseline) | "
              "CPU s | level 3 | CPU s | ours / level 19: bytes, CPU |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in levels:
        c = r["content"]
        lines.append(
            f"| {r['file']} | {c:,} | {r['level']} | {_pct(r['ours'], c)} | {r['ours_s']:.2f} | "
            f"{_pct(r['l19'], c)} | {r['l19_s']:.2f} | {_pct(r['l3'], c)} | {r['l3_s']:.2f} | "
            f"{r['ours'] / r['l19']:.3f}, {r['ours_s'] / max(r['l19_s'], 1e-9):.3f} |")
    if patches:
        lines += ["", "| Core ML package, fine-tuned | new content | new compressed copy | "
                  "mfdelta1 on content | bsdiff4 on content | shipped (the smaller) | "
                  "bsdiff4 on compressed | zstd --patch-from on compressed |",
                  "|---|---|---|---|---|---|---|---|"]
        for p in patches:
            n = p["new"]
            lines.append(f"| {p['file']} | {n:,} | {_pct(p['new_zstd'], n)} | "
                         f"{_pct(p['mfdelta1'], n)} | {_pct(p['bsdiff4'], n)} | "
                         f"{_pct(min(p['mfdelta1'], p['bsdiff4']), n)} | "
                         f"{_pct(p['bsdiff4_zstd'], n)} | {_pct(p['patch_from_zstd'], n)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, required=True, help="artifacts kept by the corpus run")
    ap.add_argument("--markdown", action="store_true", help="print only the tables")
    ap.add_argument("--only", choices=["shuffle"], help="print only table 4")
    args = ap.parse_args(argv)
    files = sorted(p for p in args.dir.iterdir() if p.is_file() and p.suffix != ".zst")
    if args.only:
        print(f"Shuffled copies, {datetime.date.today()}, {platform.machine()} "
              f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}\n")
        print(shuffle_table([shuffle_row(p) for p in files]))
        return 0
    rows = [codecs_row(p) for p in files]
    levels = [levels_row(p) for p in files]
    patches = []
    for tar in (p for p in files if p.name.endswith(".mlpackage.tar")):
        with tempfile.TemporaryDirectory() as tmp:
            patches.append(patch_row(tar, Path(tmp)))
    if not args.markdown:
        print(f"Compressed copies, {datetime.date.today()}, {platform.machine()} "
              f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, "
              f"zstandard {zstandard.__version__}\n")
    print(tables(rows, levels, patches))
    print("\n" + shuffle_table([shuffle_row(p) for p in files]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
