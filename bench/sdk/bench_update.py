"""Full update of a ~50 MB model through a patch vs. download + sha256 of the full file,
on loopback HTTP (the repository simulator behind a local http.server).

Measured (wall time, one device, 2-core shared machine):
  patch update   : Updater.check_once() end to end — manifest verify, patch download, patch
                   apply, sha256, stage + fsync, onnxruntime on-device compile, activate;
  full update    : the same cycle on a device without the base (downloads the full file);
  download+sha256: just fetching the full artifact over loopback and hashing it (baseline).

    python -m bench.sdk.bench_update [--mb 50] [--algorithm mfdelta1|bsdiff4]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path

from client_sdk import DeviceProfile, Event, Outcome, Updater, UpdaterConfig, UrllibTransport
from client_sdk.clock import SystemClock
from client_sdk.fetcher import Deadline, download_file
from tests.client.http_repo import serve
from tests.client.onnx_models import scaled_model
from tests.client.simulator import FakeClock, RepositorySimulator


def make_patch(algorithm: str, base: bytes, new: bytes, tmp: Path) -> bytes:
    if algorithm == "bsdiff4":
        import bsdiff4

        return bytes(bsdiff4.diff(base, new))
    from server.delta.mfdelta1 import create_mfdelta1

    (tmp / "base.onnx").write_bytes(base)
    (tmp / "new.onnx").write_bytes(new)
    create_mfdelta1(tmp / "base.onnx", tmp / "new.onnx", tmp / "p.mfd")
    return (tmp / "p.mfd").read_bytes()


def run(mb: int, algorithm: str) -> dict[str, object]:
    floats = mb * 1024 * 1024 // 4
    v1 = scaled_model(1.0, padding=floats, use_padding=True)
    # A "head fine-tune": 1% of the weights change.
    v2 = scaled_model(2.0, padding=floats, tweak=floats // 100, use_padding=True)
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        t0 = time.perf_counter()
        patch_bytes = make_patch(algorithm, v1, v2, tmp)
        diff_s = time.perf_counter() - t0
        sim = RepositorySimulator(FakeClock(time.time()))
        a1 = sim.artifact(v1)
        sim.publish("big", [sim.release("1.0", [a1])])
        with serve(sim) as base:
            marks: list[tuple[float, str]] = []

            def mark(event: Event) -> None:
                marks.append((time.perf_counter(), event.kind.value))

            def updater(name: str) -> Updater:
                return Updater(UpdaterConfig(
                    on_event=mark,
                    base_url=base, channel="prod", pinned_root=sim.pinned_root,
                    device=DeviceProfile("bench", "linux"), data_dir=tmp / name,
                    transport=UrllibTransport(), formats=["onnx"]))

            patched_dev = updater("patched")
            assert patched_dev.check_once().outcome is Outcome.UPDATED
            patch = sim.patch(v1, v2, algorithm=algorithm, data=patch_bytes)
            a2 = sim.artifact(v2, patches=[patch])
            sim.publish("big", [sim.release("2.0", [a2]), sim.release("1.0", [a1])])

            marks.clear()
            t0 = time.perf_counter()
            r = patched_dev.check_once()
            patch_s = time.perf_counter() - t0
            phases = _phases(t0, marks)
            assert r.outcome is Outcome.UPDATED and r.models[0].version == "2.0"
            assert sim.fetched("/" + patch.url) and not sim.fetched("/" + a2.url)

            fresh = updater("fresh")
            t0 = time.perf_counter()
            assert fresh.check_once().models[0].version == "2.0"
            full_s = time.perf_counter() - t0

            t0 = time.perf_counter()
            part = tmp / "dl.part"
            download_file(UrllibTransport(), f"{base}/{a2.url}", part, length=a2.length,
                          sha256=hashlib.sha256(v2).hexdigest(),
                          deadline=Deadline(SystemClock(), 600), request_timeout=60)
            dl_s = time.perf_counter() - t0
    return {
        "model_mb": round(len(v2) / 2**20, 1), "algorithm": algorithm,
        "patch_mb": round(len(patch_bytes) / 2**20, 2),
        "patch_pct": round(100 * len(patch_bytes) / len(v2), 2),
        "server_diff_s": round(diff_s, 2),
        "update_via_patch_s": round(patch_s, 2),
        "update_via_full_s": round(full_s, 2),
        "download_sha256_full_s": round(dl_s, 2),
        "patch_update_phases_s": phases,
    }


def _phases(t0: float, marks: list[tuple[float, str]]) -> dict[str, float]:
    """Seconds from the cycle start to the last event of each kind."""
    out: dict[str, float] = {}
    for t, kind in marks:
        out[kind] = round(t - t0, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--algorithm", default="mfdelta1", choices=["mfdelta1", "bsdiff4"])
    args = ap.parse_args()
    print(json.dumps(run(args.mb, args.algorithm), indent=1))


if __name__ == "__main__":
    main()
