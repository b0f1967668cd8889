"""The environment of every child process a build starts (the sandboxed build itself, the
HTP child, AIMET's worker): built from nothing, so no server variable reaches a child that
runs code from an upload (database URL, token pepper, S3 or cloud credentials)."""

from __future__ import annotations

from pathlib import Path


def minimal_env(home: str | Path, **extra: str) -> dict[str, str]:
    """Only what an interpreter needs, with `home` as HOME and TMPDIR, plus `extra`."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(home),
            "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", **extra}
