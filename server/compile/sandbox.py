"""Runs the compile pipeline on untrusted uploads inside a sandboxed child process (issue 9).

An uploaded model (TorchScript `__setstate__`, pickled `.pt2` constants, a parser bug in any
converter) can execute code when it is opened, so nothing in this process ever opens it:
`SandboxedPipeline.build` copies the inputs into a private job directory and runs
`python -m server.compile.child` under bubblewrap (`bwrap`):

- new mount, pid, ipc, uts, cgroup and network namespaces; an empty root with read-only
  system, Python and venv directories, the `server` package, and the job directory only —
  no DATA_DIR, keys, database, blob store or other versions' files (each is also masked with
  an empty tmpfs should it lie under one of the bound directories);
- a cleared environment (no database URL, token pepper, S3 or cloud credentials);
- uid/gid 65534 (`setpriv`, no capabilities, no_new_privs) when the server runs as root, else
  the caller's uid inside an unprivileged user namespace;
- rlimits (`prlimit`): address space, CPU seconds, file size, processes, open files, no core;
  a wall-clock kill, and a cap on the bytes written to the job directory.

The parent trusts nothing that comes back: `server.compile.sandbox_result` validates the
result document and every artifact before the job layer stores anything. When the sandbox
cannot start, the build fails (closed) with the reason and the fix; `MODELFLEET_SANDBOX=off`
runs the pipeline in-process for development only and is refused in production.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import server
from server.compile.child_env import minimal_env
from server.compile.compilers.registry import default_compilers
from server.compile.errors import CompileError, TransientCompileError
from server.compile.pipeline import BuildOutcome, BuildSpec, Pipeline
from server.compile.sandbox_result import RESULT_FILE, read_result

log = logging.getLogger(__name__)
Log = Callable[[str], None]

GiB = 1024**3
NOBODY = 65534
SANDBOX_CODE = "/opt/modelfleet"
JOB = "/job"
MAX_LOG_LINE = 2000
STDERR_TAIL = 4000
SETUP_FIX = ("install bubblewrap (`apt-get install bubblewrap`; Linux only) and allow user "
             "namespaces, or — for development only — set MODELFLEET_SANDBOX=off "
             "(docs/security.md)")
# Read-only system paths bound into every sandbox (missing ones are skipped).
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc/ld.so.cache",
                "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime",
                "/etc/passwd", "/etc/group", "/etc/nsswitch.conf")
NETWORK_PATHS = ("/etc/resolv.conf", "/etc/hosts", "/etc/ssl", "/etc/ca-certificates")


class SandboxUnavailableError(CompileError):
    """The sandbox could not be set up; the build fails rather than run unconfined."""


class Builder(Protocol):
    """What the job layer calls: `Pipeline` (in-process) and `SandboxedPipeline` both fit."""

    def build(self, spec: BuildSpec, workdir: Path) -> list[BuildOutcome]: ...


@dataclass(frozen=True)
class SandboxPolicy:
    """Limits of one sandboxed build; `hidden` paths are masked wherever they would show."""

    enabled: bool = True
    memory_bytes: int = 16 * GiB
    cpu_seconds: int = 4 * 3600
    wall_seconds: float = 3300.0
    file_bytes: int = 8 * GiB
    output_bytes: int = 32 * GiB
    processes: int = 1024
    open_files: int = 4096
    hidden: tuple[Path, ...] = ()
    # The AIMET venv's python (settings.aimet_python): its installation is bound read-only
    # and the child runs AIMET with it, inside this sandbox. Empty: no AIMET.
    aimet_python: str = ""

    @classmethod
    def from_settings(cls, settings: Any, *, hidden: Iterable[Path] = ()) -> SandboxPolicy:
        """The policy `modelfleet serve` / `modelfleet worker` use: limits from settings;
        `hidden` (the deployment's data, keys and blob directories) and the SQLite file's
        directory masked should they lie under a bound path."""
        hidden = list(hidden)
        url = settings.resolved_database_url
        if url.startswith("sqlite:///"):
            hidden.append(Path(url.removeprefix("sqlite:///")).parent)
        return cls(enabled=settings.sandbox == "on",
                   memory_bytes=settings.sandbox_memory_mb * 1024 * 1024,
                   wall_seconds=float(settings.sandbox_timeout_seconds),
                   cpu_seconds=2 * settings.sandbox_timeout_seconds,
                   hidden=tuple(Path(os.path.abspath(p)) for p in hidden),
                   aimet_python=settings.aimet_python)


@dataclass(frozen=True)
class JobDirs:
    """The host side of a sandbox's job directory: in/ (read-only), out/, tmp/ (writable)."""

    root: Path

    @property
    def inputs(self) -> Path:
        return self.root / "in"

    @property
    def out(self) -> Path:
        return self.root / "out"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def create(self) -> None:
        for d in (self.inputs, self.out, self.tmp):
            d.mkdir(parents=True, exist_ok=False)
        if os.geteuid() == 0:  # the child runs as nobody and must write its outputs
            for d in (self.out, self.tmp):
                os.chown(d, NOBODY, NOBODY)


def _real(p: str | Path) -> str:
    return os.path.realpath(p)


def _covered(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def python_paths() -> list[tuple[str, str]]:
    """(host path, sandbox path) pairs that make this interpreter and its packages importable:
    the base installation and the venv, each at its real path and at the path Python knows."""
    pairs: list[tuple[str, str]] = []
    for p in {sys.base_prefix, sys.prefix, sys.exec_prefix}:
        pairs.append((_real(p), _real(p)))
        if os.path.abspath(p) != _real(p):
            pairs.append((_real(p), os.path.abspath(p)))
    exe_dir = os.path.dirname(os.path.abspath(sys.executable))
    if not _covered(exe_dir, [dst for _, dst in pairs]):
        pairs.append((_real(exe_dir), exe_dir))
    return pairs


_FOREIGN: dict[str, list[tuple[str, str]]] = {}


def foreign_python_paths(python: str) -> list[tuple[str, str]]:
    """(host, sandbox) pairs that make another interpreter (the AIMET venv's) and its packages
    runnable in the sandbox, read from that interpreter itself (the deployment's own binary,
    never an upload's) once per process."""
    if python in _FOREIGN:
        return _FOREIGN[python]
    probe_code = "import sys, json; print(json.dumps([sys.prefix, sys.base_prefix]))"
    try:
        res = subprocess.run([python, "-I", "-c", probe_code], capture_output=True,
                             timeout=60, check=True, env={"PATH": "/usr/bin:/bin"})
        prefixes = [str(p) for p in json.loads(res.stdout)]
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        raise SandboxUnavailableError(f"MODELFLEET_AIMET_PYTHON {python!r} cannot run "
                                      f"({e}); fix or unset it") from e
    pairs = {(_real(p), _real(p)) for p in prefixes}
    pairs |= {(_real(p), os.path.abspath(p)) for p in prefixes}
    pairs.add((_real(os.path.dirname(python)), os.path.dirname(os.path.abspath(python))))
    _FOREIGN[python] = sorted(pairs)
    return _FOREIGN[python]


def _parent_dirs(dsts: list[str]) -> list[str]:
    """`--dir` (mode 0755) for every ancestor of a bind target that no bind provides: bwrap
    would otherwise copy the host's mode (e.g. /root 0700), and uid 65534 could not reach
    the Python installation below it."""
    out: list[str] = []
    made: set[str] = {"/", "/tmp"}
    for dst in dsts:
        for parent in reversed(Path(dst).parents):
            p = str(parent)
            if p in made or _covered(p, dsts):  # bound itself, or inside a bind
                continue
            made.add(p)
            out += ["--perms", "0755", "--dir", p]
    return out


def bwrap_command(policy: SandboxPolicy, job: JobDirs, *, network: bool = False,
                  extra_ro: Iterable[tuple[str, str]] = (), as_root: bool | None = None,
                  bwrap: str = "bwrap", program: Sequence[str] | None = None) -> list[str]:
    """The full argv of one sandboxed run (pure: builds the command, runs nothing) of
    `program` (default: this interpreter running `server.compile.child`)."""
    root = os.geteuid() == 0 if as_root is None else as_root
    cmd = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try",
           "--die-with-parent", "--new-session", "--hostname", "modelfleet-sandbox"]
    if not network:
        cmd.append("--unshare-net")
    if not root:
        cmd.append("--unshare-user")
    cmd.append("--clearenv")
    for name, value in minimal_env(f"{JOB}/tmp", PYTHONPATH=SANDBOX_CODE,
                                   PYTHONUNBUFFERED="1").items():
        cmd += ["--setenv", name, value]
    # tmpfs /tmp first: a venv or checkout under /tmp (CI clones) is bound over it afterwards.
    cmd += ["--proc", "/proc", "--dev", "/dev", "--size", str(64 * 1024 * 1024),
            "--tmpfs", "/tmp"]
    system = [p for p in SYSTEM_PATHS + (NETWORK_PATHS if network else ()) if os.path.exists(p)]
    code = str(Path(server.__file__).resolve().parent)
    binds = [("--ro-bind", p, p) for p in system]
    for src, dst in python_paths():
        if not (_covered(dst, [b[2] for b in binds]) and src == dst):
            binds.append(("--ro-bind", src, dst))
    binds += [("--ro-bind", code, f"{SANDBOX_CODE}/server"),
              ("--ro-bind", str(job.inputs), f"{JOB}/in"),
              ("--bind", str(job.out), f"{JOB}/out"), ("--bind", str(job.tmp), f"{JOB}/tmp")]
    binds += [("--ro-bind", src, dst) for src, dst in extra_ro]  # may land inside job/tmp
    cmd += _parent_dirs([b[2] for b in binds])
    for b in binds:
        cmd += list(b)
    bound_hosts = [_real(s) for s, _ in [*python_paths(), *extra_ro]] + system + [code]
    for hidden in policy.hidden:
        if _covered(str(hidden), bound_hosts) and hidden.is_dir():
            cmd += ["--tmpfs", str(hidden)]  # shadowed: the sandbox sees an empty directory
    cmd += ["--chdir", f"{JOB}/tmp", "--"]
    if root:
        cmd += ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    cmd += ["prlimit", f"--as={policy.memory_bytes}", f"--cpu={policy.cpu_seconds}",
            f"--fsize={policy.file_bytes}", f"--nproc={policy.processes}",
            f"--nofile={policy.open_files}", "--core=0", "--"]
    cmd += program if program is not None else [
        os.path.abspath(sys.executable), "-s", "-B", "-m", "server.compile.child",
        f"{JOB}/in/request.json"]
    return cmd


def _tree_bytes(*roots: Path, limit_entries: int = 200_000) -> int:
    total, seen = 0, 0
    stack = list(roots)
    while stack and seen < limit_entries:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    seen += 1
                    if e.is_dir(follow_symlinks=False):
                        stack.append(Path(e.path))
                    else:
                        total += e.stat(follow_symlinks=False).st_blocks * 512
        except OSError:
            continue
    return total


@dataclass
class ChildRun:
    """How a sandboxed child ended: exit status, why it was killed, its stderr tail."""

    returncode: int
    killed_for: str = ""
    stderr_tail: str = ""
    seconds: float = 0.0
    lines: int = 0
    notes: list[str] = field(default_factory=list)

    def failure(self) -> str:
        if self.killed_for:
            why = self.killed_for
        elif self.returncode < 0:
            sig = signal.Signals(-self.returncode).name
            hint = {"SIGXCPU": " (CPU time limit)", "SIGXFSZ": " (file size limit)",
                    "SIGKILL": " (killed, e.g. out of memory)"}.get(sig, "")
            why = f"the sandboxed compile was killed by {sig}{hint}"
        else:
            why = f"the sandboxed compile exited with status {self.returncode}"
        tail = self.stderr_tail.strip().splitlines()[-6:]
        return why + (": " + " | ".join(tail) if tail else "")


def _pump_lines(stream: IO[bytes], log_fn: Log, run: ChildRun) -> None:
    while line := stream.readline(MAX_LOG_LINE):
        run.lines += 1
        log_fn(line.decode("utf-8", "replace").rstrip("\n"))


def _pump_tail(stream: IO[bytes], tail: deque[bytes]) -> None:
    while chunk := stream.read(4096):
        tail.append(chunk)


def run_child(cmd: list[str], job: JobDirs, policy: SandboxPolicy, log_fn: Log) -> ChildRun:
    """Runs the sandbox; forwards the child's progress lines; kills it at the wall-clock
    limit or when it writes more than `policy.output_bytes`."""
    started = time.monotonic()
    exe = shutil.which(cmd[0])
    if exe is None:
        raise SandboxUnavailableError(f"{cmd[0]} not found on PATH; {SETUP_FIX}")
    try:  # an empty environment: bubblewrap's --clearenv/--setenv make the child's
        proc = subprocess.Popen([exe, *cmd[1:]], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, env={})
    except OSError as e:
        raise SandboxUnavailableError(f"the compile sandbox could not start ({e}); "
                                      f"{SETUP_FIX}") from e
    assert proc.stdout is not None and proc.stderr is not None
    run = ChildRun(returncode=0)
    tail: deque[bytes] = deque(maxlen=STDERR_TAIL // 4096 + 2)
    pumps = [threading.Thread(target=_pump_lines, args=(proc.stdout, log_fn, run), daemon=True),
             threading.Thread(target=_pump_tail, args=(proc.stderr, tail), daemon=True)]
    for t in pumps:
        t.start()
    deadline = started + policy.wall_seconds
    while proc.poll() is None:
        if time.monotonic() > deadline:
            run.killed_for = (f"the sandboxed compile ran longer than {policy.wall_seconds:.0f}s "
                              "(wall-clock limit) and was killed")
        elif _tree_bytes(job.out, job.tmp) > policy.output_bytes:
            run.killed_for = (f"the sandboxed compile wrote more than {policy.output_bytes} "
                              "bytes (output limit) and was killed")
        if run.killed_for:
            _kill(proc)
            break
        try:
            proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
    proc.wait()
    for t in pumps:
        t.join(timeout=5)
    run.returncode = proc.returncode
    run.seconds = time.monotonic() - started
    run.stderr_tail = b"".join(tail)[-STDERR_TAIL:].decode("utf-8", "replace")
    return run


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


_PROBE: dict[str, str] = {}


def probe(bwrap: str = "bwrap") -> None:
    """Raises SandboxUnavailableError unless bwrap, setpriv and prlimit can run a sandbox here
    (checked once per process)."""
    if "ok" in _PROBE:
        return
    missing = [t for t in (bwrap, "prlimit") + (("setpriv",) if os.geteuid() == 0 else ())
               if shutil.which(t) is None]
    if missing:
        raise SandboxUnavailableError(
            f"the compile sandbox needs {', '.join(missing)}, not found on PATH; {SETUP_FIX}")
    cmd = [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc",
           "--dev", "/dev", "--", "/bin/true"]
    try:
        res = subprocess.run(cmd, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxUnavailableError(f"bubblewrap cannot run here ({e}); {SETUP_FIX}") from e
    if res.returncode != 0:
        err = res.stderr.decode("utf-8", "replace").strip()[:500]
        raise SandboxUnavailableError(
            f"bubblewrap cannot create namespaces here ({err}); in a container allow them "
            f"(docker: security_opt seccomp/apparmor, see docs/security.md); {SETUP_FIX}")
    _PROBE["ok"] = "yes"


def _request(spec: BuildSpec, names: dict[str, str]) -> dict[str, Any]:
    return {"source": f"{JOB}/in/{names['model']}", "format": spec.source_format.value,
            "variants": {v: [i.to_dict() for i in inputs] for v, inputs in spec.variants.items()},
            "platforms": list(spec.platforms), "settings": spec.settings,
            "calibration": f"{JOB}/in/{names['calibration']}" if spec.calibration_path else None,
            "reference": f"{JOB}/in/{names['reference']}" if spec.reference_path else None,
            "watermark": spec.watermark.to_dict() if spec.watermark else None,
            "out": f"{JOB}/out"}


def _tools(policy: SandboxPolicy) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The deployment's extra tools for the child (request keys) and their read-only binds."""
    if not policy.aimet_python:
        return {}, []
    return ({"aimet_python": os.path.abspath(policy.aimet_python)},
            foreign_python_paths(policy.aimet_python))


def _hub_config(spec: BuildSpec) -> list[tuple[str, str]]:
    """qnn-hub compiles in Qualcomm's cloud: that build gets network and the AI Hub client
    config (read-only) — and nothing else secret."""
    if "qnn-hub" not in spec.platforms:
        return []
    from server.compile.compilers.qnn_hub import config_path, has_config

    return [(str(config_path()), f"{JOB}/tmp/.qai_hub/client.ini")] if has_config() else []


class SandboxedPipeline:
    """`Pipeline.build` run in a bubblewrap sandbox; returns only validated outcomes."""

    def __init__(self, policy: SandboxPolicy, log: Log | None = None) -> None:
        self.policy = policy  # the wiring's (server/wiring.py `sandboxed_builds`)
        self._log = log or (lambda _msg: None)

    def build(self, spec: BuildSpec, workdir: Path) -> list[BuildOutcome]:
        probe()
        job = JobDirs(workdir / "sandbox")
        job.create()
        names: dict[str, str] = {}
        for kind, path in (("model", spec.source_path), ("calibration", spec.calibration_path),
                           ("reference", spec.reference_path)):
            if path is not None:
                names[kind] = f"{kind}{path.suffix}"
                try:  # same file system: no second copy of a multi-GB model
                    os.link(path, job.inputs / names[kind])
                except OSError:
                    shutil.copyfile(path, job.inputs / names[kind])
                os.chmod(job.inputs / names[kind], 0o644)
        tools, tool_binds = _tools(self.policy)
        (job.inputs / "request.json").write_text(json.dumps({**_request(spec, names),
                                                             **tools}))
        hub = _hub_config(spec)
        if hub:
            (job.tmp / ".qai_hub").mkdir()
            (job.tmp / ".qai_hub" / "client.ini").touch()
        cmd = bwrap_command(self.policy, job, network=bool(hub), extra_ro=[*tool_binds, *hub])
        self._log(f"sandbox: compiling in bubblewrap (no network{'' if not hub else ' but AI Hub'}"
                  f", uid {NOBODY if os.geteuid() == 0 else os.geteuid()}, "
                  f"{self.policy.memory_bytes // (1024 * 1024)} MiB, "
                  f"{self.policy.wall_seconds:.0f}s)")
        run = run_child(cmd, job, self.policy, self._log)
        result_path = job.out / RESULT_FILE
        if run.killed_for or (not result_path.exists() and run.returncode != 0):
            raise CompileError(run.failure())
        result = read_result(job.out, spec)
        if result.transient:
            raise TransientCompileError(result.error)
        if result.error:
            raise CompileError(result.error)
        self._log(f"sandbox: child finished in {run.seconds:.1f}s; "
                  f"{len(result.outcomes)} outcome(s) validated")
        return result.outcomes


def pipeline_factory(policy: SandboxPolicy) -> Callable[[Log], Builder]:
    """What `BuildRunner` gets: sandboxed builds, or — with the development opt-out — the
    in-process pipeline, announced in the server log and in every build log."""
    if policy.enabled:
        try:
            probe()
        except SandboxUnavailableError as e:  # builds will fail closed; say so at start
            log.error("compile sandbox unavailable, every build will fail: %s", e)
        return lambda log_fn: SandboxedPipeline(policy, log_fn)
    log.warning("MODELFLEET_SANDBOX=off: uploaded models are opened INSIDE this process, with "
                "access to its keys, database and files. Never do this outside development.")

    def unsandboxed(log_fn: Log) -> Builder:
        log_fn("WARNING: sandbox off (MODELFLEET_SANDBOX=off): compiling in-process")
        return Pipeline(default_compilers(policy.aimet_python), log=log_fn)

    return unsandboxed
