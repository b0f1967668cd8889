"""How much of a corpus model's accuracy survives INT8 weights, before any compiler is involved:

    python -m bench.compile.int8_sensitivity [--models ppocr-det,ppocr-rec,...]
        [--blocks 32,16,8,4,1] [--top 5] [--keep 25]
        [--smoothquant-python PATH --alphas 0.5,0.75,1.0]

Each model's weights (input 1 of every Conv, ConvTranspose, Gemm and MatMul, inputs 1–2 of
LSTM / GRU / RNN, ≥ 64 values; Constant nodes count as initializers, as paddle2onnx writes
them) are rounded to symmetric INT8 and back — one scale per output channel, or per output
channel and block of B input channels (the kernel's spatial extent inside the block) — and
the model runs in onnxruntime against its FP32 self on the corpus's reference inputs (worst
output SNR over all samples). The FP16 row rounds the same weights to float16. Activations
stay float: this is the floor any weight quantizer starts from, coremltools' or the QNN
compiler's, and the seed's INT8 threshold is SNR > 40 dB (issue 22).

The baseline is FP16 (what ships when INT8 cannot); "most sensitive" lists the tensors
that alone, INT8 per channel, cost the most; "kept float" keeps those in float, most
sensitive first, until the rest at INT8 per channel reach 40 dB or `--keep` tensors are kept
(a mixed-precision build's best case: its share of the weights and the SNR it reaches).

With `--smoothquant-python` (a venv with neural-compressor 2.x, see smoothquant_worker.py)
each α adds a column: the model after SmoothQuant's input-channel scaling (the
activation-aware rescaling that moves range from large activations into their weights),
then INT8 per channel as above, against the original FP32 outputs; "float" beside it is the
smoothed model unrounded (the transform's own error, which must be negligible).
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

# The axis of a weight's output channels, by the op that reads it (input index 1).
OUT_AXIS = {"Conv": 0, "ConvTranspose": 1, "MatMul": -1, "LSTM": 1, "GRU": 1, "RNN": 1}
MIN_VALUES = 64
THRESHOLD_DB = 40.0  # the seed's INT8 SNR threshold


def _with_constants_as_initializers(model: Any) -> Any:
    import onnx

    nodes = []
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            t = onnx.TensorProto()
            t.CopyFrom(node.attribute[0].t)
            t.name = node.output[0]
            model.graph.initializer.append(t)
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def weight_axes(model: Any) -> dict[str, int]:
    """Weight name → its output-channel axis, for the ops named in the module docstring."""
    from onnx import numpy_helper

    sizes = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    out: dict[str, int] = {}
    for node in model.graph.node:
        names: list[str] = []
        if node.op_type in OUT_AXIS:
            names = list(node.input[1:3] if node.op_type in ("LSTM", "GRU", "RNN")
                         else node.input[1:2])
            axis = OUT_AXIS[node.op_type]
        elif node.op_type == "Gemm" and len(node.input) > 1:
            names = [node.input[1]]
            trans = next((a.i for a in node.attribute if a.name == "transB"), 0)
            axis = 0 if trans else 1
        for name in names:
            w = sizes.get(name)
            if w is not None and w.dtype == np.float32 and w.size >= MIN_VALUES and w.ndim >= 2:
                out[name] = axis % w.ndim
    return out


def int8(w: np.ndarray, axis: int, block: int = 0) -> np.ndarray:
    """`w` through symmetric INT8 with a scale per output channel (`block` 0) or per output
    channel and block of `block` input channels (the axis after the output one)."""
    wa = np.moveaxis(w, axis, 0)
    flat = wa.reshape(wa.shape[0], wa.shape[1] if block else 1, -1)
    out = np.empty_like(flat)
    step = block or flat.shape[1]
    for start in range(0, flat.shape[1], step):
        part = flat[:, start:start + step, :]
        scale = np.abs(part).reshape(part.shape[0], -1).max(axis=1)[:, None, None] / 127
        scale[scale == 0] = 1
        out[:, start:start + step, :] = np.clip(np.round(part / scale), -127, 127) * scale
    return np.moveaxis(out.reshape(wa.shape), 0, axis).astype(w.dtype)


class Runner:
    def __init__(self, model: Any, feeds: dict[str, np.ndarray],
                 reference: list[np.ndarray] | None = None) -> None:
        """`reference`: the outputs to judge against (default: this model's own)."""
        self.model, self.feeds = model, feeds
        self.reference = self.run({}) if reference is None else reference

    def run(self, replaced: dict[str, np.ndarray]) -> list[np.ndarray]:
        import onnx
        import onnxruntime as ort
        from onnx import numpy_helper

        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        for init in model.graph.initializer:
            if init.name in replaced:
                init.CopyFrom(numpy_helper.from_array(replaced[init.name], init.name))
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        samples = next(iter(self.feeds.values())).shape[0]
        runs = [session.run(None, {k: v[i] for k, v in self.feeds.items()})
                for i in range(samples)]
        return [np.concatenate([r[j].reshape(-1) for r in runs]) for j in range(len(runs[0]))]

    def snr(self, replaced: dict[str, np.ndarray]) -> float:
        worst = np.inf
        for ref, got in zip(self.reference, self.run(replaced), strict=True):
            ref64 = ref.astype(np.float64)
            noise = np.sum((ref64 - got) ** 2)
            worst = min(worst, 10 * np.log10(np.sum(ref64 ** 2) / max(noise, 1e-30)))
        return float(worst)


def smoothed_int8(runner: Runner, model: Any, samples: str, python: str,
                  alpha: float) -> tuple[float, float] | str:
    """(float SNR, INT8-per-channel SNR) of `model` after SmoothQuant at `alpha`, run by the
    worker in the neural-compressor venv, against `runner`'s FP32 reference outputs; or
    the worker's last error line when SmoothQuant fails on the model."""
    import onnx
    from onnx import numpy_helper

    worker = Path(__file__).with_name("smoothquant_worker.py")
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp, "src.onnx"), Path(tmp, "smoothed.onnx")
        onnx.save(model, str(src))
        done = subprocess.run([python, str(worker), str(src), samples, str(alpha), str(out)],
                              check=False, capture_output=True, timeout=1800)
        if done.returncode != 0:
            lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
            return "failed: " + (lines[-1][:120] if lines else f"exit {done.returncode}")
        smoothed = onnx.load(str(out))
    other = Runner(smoothed, runner.feeds, runner.reference)
    axes = weight_axes(smoothed)
    weights = {i.name: numpy_helper.to_array(i) for i in smoothed.graph.initializer
               if i.name in axes}
    return other.snr({}), other.snr({n: int8(w, axes[n]) for n, w in weights.items()})


