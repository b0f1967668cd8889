"""ModelRuntime: atomic swaps under concurrent inference, circuit breaker, QNN EP, candidates."""

from __future__ import annotations

import concurrent.futures
import hashlib
import multiprocessing
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from client_sdk import BackendError, Event, EventKind, ModelNotLoadedError, ModelRuntime
from client_sdk.backends import open_backend
from client_sdk.errors import BackendUnavailableError
from client_sdk.install import Bundle, BundleStore, Member
from client_sdk.runtime import CANDIDATE
from tests.client.onnx_models import check_whole, scaled_model

X = np.arange(4, dtype=np.float32).reshape(1, 4)


def make_bundle(data_dir: Path, model: str, version: str, k: float,
                formats: tuple[str, ...] = ("onnx",)) -> Bundle:
    """Stage a bundle straight into the store (what the updater does after verification)."""
    store = BundleStore(data_dir)
    data = scaled_model(k)
    staged = []
    for i, fmt in enumerate(formats):
        src = data_dir / f"src-{version}-{i}"
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_bytes(data)
        role = "primary" if i == 0 else "fallback"
        staged.append((Member(role, fmt, "linux", "", f"{role}.onnx",
                              hashlib.sha256(data).hexdigest(), len(data)), src))
    return store.stage(model, version, staged)


def test_predict_before_any_install_says_what_to_do(tmp_path):
    with pytest.raises(ModelNotLoadedError, match="modelfleet device update"):
        ModelRuntime(tmp_path).predict("clf", {"x": X})


def test_thousand_swaps_under_four_predicting_threads_zero_errors_whole_bundles(tmp_path):
    rt = ModelRuntime(tmp_path)
    loaded = [rt.prepare(make_bundle(tmp_path, "clf", v, k))
              for v, k in (("1.0", 1.0), ("2.0", 2.0))]
    expected_k = {"1.0": 1.0, "2.0": 2.0}
    rt.swap(loaded[0])
    stop = threading.Event()
    errors: list[BaseException] = []
    seen: set[str] = set()
    counts = [0] * 4

    def worker(i: int) -> None:
        while not stop.is_set():
            try:
                p = rt.predict("clf", {"x": X})
                assert check_whole(p.outputs, X) == expected_k[p.version]
                seen.add(p.version)
                counts[i] += 1
            except BaseException as e:
                errors.append(e)
                return

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for n in range(1000):
        rt.swap(loaded[n % 2])
        time.sleep(0.0001)  # let predictions interleave with swaps
    stop.set()
    for t in threads:
        t.join()
    assert errors == []
    assert seen == {"1.0", "2.0"} and min(counts) > 0


def test_in_flight_call_finishes_on_the_old_bundle(tmp_path):
    rt = ModelRuntime(tmp_path)
    old = rt.prepare(make_bundle(tmp_path, "clf", "1.0", 1.0))
    new = rt.prepare(make_bundle(tmp_path, "clf", "2.0", 2.0))
    rt.swap(old)
    entered, release = threading.Event(), threading.Event()
    real_run = old._backend.run

    def slow_run(inputs):
        entered.set()
        release.wait(5)
        return real_run(inputs)

    old._backend.run = slow_run  # type: ignore[method-assign]
    result: list = []
    t = threading.Thread(target=lambda: result.append(rt.predict("clf", {"x": X})))
    t.start()
    entered.wait(5)
    rt.swap(new)
    assert rt.predict("clf", {"x": X}).version == "2.0"  # new calls are not blocked
    release.set()
    t.join()
    assert result[0].version == "1.0" and check_whole(result[0].outputs, X) == 1.0


class Flaky:
    """Fault injection around a real backend: raises while ``broken`` is set."""

    def __init__(self, inner, broken: threading.Event) -> None:
        self.inner, self.broken, self.name = inner, broken, inner.name

    def run(self, inputs):
        if self.broken.is_set():
            raise BackendError(f"{self.name}: injected accelerator fault")
        return self.inner.run(inputs)


def test_qnn_bundle_is_compiled_to_a_context_model_and_runs_on_the_real_qnn_ep(tmp_path):
    # A fresh interpreter: the QNN HTP backend keeps its precision mode process-wide, so in a
    # process where a server-side FP16 compile ran first (tests/compile under pytest-xdist)
    # this exact comparison would see FP16-mode results (1 ulp off). A device app's process
    # only ever opens the SDK's sessions, which is what the child reproduces.
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        pool.submit(_qnn_context_model_roundtrip, tmp_path).result(timeout=300)


