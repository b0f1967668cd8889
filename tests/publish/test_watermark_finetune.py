"""A marked file fine-tuned by its thief (issue 23: "robust to … a light fine-tune"): the
leak is trained in PyTorch on a task of the attacker's (tests/publish/finetune.py) and
identified as the server identifies it — against the unmarked artifact, on the positions the
mark moved. A light fine-tune leaves the cohort named; a heavy one, which moves the weights
by several percent, may wash the mark out, but never makes it name a wrong cohort.
(Figures over more models and fine-tunes: bench/compile/watermark_finetune.py,
docs/benchmarks.md.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from server import watermark as wm
from server.compile import weights
from server.compile.cohorts import mark_copy
from tests.publish import finetune
from tests.publish.finetune import fine_tune, parameter_map
from tests.publish.test_watermark_files import mlp_onnx

pytestmark = pytest.mark.slow
KEY = b"release key for the fine-tune tests"
COHORTS = 64
COHORT = 17


def identified(leak: Path, unmarked: Path, marked: Path) -> wm.Identified:
    return finetune.identified(leak, unmarked, marked, KEY, COHORTS)


def mlp_module(unmarked: Path) -> Any:
    """The MLP of `mlp_onnx` (x @ w0 @ w1 @ w2) as a PyTorch module, unmarked weights."""
    import torch

    values = {t.name: t.values for t in weights.read(unmarked)}
    shapes = {"w0": (64, 1024), "w1": (1024, 1024), "w2": (1024, 10)}

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for name, shape in shapes.items():
                self.register_parameter(name, torch.nn.Parameter(
                    torch.from_numpy(values[name].reshape(shape).copy())))

        def forward(self, x: Any) -> Any:
            return x @ self.w0 @ self.w1 @ self.w2

    return MLP()


def new_task(module: Any, size: float) -> Any:
    """The attacker's task: the model's own outputs plus a new linear term of `size` (a
    fresh batch per step)."""
    import torch

    torch.manual_seed(1)
    base = {n: p.detach().clone() for n, p in module.named_parameters()}
    extra = torch.randn(64, 10) * size

    def loss() -> Any:
        x = torch.randn(32, 64)
        with torch.no_grad():
            y = x @ base["w0"] @ base["w1"] @ base["w2"] + x @ extra
        return ((module(x) - y) ** 2).mean()

    return loss


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("wmft")
    orig = mlp_onnx(tmp / "orig.onnx")
    return {"orig": orig, "marked": mark_copy(orig, tmp / "c17.onnx", KEY, COHORT), "tmp": tmp}


@pytest.mark.parametrize("optimizer,lr,steps,size", [
    ("sgd", 0.01, 200, 0.1), ("adamw", 1e-5, 200, 0.03), ("adamw", 1e-4, 50, 0.03)])
def test_light_fine_tune_of_a_leaked_mlp_still_names_its_cohort(mlp, optimizer, lr, steps,
                                                                 size):
    module = mlp_module(mlp["orig"])
    mapping = parameter_map(mlp["orig"], module)
    assert sorted(mapping) == ["w0", "w1", "w2"]
    tuned = fine_tune(mlp["marked"], mlp["tmp"] / f"ft-{optimizer}-{lr}.onnx", module,
                      mapping, new_task(module, size), steps=steps, lr=lr,
                      optimizer=optimizer)
    # A real fine-tune: the new task learned, every weight moved by far more than the mark's
    # one FP16 step (2^-11 ≈ 0.05% of |w|).
    assert tuned.loss_after < 0.2 * tuned.loss_before, tuned
    assert tuned.moved_share > 0.9 and tuned.median_change > 0.002, tuned
    got = identified(tuned.path, mlp["orig"], mlp["marked"])
    assert got.cohort == COHORT and got.false_positive <= 1e-9, (tuned, got)


def test_heavy_fine_tune_washes_the_mark_out_but_never_names_a_wrong_cohort(mlp):
    module = mlp_module(mlp["orig"])
    tuned = fine_tune(mlp["marked"], mlp["tmp"] / "ft-heavy.onnx", module,
                      parameter_map(mlp["orig"], module), new_task(module, 0.3),
                      steps=200, lr=0.01, optimizer="sgd")
    assert tuned.median_change > 0.02, tuned  # weights moved by > 2%: a retraining
    got = identified(tuned.path, mlp["orig"], mlp["marked"])
    assert got.cohort in (COHORT, None), got
    if got.cohort is None:
        assert got.false_positive > 1e-9


PAIRS = [("A man is playing a guitar on the street.", "Someone plays the guitar outside.", 0.9),
         ("The new movie is awesome, I loved every minute of it.", "I enjoyed the film.", 0.85),
         ("Quarterly revenue grew by twelve percent.", "A man is playing a guitar.", 0.0),
         ("Can you recommend a good restaurant near the train station?",
          "Where can I eat close to the station?", 0.9),
         ("The cat sleeps on the sofa.", "Revenue grew by twelve percent this year.", 0.0),
         ("It is raining heavily today.", "The weather is very wet today.", 0.8)]


def sentence_pairs_task(module: Any) -> Any:
    """Sentence-similarity fine-tuning (mean-pooled embeddings, cosine regression on labelled
    pairs), the recipe sentence-transformers trains all-MiniLM-L6-v2 with."""
    import torch
    from tokenizers import Tokenizer

    from tests.corpus import fetch

    tok = Tokenizer.from_file(str(fetch.minilm_dir() / "tokenizer.json"))
    tok.enable_padding(length=32)
    tok.enable_truncation(max_length=32)

    def encoded(texts: tuple[str, ...]) -> tuple[Any, Any]:
        enc = tok.encode_batch(list(texts))
        return (torch.tensor([e.ids for e in enc]),
                torch.tensor([e.attention_mask for e in enc]))

    left, right, labels = zip(*PAIRS, strict=True)
    a, b, y = encoded(left), encoded(right), torch.tensor(labels)

    def embedding(ids: Any, mask: Any) -> Any:
        hidden, m = module(ids, mask), mask.unsqueeze(-1).float()
        return (hidden * m).sum(1) / m.sum(1)

    def loss() -> Any:
        cos = torch.nn.functional.cosine_similarity(embedding(*a), embedding(*b))
        return ((cos - y) ** 2).mean()

    return loss


def test_minilm_leak_fine_tuned_on_sentence_pairs_still_names_its_cohort(tmp_path):
    """Real weights, the usual recipe: AdamW at 2e-5 (BERT's fine-tuning rate), 30 steps."""
    from tests.corpus.models import _minilm, corpus

    (model,) = corpus(["minilm-l6-dynamo"])
    marked = mark_copy(model.path, tmp_path / "c17.onnx", KEY, COHORT)
    module = _minilm().train()
    mapping = parameter_map(model.path, module)
    markable = {t.name for t in weights.read(model.path) if t.markable}
    assert markable <= set(mapping), markable - set(mapping)  # every marked tensor retrained
    tuned = fine_tune(marked, tmp_path / "ft.onnx", module, mapping,
                      sentence_pairs_task(module), steps=30, lr=2e-5)
    assert tuned.loss_after < 0.5 * tuned.loss_before, tuned
    # Adam moves every weight the task reaches by ~lr a step: far more than one FP16 step of
    # a typical weight (|w| ≈ 0.04: 2e-5); the embedding rows of unused tokens stay put.
    assert tuned.moved_share > 0.4 and tuned.median_change > 0.002, tuned
    got = identified(tuned.path, model.path, marked)
    assert got.cohort == COHORT and got.false_positive <= 1e-9, (tuned, got)
    assert np.isfinite(got.z)
