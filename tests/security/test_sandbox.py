"""The compile sandbox's boundary, probed from inside by code an attacker would run there
(the same `bwrap_command` every build uses, with a probe program instead of the compile
child): no keys, no writes outside the job directory, no network, no secrets in the
environment, nobody's uid, and limits that stop runaway memory and time."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from server.compile.errors import CompileError
from server.compile.sandbox import (
    NOBODY,
    JobDirs,
    SandboxedPipeline,
    SandboxPolicy,
    SandboxUnavailableError,
    bwrap_command,
    probe,
    run_child,
)
from server.publish.keys import KeyPaths, init_keys


def sandboxed(tmp_path: Path, code: str, policy: SandboxPolicy | None = None
              ) -> tuple[list[str], str, int]:
    """Runs Python `code` in a fresh sandbox; (stdout lines, failure text, exit status)."""
    policy = policy or SandboxPolicy()
    job = JobDirs(tmp_path / "job")
    job.create()
    lines: list[str] = []
    cmd = bwrap_command(policy, job, program=[sys.executable, "-s", "-c", code])
    run = run_child(cmd, job, policy, lines.append)
    return lines, run.failure() if run.returncode or run.killed_for else "", run.returncode


@pytest.fixture
def keys(tmp_path: Path) -> KeyPaths:
    paths = KeyPaths.for_data_dir(tmp_path / "data")
    init_keys(paths, now=int(time.time()), root_keys=1, threshold=1)
    return paths


def test_sandboxed_code_cannot_read_the_keys_dir(tmp_path: Path, keys: KeyPaths) -> None:
    probe_code = f"""
import os
for p in ({str(keys.release_key_path)!r}, {str(keys.keys_dir)!r}, {str(tmp_path)!r}):
    try:
        print(p, "READ", open(p).read()[:20] if os.path.isfile(p) else os.listdir(p))
    except OSError as e:
        print(p, "DENIED", type(e).__name__)
"""
    lines, failure, _ = sandboxed(tmp_path, probe_code)
    assert not failure, failure
    assert len(lines) == 3 and all("DENIED" in line for line in lines), lines
    seed = json.loads(keys.release_key_path.read_text())["seed_hex"]
    assert not any(seed in line for line in lines)


def test_sandboxed_code_cannot_write_outside_its_work_dir(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    targets = [str(victim), str(tmp_path / "new.txt"), "/tmp/escaped.txt",
               "/usr/escaped.txt", sys.prefix + "/escaped.txt", "/job/in/escaped.txt",
               "/opt/modelfleet/server/escaped.py"]
    probe_code = f"""
for p in {targets!r}:
    try:
        open(p, "w").write("pwned")
        print(p, "WROTE")
    except OSError as e:
        print(p, "DENIED", type(e).__name__)
open("/job/out/inside.txt", "w").write("ok")
"""
    lines, failure, _ = sandboxed(tmp_path, probe_code)
    assert not failure, failure
    assert victim.read_text() == "original"
    assert not (tmp_path / "new.txt").exists() and not Path("/tmp/escaped.txt").exists()
    assert not Path(sys.prefix, "escaped.txt").exists()
    # /tmp inside is a private tmpfs (a write there succeeds and vanishes); the rest refuse.
    refused = [t for t in targets if t != "/tmp/escaped.txt"]
    assert all(any(line.startswith(t + " DENIED") for line in lines) for t in refused), lines
    assert (tmp_path / "job" / "out" / "inside.txt").read_text() == "ok"


def test_sandboxed_code_cannot_reach_the_network(tmp_path: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set() and not accepted:
            try:
                accepted.append(listener.accept())
            except TimeoutError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    probe_code = f"""
import socket
for host in ("127.0.0.1", "1.1.1.1", "modelfleet.invalid"):
    try:
        socket.create_connection((host, {port} if host == "127.0.0.1" else 80), timeout=3)
        print(host, "CONNECTED")
    except OSError as e:
        print(host, "BLOCKED", type(e).__name__)