def _qnn_context_model_roundtrip(tmp_path: Path) -> None:
    import onnx
    import onnxruntime_qnn

    from client_sdk.compile import compile_bundle

    bundle = make_bundle(tmp_path, "clf", "1.0", 4.0, ("qnn", "onnx"))
    compile_bundle(bundle)
    ctx_dir = bundle.path / "compiled" / f"onnxruntime-qnn-{onnxruntime_qnn.__version__}"
    (ctx,) = ctx_dir.glob("*.ctx.onnx")
    assert [n.op_type for n in onnx.load(str(ctx)).graph.node] == ["EPContext"]
    rt = ModelRuntime(tmp_path)
    rt.swap(rt.prepare(bundle))
    p = rt.predict("clf", {"x": X})
    assert p.backend == "onnxruntime-qnn" and check_whole(p.outputs, X) == 4.0

    # The same context model shipped by the server as an "onnx-epcontext" artifact loads as is.
    store = BundleStore(tmp_path)
    data = ctx.read_bytes()
    src = tmp_path / "ctx-src"
    src.write_bytes(data)
    member = Member("primary", "onnx-epcontext", "android", "", "primary.onnx",
                    hashlib.sha256(data).hexdigest(), len(data))
    shipped = store.stage("clf", "1.1", [(member, src)])
    p = ModelRuntime(tmp_path).prepare(shipped).run({"x": X})
    assert p.backend == "onnxruntime-qnn" and check_whole(p.outputs, X) == 4.0


def test_failing_backend_trips_the_breaker_and_falls_back_to_cpu(tmp_path):
    broken = threading.Event()
    events: list[Event] = []

    def factory(bundle, member):
        backend = open_backend(bundle, member)
        return Flaky(backend, broken) if member.format == "qnn" else backend

    rt = ModelRuntime(tmp_path, on_event=events.append, breaker_threshold=3,
                      backend_factory=factory)
    rt.swap(rt.prepare(make_bundle(tmp_path, "clf", "1.0", 4.0, ("qnn", "onnx"))))
    assert rt.predict("clf", {"x": X}).backend == "onnxruntime-qnn"
    broken.set()
    backends = [rt.predict("clf", {"x": X}).backend for _ in range(5)]
    assert backends == ["onnxruntime-cpu"] * 5  # each failing call was retried on CPU
    fallbacks = [e for e in events if e.kind is EventKind.FALLBACK]
    assert len(fallbacks) == 1 and "3 times" in fallbacks[0].reason
    broken.clear()
    assert rt.predict("clf", {"x": X}).backend == "onnxruntime-cpu"  # the switch is sticky


def test_unavailable_accelerator_falls_back_at_load_and_reports_it(tmp_path):
    events: list[Event] = []

    def factory(bundle, member):
        if member.format == "qnn":
            raise BackendUnavailableError("no HTP on this device")
        return open_backend(bundle, member)

    rt = ModelRuntime(tmp_path, on_event=events.append, backend_factory=factory)
    rt.swap(rt.prepare(make_bundle(tmp_path, "clf", "1.0", 4.0, ("qnn", "onnx"))))
    assert rt.predict("clf", {"x": X}).backend == "onnxruntime-cpu"
    assert [e.kind for e in events] == [EventKind.FALLBACK]


def test_failing_backend_without_fallback_raises_backend_error(tmp_path):
    broken = threading.Event()
    broken.set()
    rt = ModelRuntime(tmp_path, backend_factory=lambda b, m: Flaky(open_backend(b, m), broken))
    rt.swap(rt.prepare(make_bundle(tmp_path, "clf", "1.0", 1.0)))
    with pytest.raises(BackendError, match="injected"):
        rt.predict("clf", {"x": X})


def test_candidate_runs_beside_the_active_bundle(tmp_path):
    rt = ModelRuntime(tmp_path)
    rt.swap(rt.prepare(make_bundle(tmp_path, "clf", "1.0", 1.0)))
    rt.swap(rt.prepare(make_bundle(tmp_path, "clf", "2.0", 2.0)), slot=CANDIDATE)
    assert check_whole(rt.predict("clf", {"x": X}).outputs, X) == 1.0
    assert check_whole(rt.predict("clf", {"x": X}, slot=CANDIDATE).outputs, X) == 2.0
    rt.clear("clf", CANDIDATE)
    with pytest.raises(ModelNotLoadedError):
        rt.predict("clf", {"x": X}, slot=CANDIDATE)


def test_compiled_model_is_cached_per_runtime_version(tmp_path):
    import onnxruntime

    bundle = make_bundle(tmp_path, "clf", "1.0", 1.0)
    ModelRuntime(tmp_path).prepare(bundle)
    cached = list((bundle.path / "compiled").iterdir())
    assert [p.name for p in cached] == [f"onnxruntime-{onnxruntime.__version__}"]
    opt = next(cached[0].glob("*.opt.onnx"))
    opt.write_bytes(b"bit rot")  # a corrupted cache is rebuilt, never loaded
    ModelRuntime(tmp_path).prepare(bundle)
    assert opt.read_bytes() != b"bit rot"


def test_qnn_ep_registered_first_by_another_component_still_serves_the_htp():
    # A process that compiled with the server's QNN path (or an app that registered the EP
    # itself) already holds the library under the same name; the SDK must use it rather than
    # fall back to the CPU. A fresh interpreter, so nothing in this one registered it before.
    import subprocess
    import sys

    script = (
        "import onnxruntime as ort, onnxruntime_qnn\n"
        "ort.register_execution_provider_library(onnxruntime_qnn.get_ep_name(),\n"
        "                                        onnxruntime_qnn.get_library_path())\n"
        "from client_sdk import qnn\n"
        "opts = qnn.session_options()\n"
        "print(opts.get_session_config_entry('session.disable_cpu_ep_fallback'))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "1"
