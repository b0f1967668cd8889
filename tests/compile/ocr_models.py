"""Real OCR models for the compile tests: PP-OCRv4 text detection and recognition as the
`rapidocr-onnxruntime` wheel ships them (paddle2onnx, opset 12, dynamic batch/height/width).

The wheel is fetched with pip into a cache outside git (~/.cache/modelfleet/wheels, or
$MODELFLEET_MODEL_CACHE) and the .onnx files are extracted once; nothing is committed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

WHEEL = "rapidocr-onnxruntime==1.4.4"
MODELS = {"det": "ch_PP-OCRv4_det_infer.onnx", "rec": "ch_PP-OCRv4_rec_infer.onnx"}
# The shapes RapidOCR feeds them: a 640×640 page for detection, a 48×320 text line.
SHAPES = {"det": (1, 3, 640, 640), "rec": (1, 3, 48, 320)}


def cache_dir() -> Path:
    root = os.environ.get("MODELFLEET_MODEL_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "modelfleet"


def ocr_model(kind: str) -> Path:
    """The path of the cached PP-OCRv4 `kind` ("det" | "rec") model, fetching it if needed.

    Raises RuntimeError (with pip's output) when the wheel cannot be fetched."""
    out = cache_dir() / "ppocr" / MODELS[kind]
    if out.exists():
        return out
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob("rapidocr_onnxruntime-1.4.4-*.whl"))
    if not found:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                               WHEEL, "-d", str(wheels)], capture_output=True, text=True,
                              timeout=600, check=False)
        found = sorted(wheels.glob("rapidocr_onnxruntime-1.4.4-*.whl"))
        if not found:
            raise RuntimeError(f"pip download {WHEEL} failed: {proc.stderr[-2000:]}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(found[0]) as wheel:
        for name in MODELS.values():
            member = f"rapidocr_onnxruntime/models/{name}"
            tmp = out.parent / f".{name}.part"
            tmp.write_bytes(wheel.read(member))
            tmp.replace(out.parent / name)
    return out


def text_image(shape: tuple[int, ...], seed: int = 0) -> NDArray[np.float32]:
    """A page-like input normalised as PP-OCR does ((pixel/255 - 0.5) / 0.5): light paper with
    dark glyph-sized strokes on text lines. The package ships no images; this exercises the
    same value range and structure (edges, lines) as a scanned page."""
    _, channels, height, width = shape
    rng = np.random.default_rng(seed)
    page = np.full((height, width), 235.0) + rng.normal(0, 6, (height, width))
    line_h = max(height // 12, 8)
    for top in range(line_h // 2, height - line_h, line_h * 2):
        x = int(rng.integers(2, max(width // 10, 3)))
        while x < width - 6:
            w = int(rng.integers(3, max(line_h // 2, 4)))
            h = int(rng.integers(line_h // 2, line_h))
            page[top + line_h - h: top + line_h, x: x + w] = rng.uniform(10, 60)
            x += w + int(rng.integers(2, max(line_h // 2, 3)))
    img = np.clip(page, 0, 255)[None].repeat(channels, axis=0)
    return ((img / 255.0 - 0.5) / 0.5).astype(np.float32)
