"""The layers, enforced on the source (every import statement, also function-local and
TYPE_CHECKING ones, read with `ast`): docs/architecture.md draws them.

- `manifests` imports nothing of ours; `client_sdk` only `manifests`.
- `server.api` modules import no `sqlalchemy` (except server/api/deps.py, which opens the
  request's session), `boto3` or `qai_hub`: queries live in server/services and below.
- `server.jobs` and `server.compile` import nothing from `server.api`.
- `server.rollouts` imports nothing above it (api, services, commands, the wiring); publish,
  jobs, compile, db, blobstore and delta import nothing from it.
- `server` takes from the SDK only its public package and the patch format.
- No import cycle between server packages, and none between any two modules of manifests,
  client_sdk, server and modelfleet: every import counts, function-local and TYPE_CHECKING
  ones too. A function-local import only delays the circle to the first call; a
  TYPE_CHECKING one is a dependency all the same (the one module's signatures name the
  other's types, and mypy follows it), so two modules that need each other's names share a
  piece that belongs in a third module of its own. An edge goes to the module named (`from
  a.b import c` is a.b.c when c is a module, else a.b), not to the packages above it: that a
  submodule's import runs its package's __init__ first is how packages work, not a circle.
- No importlib wiring.
- Settings are the only reader of the environment.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = ("manifests", "client_sdk", "server", "modelfleet", "tests", "bench", "scripts")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # what it imports, dotted (`from a import b` gives a.b)
    line: int


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path = ROOT) -> Iterator[Import]:
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield Import(name, f"{base}.{alias.name}" if alias.name != "*" else base,
                             node.lineno)


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def all_imports(package: str) -> list[Import]:
    return [i for path in sources(package) for i in imports_of(path)]


def is_under(target: str, prefix: str) -> bool:
    return target == prefix or target.startswith(prefix + ".")


def ours(target: str) -> bool:
    return any(is_under(target, p) for p in OURS)


def show(found: list[Import]) -> str:
    return "\n".join(f"{i.module}:{i.line} imports {i.target}" for i in found)


def test_manifests_imports_nothing_of_ours() -> None:
    bad = [i for i in all_imports("manifests") if ours(i.target)
           and not is_under(i.target, "manifests")]
    assert not bad, show(bad)


def test_client_sdk_imports_only_manifests() -> None:
    bad = [i for i in all_imports("client_sdk") if ours(i.target)
           and not is_under(i.target, "manifests") and not is_under(i.target, "client_sdk")]
    assert not bad, show(bad)


# The one server.api module that may touch SQLAlchemy, and why: it opens the request's session.
API_SQLALCHEMY_ALLOWED = {"server.api.deps"}


def test_api_modules_import_no_sqlalchemy_boto3_or_qai_hub() -> None:
    bad = [i for i in all_imports("server/api")
           if (is_under(i.target, "sqlalchemy") and i.module not in API_SQLALCHEMY_ALLOWED)
           or is_under(i.target, "boto3") or is_under(i.target, "botocore")
           or is_under(i.target, "qai_hub")]
    assert not bad, show(bad)


@pytest.mark.parametrize("package", ["server/jobs", "server/compile"])
def test_jobs_and_compile_import_nothing_from_the_api(package: str) -> None:
    bad = [i for i in all_imports(package) if is_under(i.target, "server.api")]
    assert not bad, show(bad)


# server/rollouts/ sits between the services and publishing: routes, the fleet's telemetry and
# CLI commands call it; it calls the publisher (signing) and the database, never upwards.
ROLLOUTS_MAY_NOT_IMPORT = ("server.api", "server.services", "server.commands", "server.app",
                           "server.wiring", "server.cli")


def test_rollouts_import_nothing_above_them() -> None:
    bad = [i for i in all_imports("server/rollouts")
           if any(is_under(i.target, p) for p in ROLLOUTS_MAY_NOT_IMPORT)]
    assert not bad, show(bad)


@pytest.mark.parametrize("package", ["server/publish", "server/jobs", "server/compile",
                                     "server/db", "server/blobstore", "server/delta"])
def test_signing_jobs_and_storage_know_no_rollout_policy(package: str) -> None:
    """server/publish keeps signing only: which release goes where, and when, is rollouts'."""
    bad = [i for i in all_imports(package) if is_under(i.target, "server.rollouts")]
    assert not bad, show(bad)


# What the server may take from the SDK: its public package, and the two byte formats both
# sides must agree on exactly — the patch format it writes and the compressed-copy codec
# (client_sdk/compression.py) it compresses with and inflates to identify a leak.
SDK_ALLOWED = ("client_sdk.patching", "client_sdk.compression")


def test_server_takes_only_the_sdk_public_package_and_wire_formats() -> None:
    import client_sdk

    public = {f"client_sdk.{name}" for name in client_sdk.__all__}
    bad = [i for i in all_imports("server") if is_under(i.target, "client_sdk")
           and i.target != "client_sdk" and i.target not in public
           and not any(is_under(i.target, a) for a in SDK_ALLOWED)]
    assert not bad, show(bad)


def server_node(dotted: str) -> str:
    """A server package (server.api, server.jobs, …) or top-level module (server.wiring)."""
    parts = dotted.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else dotted