"""
    try:
        lines, failure, _ = sandboxed(tmp_path, probe_code)
    finally:
        stop.set()
        t.join(timeout=5)
        listener.close()
    assert not failure, failure
    assert len(lines) == 3 and all("BLOCKED" in line for line in lines), lines
    assert accepted == []  # the server's loopback was never reached


def test_sandboxed_code_gets_no_secrets_from_the_environment(tmp_path: Path,
                                                             monkeypatch) -> None:
    monkeypatch.setenv("MODELFLEET_DATABASE_URL", "postgresql://u:hunter2@db/x")
    monkeypatch.setenv("MODELFLEET_TOKEN_PEPPER", "pepper-secret-value")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value")
    lines, failure, _ = sandboxed(tmp_path, "import os; print(sorted(os.environ.items()))")
    assert not failure, failure
    env = " ".join(lines)
    for secret in ("hunter2", "pepper-secret-value", "aws-secret-value", "MODELFLEET_"):
        assert secret not in env


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid switch applies when run as root")
def test_sandboxed_code_runs_as_nobody_without_capabilities(tmp_path: Path) -> None:
    lines, failure, _ = sandboxed(tmp_path, """
import os
print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups())
print([l for l in open('/proc/self/status') if l.startswith(('CapEff', 'NoNewPrivs'))])
""")
    assert not failure, failure
    assert lines[0] == f"{NOBODY} {NOBODY} {NOBODY} []"
    assert "CapEff:\\t0000000000000000" in lines[1] and "NoNewPrivs:\\t1" in lines[1]


def test_memory_hog_is_stopped_by_the_address_space_limit(tmp_path: Path) -> None:
    policy = SandboxPolicy(memory_bytes=512 * 1024 * 1024)
    lines, failure, _ = sandboxed(tmp_path, """
try:
    hog = bytearray(2 * 1024 ** 3)
    print("ALLOCATED")
except MemoryError:
    print("LIMITED")
""", policy)
    assert lines == ["LIMITED"], (lines, failure)


def test_endless_compile_is_killed_at_the_wall_clock_limit(tmp_path: Path) -> None:
    policy = SandboxPolicy(wall_seconds=2.0)
    started = time.monotonic()
    lines, failure, _ = sandboxed(tmp_path, "import time; print('start', flush=True); "
                                            "time.sleep(120)", policy)
    assert time.monotonic() - started < 30
    assert lines == ["start"]
    assert "wall-clock limit" in failure


def test_disk_filler_is_killed_at_the_output_limit(tmp_path: Path) -> None:
    policy = SandboxPolicy(output_bytes=64 * 1024 * 1024)
    _lines, failure, _ = sandboxed(tmp_path, """
import os
with open('/job/out/fill', 'wb') as f:
    for _ in range(4096):
        f.write(os.urandom(1 << 20)); f.flush()
""", policy)
    assert "output limit" in failure
    assert (tmp_path / "job" / "out" / "fill").stat().st_size < 2 * 1024 ** 3


def test_missing_sandbox_fails_the_build_closed(tmp_path: Path, monkeypatch) -> None:
    import server.compile.sandbox as sandbox

    monkeypatch.setattr(sandbox, "_PROBE", {})
    with pytest.raises(SandboxUnavailableError, match="install bubblewrap"):
        probe(bwrap="/nonexistent/bwrap")
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap, prlimit or setpriv on PATH
    from server.compile import BuildSpec, InputSpec, SourceFormat

    model = tmp_path / "m.onnx"
    model.write_bytes(b"\x08\x07")
    spec = BuildSpec(source_path=model, source_format=SourceFormat.ONNX,
                     variants={"default": (InputSpec("x", (1, 4)),)}, platforms=("onnx",))
    with pytest.raises(CompileError, match="MODELFLEET_SANDBOX=off"):
        SandboxedPipeline(SandboxPolicy()).build(spec, tmp_path / "work")


def test_sandbox_opt_out_is_refused_in_production() -> None:
    from server.settings import Settings, SettingsError

    with pytest.raises((SettingsError, ValueError), match="MODELFLEET_SANDBOX=off"):
        Settings(env="production", sandbox="off", token_pepper="x" * 32)
