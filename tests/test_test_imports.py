"""The test suite is one package: no test module edits sys.path or imports a helper by bare
module name (either makes a test pass alone and fail in the full run, or the other way round,
depending on which directory happened to be put on sys.path first)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def _modules() -> list[Path]:
    return sorted(TESTS.rglob("*.py"))


def _sys_path_edits(tree: ast.AST) -> list[int]:
    """Line numbers of `sys.path.<anything>(...)`, `sys.path[...] = ` and `sys.path = ...`."""
    def is_sys_path(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "path"
                and isinstance(node.value, ast.Name) and node.value.id == "sys")

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and is_sys_path(node.func.value):
            lines.append(node.lineno)
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if is_sys_path(t) or (isinstance(t, ast.Subscript) and is_sys_path(t.value)):
                    lines.append(node.lineno)
    return sorted(lines)


def _local_bare_imports(tree: ast.AST, local: set[str]) -> list[str]:
    """Imports that name a module of tests/ by its bare file name (`from simulator import …`)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in local]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in local:
                found.append(node.module)
    return found


def test_no_test_module_edits_sys_path() -> None:
    offenders = [f"{p.relative_to(REPO)}:{line}" for p in _modules()
                 for line in _sys_path_edits(ast.parse(p.read_text(encoding="utf-8")))]
    assert offenders == [], (
        "test modules must not edit sys.path; import helpers as tests.<area>.<module> or "
        f"move them to tests/support: {offenders}")


def test_no_test_module_imports_a_helper_by_bare_name() -> None:
    # file names of tests/, except those that are also top-level packages of the repository
    local = {p.stem for p in _modules()} - {"__init__"} - {p.stem for p in REPO.iterdir()}
    offenders = [f"{p.relative_to(REPO)}: {name}" for p in _modules()
                 for name in _local_bare_imports(ast.parse(p.read_text(encoding="utf-8")), local)]
    assert offenders == [], f"use package imports (from tests.… import …): {offenders}"


def test_every_test_directory_is_a_package() -> None:
    """Without __init__.py pytest imports a directory's modules by bare name, and two
    test_public_api.py in different folders collide."""
    missing = [str(d.relative_to(REPO)) for d in [TESTS, *TESTS.rglob("*")]
               if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))
               and not (d / "__init__.py").exists()]
    assert missing == []


def test_the_guard_sees_a_sys_path_edit() -> None:
    tree = ast.parse("import sys\nsys.path.insert(0, 'x')\nsys.path[:0] = ['y']\n")
    assert _sys_path_edits(tree) == [2, 3]
    assert _local_bare_imports(ast.parse("from simulator import X\nimport manifests\n"),
                               {"simulator"}) == ["simulator"]