def server_graph() -> dict[str, set[str]]:
    nodes = {server_node(module_name(p)) for p in sources("server")}
    graph: dict[str, set[str]] = {n: set() for n in nodes}
    for i in all_imports("server"):
        if not is_under(i.target, "server"):
            continue
        src, dst = server_node(i.module), server_node(i.target)
        if dst not in nodes:  # `from server import auth` names the module server.auth
            continue
        if src != dst and src != "server":
            graph[src].add(dst)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_no_import_cycle_between_server_packages() -> None:
    cycle = find_cycle(server_graph())
    assert cycle is None, " → ".join(cycle or [])


def test_the_cycle_check_sees_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


MODULE_PACKAGES = ("manifests", "client_sdk", "server", "modelfleet")


def module_graph(paths: list[Path], root: Path = ROOT) -> dict[str, dict[str, Import]]:
    """Module → {module it imports: the first import statement that does}."""
    modules = {module_name(p, root): p for p in paths}

    def resolve(target: str) -> str | None:  # the longest prefix that is one of the modules
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    graph: dict[str, dict[str, Import]] = {m: {} for m in modules}
    for name, path in modules.items():
        for i in imports_of(path, root):
            dst = resolve(i.target)
            if dst is not None and dst != name:
                graph[name].setdefault(dst, i)
    return graph


def module_cycles(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """Each group of modules that reach one another (Tarjan, iterative), sorted: its
    members, a circle through them (`show_cycle` prints it) follows from `cycle_in`."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)
    return sorted(sorted(g) for g in groups)


def cycle_in(graph: dict[str, dict[str, Import]], group: list[str]) -> list[str]:
    cycle = find_cycle({m: {d for d in graph[m] if d in group} for m in group})
    assert cycle is not None, group
    return cycle


def show_cycle(graph: dict[str, dict[str, Import]], group: list[str]) -> str:
    cycle = cycle_in(graph, group)
    steps = [graph[a][b] for a, b in itertools.pairwise(cycle)]
    return f"{len(group)} modules import one another: {', '.join(group)}\n  e.g. " \
        + " → ".join(cycle) + "\n" + "\n".join(
            f"    {i.module}:{i.line} imports {i.target}" for i in steps)


def test_no_module_imports_a_module_that_imports_it_back() -> None:
    graph = module_graph([p for pk in MODULE_PACKAGES for p in sources(pk)])
    cycles = module_cycles(graph)
    assert not cycles, "import cycles (move the shared piece into a module of its own):\n" \
        + "\n".join(show_cycle(graph, c) for c in cycles)


def test_the_module_cycle_check_sees_function_local_and_type_checking_imports(
        tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg.b import g\n    return g\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from . import c\ng = 1\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    (pkg / "d.py").write_text("from pkg import a\n")  # imports into the circle, not part of it
    graph = module_graph(sorted(pkg.glob("*.py")), tmp_path)
    assert module_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert cycle_in(graph, ["pkg.a", "pkg.b", "pkg.c"]) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    assert "pkg.a:2 imports pkg.b.g" in show_cycle(graph, ["pkg.a", "pkg.b", "pkg.c"])
    (pkg / "c.py").write_text("")
    assert module_cycles(module_graph(sorted(pkg.glob("*.py")), tmp_path)) == []


def dynamic_imports(path: Path) -> Iterator[int]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names]
            mod = getattr(node, "module", None) or ""
            if (any(is_under(n, "importlib") for n in names) or is_under(mod, "importlib")):
                yield node.lineno
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "__import__":
            yield node.lineno


def test_no_importlib_wiring() -> None:
    bad = [f"{p.relative_to(ROOT)}:{line}" for p in sources("server")
           for line in dynamic_imports(p)]
    assert not bad, bad


# Modules that may read the environment besides server/settings.py, and why.
ENV_READERS_ALLOWED = {
    # QAIHUB_CLIENT_INI is the qai_hub client's own variable (not ours): this mirrors the
    # client's lookup to tell "not configured" apart before importing it.
    "server/compile/compilers/qnn_hub.py",
}


def env_read_lines(path: Path) -> list[int]:
    """environ/getenv uses that are not `os.environ[KEY] = value` assignments."""
    tree = ast.parse(path.read_text(), str(path))
    assigned = {id(t.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Subscript)}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
            if id(node) not in assigned:
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                a.name in ("environ", "getenv", "environb") for a in node.names):
            lines.append(node.lineno)
    return sorted(lines)


def test_settings_are_the_only_reader_of_the_environment() -> None:
    bad = []
    for package in ("server", "manifests", "client_sdk"):
        for path in sources(package):
            rel = str(path.relative_to(ROOT))
            if rel in ENV_READERS_ALLOWED or rel == "server/settings.py":
                continue
            bad += [f"{rel}:{line}" for line in env_read_lines(path)]
    assert not bad, f"environment read outside server/settings.py: {bad}"


def test_the_environment_check_tells_reads_from_writes(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text('import os\nos.environ["A"] = "1"\nx = os.environ.get("B")\n'
                     'y = os.getenv("C")\n')
    assert env_read_lines(probe) == [3, 4]
