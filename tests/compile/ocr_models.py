"""Inputs for the PP-OCR upload tests: the shapes RapidOCR feeds PP-OCRv4 and a page-like
image (the models themselves come from `tests.corpus.fetch.ppocr_model`, which fetches the
`rapidocr-onnxruntime` wheel into a cache outside git; nothing is committed).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

# The shapes RapidOCR feeds them: a 640×640 page for detection, a 48×320 text line.
SHAPES = {"det": (1, 3, 640, 640), "rec": (1, 3, 48, 320)}


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