def measure(name: str, blocks: list[int], top: int, keep: int,
            smoothquant: tuple[str, list[float]] | None = None) -> dict[str, Any]:
    import onnx
    from onnx import numpy_helper

    from tests.corpus.models import corpus

    entry = corpus([name])[0]
    model = _with_constants_as_initializers(onnx.load(str(entry.path)))
    feeds = dict(np.load(entry.reference))
    runner = Runner(model, feeds)
    axes = weight_axes(model)
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer
               if i.name in axes}
    row: dict[str, Any] = {"model": name, "weights": sum(w.size for w in weights.values()),
                           "fp16": runner.snr({n: w.astype(np.float16).astype(np.float32)
                                               for n, w in weights.items()})}
    for block in [0, *blocks]:
        row[f"block{block}"] = runner.snr({n: int8(w, axes[n], block)
                                           for n, w in weights.items()})
    alone = sorted((runner.snr({n: int8(w, axes[n])}), n, w.size) for n, w in weights.items())
    row["sensitive"] = alone[:top]
    if smoothquant is not None:
        python, alphas = smoothquant
        row["smoothquant"] = [smoothed_int8(runner, model, str(entry.reference), python, a)
                              for a in alphas]
    kept: set[str] = set()
    for _, worst, _ in alone[:keep]:
        kept.add(worst)
        snr = runner.snr({n: int8(w, axes[n]) for n, w in weights.items() if n not in kept})
        row["kept"] = (len(kept), sum(weights[n].size for n in kept) / row["weights"], snr)
        if snr >= THRESHOLD_DB:
            break
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="ppocr-det,ppocr-rec,ppocrv5-det,ppocrv5-rec")
    parser.add_argument("--blocks", default="32,16,8,4,1")
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--keep", type=int, default=25)
    parser.add_argument("--smoothquant-python", default=None,
                        help="python of a venv with neural-compressor 2.x (adds SmoothQuant)")
    parser.add_argument("--alphas", default="0.5,0.75,1.0")
    args = parser.parse_args()
    blocks = [int(b) for b in args.blocks.split(",") if b]
    alphas = [float(a) for a in args.alphas.split(",") if a] if args.smoothquant_python else []
    smoothquant = (args.smoothquant_python, alphas) if args.smoothquant_python else None
    print(f"INT8 weights (symmetric, activations float) vs FP32, worst output SNR dB, "
          f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")
    head = ["model", "weights", "FP16 (baseline)", "INT8 per channel",
            *[f"block {b}" for b in blocks],
            *[f"SmoothQuant α {a} → INT8 per channel (float)" for a in alphas],
            "kept float: tensors (weights) → dB", "most sensitive alone (per channel)"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name in args.models.split(","):
        row = measure(name, blocks, args.top, args.keep, smoothquant)
        count, share, snr = row["kept"]
        worst = ", ".join(f"{n} ({size:,}) {snr:.1f}" for snr, n, size in row["sensitive"])
        cells = [name, f"{row['weights']:,}", f"{row['fp16']:.1f}", f"{row['block0']:.1f}",
                 *[f"{row[f'block{b}']:.1f}" for b in blocks],
                 *[r if isinstance(r, str) else f"{r[1]:.1f} ({r[0]:.0f})"
                   for r in row.get("smoothquant", [])],
                 f"{count} ({share:.0%}) → {snr:.1f}", worst]
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
