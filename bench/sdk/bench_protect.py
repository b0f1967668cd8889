"""What protection (issue 23, docs/security.md) adds to a device's full update of a 100 MB
model, against the plaintext path measured in the same run.

    plaintext full update : Updater.check_once() of a device without the model over loopback
                            HTTP (manifest verify, download + sha256, stage + fsync,
                            onnxruntime on-device compile, load, activate) — the baseline;
    protected full update : the same cycle for the sealed artifact (download + sha256 of the
                            sealed bytes, kept as served; the content key wrapped under the
                            device-local key; stage + fsync, decrypt into memory, load from
                            bytes, activate; no on-device compile);
    decrypt for load      : the sealed file decrypted into memory (read_plain), as every load
                            of a protected model does (also the patch path's base);
    seal (device)         : a patch's result sealed under the content key (seal_plain);
    load from bytes / file: onnxruntime InferenceSession from the decrypted bytes vs from the
                            plaintext file (the protected path skips the on-device compile).
    seal (server)         : the compile worker sealing the artifact, for reference.

    python -m bench.sdk.bench_protect [--mb 100] [--runs 3]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from client_sdk import DeviceProfile, Outcome, Updater, UpdaterConfig, UrllibTransport
from client_sdk.install import Member
from client_sdk.keystore import FileKeyStore
from client_sdk.protection import read_plain, seal_plain, wrap
from manifests import Sealed, sealed
from tests.client.http_repo import serve
from tests.client.onnx_models import scaled_model
from tests.client.simulator import FakeClock, RepositorySimulator


class _FixedKey:
    def __init__(self, key: bytes) -> None:
        self.key = key

    def content_key(self, model: str, version: str) -> bytes:
        return self.key


def _best(runs: int, fn: Callable[[], object]) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def run(mb: int, runs: int) -> list[tuple[str, float, float]]:
    import onnxruntime as ort

    v1 = scaled_model(1.0, padding=mb * 2**20 // 4, use_padding=True)
    scale = 100 * 2**20 / len(v1)  # seconds per 100 MB
    rows: list[tuple[str, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        sim = RepositorySimulator(FakeClock(time.time()))
        sim.publish("big", [sim.release("1.0", [sim.artifact(v1)])])
        with serve(sim) as base:
            n = 0

            def full_update() -> None:
                nonlocal n
                n += 1
                r = Updater(UpdaterConfig(
                    base_url=base, channel="prod", pinned_root=sim.pinned_root,
                    device=DeviceProfile("bench", "linux"), data_dir=tmp / f"dev{n}",
                    transport=UrllibTransport(), formats=["onnx"])).check_once()
                assert r.outcome is Outcome.UPDATED

            rows.append(("plaintext full update", *_best(runs, full_update)))
            key = sealed.new_key()
            sealed_v1 = b"".join(sealed.seal(key, [v1]))
            art = replace(sim.artifact(sealed_v1), sealed=Sealed(
                hashlib.sha256(v1).hexdigest(), len(v1)))
            sim.publish("big", [sim.release("1.0", [art])])

            def protected_update() -> None:
                nonlocal n
                n += 1
                up = Updater(UpdaterConfig(
                    base_url=base, channel="prod", pinned_root=sim.pinned_root,
                    device=DeviceProfile("bench", "linux"), data_dir=tmp / f"dev{n}",
                    transport=UrllibTransport(), formats=["onnx"]))
                # The content key as the server would seal it to this device: the one small
                # POST of the real path is left out (the simulator serves no key endpoint).
                up.downloader._keys = _FixedKey(key)  # type: ignore[assignment]
                r = up.check_once()
                assert r.outcome is Outcome.UPDATED and r.models[0].outcome is Outcome.UPDATED

            rows.append(("protected full update (same cycle)", *_best(runs, protected_update)))
        plain = tmp / "plain.onnx"
        plain.write_bytes(v1)
        served = tmp / "served.sealed"

        def seal_server() -> None:
            with plain.open("rb") as f, served.open("wb") as out:
                sealed.seal_file(key, f, out)

        rows.append(("seal (server, compile worker)", *_best(runs, seal_server)))
        store = FileKeyStore(tmp / "keys")
        member = Member("primary", "onnx", "linux", "", "m", "0" * 64, 0,
                        wrapped_key=wrap(store, key))
        rows.append(("decrypt for load (device, into memory)",
                     *_best(runs, lambda: read_plain(served, member, store))))
        rows.append(("seal (device, a patch's result)",
                     *_best(runs, lambda: seal_plain(key, v1, tmp / "patched.sealed"))))
        data = read_plain(served, member, store)
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        rows.append(("onnxruntime load from bytes", *_best(
            runs, lambda: ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"]))))
        rows.append(("onnxruntime load from file", *_best(runs, lambda: ort.InferenceSession(
            str(plain), opts, providers=["CPUExecutionProvider"]))))
    return [(name, best * scale, med * scale) for name, best, med in rows]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    rows = run(args.mb, args.runs)
    print(f"| step (per 100 MB, {args.runs} runs) | best s | median s |")
    print("|---|---|---|")
    for name, best, med in rows:
        print(f"| {name} | {best:.2f} | {med:.2f} |")
    by = {name: med for name, _, med in rows}
    full, prot = by["plaintext full update"], by["protected full update (same cycle)"]
    print(f"\nprotected vs plaintext full update (medians): {prot:.2f} s vs {full:.2f} s = "
          f"{100 * (prot - full) / full:+.1f}% (goal < +10%)")


if __name__ == "__main__":
    main()
