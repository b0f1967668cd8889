"""The wiring owns every default (server/wiring.py): no module of the server builds a compile
sandbox of its own when none was handed to it, so the sandbox every build runs in is the one
the deployment's settings chose (its memory and time limits, the directories it hides)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from server.compile.sandbox import SandboxedPipeline
from server.jobs.runner import BuildRunner

SERVER = Path(__file__).resolve().parents[2] / "server"
WIRING = SERVER / "wiring.py"


def _policy_builders(path: Path) -> list[int]:
    """Lines of `path` that build a SandboxPolicy (a call of it, or of one of its methods)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else (
            func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
            else None)
        if name == "SandboxPolicy":
            lines.append(node.lineno)
    return lines


def test_only_the_wiring_builds_a_sandbox_policy() -> None:
    found = {str(p.relative_to(SERVER)): lines for p in sorted(SERVER.rglob("*.py"))
             if p != WIRING and (lines := _policy_builders(p))}
    assert found == {}, found
    assert _policy_builders(WIRING), "the wiring builds the deployment's sandbox policy"


def test_build_runner_and_sandboxed_pipeline_take_their_sandbox_from_the_caller() -> None:
    runner = inspect.signature(BuildRunner).parameters["pipeline_factory"]
    pipeline = inspect.signature(SandboxedPipeline).parameters["policy"]
    assert runner.default is inspect.Parameter.empty
    assert pipeline.default is inspect.Parameter.empty
