"""The whole codebase is type-checked strictly: `scripts/test` runs `mypy` over `manifests`,
`client_sdk` and `server`, pyproject makes all three strict, and the few `type: ignore`s left
silence one named error of a third-party API and say why."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STRICT_PACKAGES = ("manifests", "client_sdk", "server", "modelfleet")
IGNORE = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[a-z0-9-]+(?:,\s*[a-z0-9-]+)*\])?(?P<rest>.*)")


def test_pyproject_makes_every_package_strict() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    strict = {m.removesuffix(".*") for o in config.get("overrides", []) if o.get("strict")
              for m in o["module"]}
    assert set(STRICT_PACKAGES) <= strict, f"not strict: {set(STRICT_PACKAGES) - strict}"


def test_scripts_test_type_checks_every_package() -> None:
    runs = [shlex.split(line) for line in (ROOT / "scripts" / "test").read_text().splitlines()
            if line.strip().startswith(".venv/bin/mypy")]
    assert runs, "scripts/test does not run mypy"
    checked = {arg for run in runs for arg in run[1:] if not arg.startswith("-")}
    assert set(STRICT_PACKAGES) <= checked, f"not type-checked: {set(STRICT_PACKAGES) - checked}"


def test_every_type_ignore_names_its_error_and_reason() -> None:
    bad = []
    for package in STRICT_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            lines = path.read_text().splitlines()
            for n, line in enumerate(lines):
                m = IGNORE.search(line)
                if m is None:
                    continue
                reason = m["rest"].strip(" #") or (n > 0 and lines[n - 1].strip().startswith("#"))
                if not m["codes"] or not reason:
                    bad.append(f"{path.relative_to(ROOT)}:{n + 1}: {line.strip()}")
    assert bad == [], "a type: ignore needs an error code and a reason (comment on the line " \
        "or just above):\n" + "\n".join(bad)
