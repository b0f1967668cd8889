"""The sandboxed side of a build: `python -m server.compile.child /job/in/request.json`.

Started by `server.compile.sandbox` inside bubblewrap; everything it can see is its job
directory and read-only code. It runs the unchanged `Pipeline` and writes `result.json`
(outcomes with artifact paths relative to the output directory, or an error with its kind)
into the output directory. Progress lines go to the original stdout, which the parent
forwards to the build log; anything else printed (by converters or by the model's own code)
goes to stderr, which the parent shows only when the child crashes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from server.compile.cohorts import WatermarkSpec
from server.compile.compilers.registry import default_compilers
from server.compile.errors import CompileError, TransientCompileError
from server.compile.pipeline import BuildOutcome, BuildSpec, Pipeline
from server.compile.sandbox_result import RESULT_FILE
from server.compile.types import InputSpec, SourceFormat


def _spec(req: dict[str, Any]) -> BuildSpec:
    def opt(key: str) -> Path | None:
        value = req.get(key)
        return Path(value) if value else None

    return BuildSpec(
        source_path=Path(req["source"]), source_format=SourceFormat(req["format"]),
        variants={name: tuple(InputSpec.from_dict(i) for i in inputs)
                  for name, inputs in req["variants"].items()},
        platforms=tuple(req["platforms"]), settings=dict(req["settings"]),
        calibration_path=opt("calibration"), reference_path=opt("reference"),
        watermark=WatermarkSpec.from_dict(req["watermark"]) if req.get("watermark") else None)


def _outcome(o: BuildOutcome, out: Path) -> dict[str, Any]:
    doc = o.to_dict()
    if o.artifact is not None:
        doc["artifact"]["path"] = o.artifact.path.relative_to(out).as_posix()
    for entry, c in zip(doc["cohorts"], o.cohorts, strict=True):
        entry["path"] = c.path.relative_to(out).as_posix()
    return doc


def _write(out: Path, doc: dict[str, Any]) -> None:
    tmp = out / f".{RESULT_FILE}.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, out / RESULT_FILE)


def main(argv: list[str]) -> int:
    progress = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8", errors="replace")
    os.dup2(2, 1)  # stray prints (converters, model code) go to stderr from here on
    sys.stdout = sys.stderr

    def log(msg: str) -> None:
        progress.write(msg.replace("\n", " ") + "\n")

    req = json.loads(Path(argv[1]).read_text())
    out = Path(req["out"])
    try:
        # The deployment's AIMET interpreter, put in the request by the sandbox (never a
        # version setting: the uploader does not choose what runs).
        compilers = default_compilers(str(req.get("aimet_python") or ""))
        outcomes = Pipeline(compilers, log=log).build(_spec(req), out / "work")
        doc: dict[str, Any] = {"outcomes": [_outcome(o, out) for o in outcomes]}
    except TransientCompileError as e:
        doc = {"error": {"kind": "transient", "message": str(e)}}
    except CompileError as e:
        doc = {"error": {"kind": "compile", "message": str(e)}}
    except Exception as e:  # the model's own code may raise anything
        doc = {"error": {"kind": "internal", "message": f"{type(e).__name__}: {e}"}}
    _write(out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
