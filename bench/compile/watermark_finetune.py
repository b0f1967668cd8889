"""How a per-cohort watermark holds when the thief fine-tunes the leaked file (issue 23):

    python -m bench.compile.watermark_finetune [--models mlp,minilm-l6-dynamo,...]

Each model's ONNX file is marked as cohort 17 of 64 (server/compile/cohorts.py `mark_copy`,
strength 1: the weakest the pipeline ships), loaded into its PyTorch module, trained on a
task of the attacker's (tests/publish/finetune.py) and identified as the server identifies a
leak (against the unmarked file, on the positions the mark moved). Baseline in the same run:
the same marked file after 1% Gaussian weight noise (the issue's other attack). Columns: the
fine-tune (optimizer, learning rate × steps), the task loss before → after, the share of the
weights it moved by more than one FP16 step (more than the mark moved them) and their median
|Δw|/|w|, and what identify names (cohort, z; 7.05 names one of 64 at ≤ 1e-9).

Models: `mlp` (tests/publish/test_watermark_files.py: 64 → 1024 → 1024 → 10, task: its own
outputs plus a new linear term), `minilm-l6-dynamo` (real weights; sentence-pair cosine
regression, the sentence-transformers recipe), `vit-tiny-dynamo` (labelled random images),
`gpt2-tiny-dynamo` (next-token loss on random text); the corpus's seeded builds.
"""

from __future__ import annotations

import argparse
import datetime
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

KEY = b"bench watermark fine-tune key"
COHORTS, COHORT = 64, 17
Task = Callable[[Any], Callable[[], Any]]

# (optimizer, lr, steps, task size: the new term's scale, used by `mlp` only)
LIGHT_TO_HEAVY = {
    "mlp": [("sgd", 0.01, 200, 0.1), ("adamw", 1e-5, 200, 0.03), ("adamw", 1e-4, 50, 0.03),
            ("sgd", 0.01, 200, 0.3), ("adamw", 1e-4, 200, 0.3)],
    "default": [("adamw", 2e-5, 30, 0.0), ("adamw", 2e-5, 100, 0.0), ("adamw", 1e-4, 100, 0.0),
                ("adamw", 1e-3, 100, 0.0)],
}


def _classify(module: Any) -> Callable[[], Any]:
    import torch

    gen = torch.Generator().manual_seed(3)
    images = torch.randn(16, 3, 64, 64, generator=gen)
    labels = torch.randint(0, 10, (16,), generator=gen)
    return lambda: torch.nn.functional.cross_entropy(module(images), labels)


def _next_token(module: Any) -> Callable[[], Any]:
    import torch

    text = torch.randint(0, 4000, (8, 32), generator=torch.Generator().manual_seed(4))

    def loss() -> Any:
        logits = module(text)
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 text[:, 1:].reshape(-1))
    return loss


def _subject(name: str, tmp: Path) -> tuple[Path, Callable[[], Any], Task]:
    """The unmarked ONNX file, a maker of its PyTorch module (unmarked weights), the task."""
    import torch

    from tests.corpus import models
    from tests.publish import test_watermark_finetune as ft
    from tests.publish.test_watermark_files import mlp_onnx

    if name == "mlp":
        path = mlp_onnx(tmp / "mlp.onnx")
        return path, lambda: ft.mlp_module(path), ft.new_task  # type: ignore[return-value]
    (model,) = models.corpus([name])
    make = {"minilm-l6-dynamo": models._minilm, "vit-tiny-dynamo": models._vit,
            "gpt2-tiny-dynamo": models._gpt2}[name]
    task = {"minilm-l6-dynamo": ft.sentence_pairs_task, "vit-tiny-dynamo": _classify,
            "gpt2-tiny-dynamo": _next_token}[name]

    def module() -> Any:
        torch.manual_seed(0)  # as the corpus built it (tests/corpus/models.py)
        return make().train()
    return model.path, module, task


def rows(name: str, tmp: Path) -> list[list[str]]:
    from server.compile import weights
    from server.compile.cohorts import mark_copy
    from tests.publish.finetune import fine_tune, identified, parameter_map
    from tests.publish.test_watermark_files import noisy

    unmarked, make, task = _subject(name, tmp)
    marked = mark_copy(unmarked, tmp / f"{name}-c{COHORT}.onnx", KEY, COHORT)
    from server import watermark as wm

    original = [(t.name, t.values) for t in weights.read(unmarked) if t.markable]
    moved = wm.moved_positions(original, weights.by_name(weights.read(marked)))
    marked_tensors = {n for n, where in moved.items() if where.any()}
    noise = identified(noisy(marked, tmp / f"{name}-noise.onnx"), unmarked, marked, KEY,
                       COHORTS)
    out = [[name, f"{noise.weights:,}", "1% weight noise (baseline)", "—", "1", "1%",
             _named(noise), ""]]
    for optimizer, lr, steps, size in LIGHT_TO_HEAVY.get(name, LIGHT_TO_HEAVY["default"]):
        module = make()
        mapping = parameter_map(unmarked, module)
        missing = marked_tensors - set(mapping)  # would keep their marks untouched
        loss = task(module, size) if name == "mlp" else task(module)  # type: ignore[call-arg]
        started = time.monotonic()
        tuned = fine_tune(marked, tmp / f"{name}-ft.onnx", module, mapping, loss,
                          steps=steps, lr=lr, optimizer=optimizer)
        got = identified(tuned.path, unmarked, marked, KEY, COHORTS)
        out.append([name, f"{got.weights:,}", f"{optimizer} {lr:g} × {steps}",
                    f"{tuned.loss_before:.4g} → {tuned.loss_after:.4g}",
                    f"{tuned.moved_share:.2f}", f"{tuned.median_change:.2%}", _named(got),
                    f"{time.monotonic() - started:.0f}"
                    + (f" ({len(missing)} marked tensors not retrained)" if missing else "")])
        print("| " + " | ".join(out[-1]) + " |", flush=True)
    return out


def _named(got: Any) -> str:
    return f"{got.cohort if got.cohort is not None else 'none'} ({got.z:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,minilm-l6-dynamo,vit-tiny-dynamo,"
                                            "gpt2-tiny-dynamo")
    args = parser.parse_args()
    head = ["model", "weights scored", "fine-tune", "task loss", "moved past the mark",
            "median |Δw|/|w|", "identify (z)", "tune s"]
    print(f"Watermark (cohort {COHORT} of {COHORTS}, strength 1) after a thief's fine-tune, "
          f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")
    table = []
    with tempfile.TemporaryDirectory(prefix="mf-bench-wmft-") as tmp:
        for name in args.models.split(","):
            table += rows(name, Path(tmp))
    print()
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in table:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
