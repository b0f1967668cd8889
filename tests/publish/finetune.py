"""A leaked marked file fine-tuned in PyTorch, as an attacker would (issue 23: the mark must
survive "a light fine-tune"); used by tests/publish/test_watermark_finetune.py and
bench/compile/watermark_finetune.py.

The attacker holds the marked ONNX file and a PyTorch module of the same network (the
architecture is public, or rebuilt from the graph). Each float initializer of the file is
matched to the module's parameter with the same values (as stored, or transposed: exporters
fold a Linear's transpose into a new initializer such as `val_58`), the marked values are
loaded into the module, it is trained on the attacker's task, and the trained values are
written back into a copy of the file under the file's own names. Nothing here knows the
watermark: `identify` later compares the copy with the unmarked artifact, as the server does.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from server import watermark as wm
from server.compile import weights


@dataclass(frozen=True)
class Tuned:
    """A fine-tune's outcome: the task loss before and after, how far the weights moved
    (the share that moved by more than one FP16 step — more than a mark moves them — and
    the median |Δw|/|w| over those) and the file."""

    path: Path
    loss_before: float
    loss_after: float
    median_change: float
    moved_share: float


def _digest(values: np.ndarray[Any, Any]) -> str:
    return hashlib.sha256(np.ascontiguousarray(values, dtype=np.float32).tobytes()).hexdigest()


@dataclass(frozen=True)
class Slot:
    """Where an initializer's values sit in the module: a parameter, stored transposed or
    not, whole or as its first `prefix` values (an exporter folds `wpe[:32]` into a tensor of
    its own)."""

    param: str
    transposed: bool = False
    prefix: int = 0


def parameter_map(unmarked: Path, module: Any) -> dict[str, Slot]:
    """ONNX initializer name → its slot in `module`, for every float initializer of
    `unmarked` whose values are a parameter's, or its leading rows (the module holds the
    unmarked weights when this is called)."""
    import torch

    params = {n: p.detach().numpy().reshape(-1) for n, p in module.named_parameters()
              if p.dtype == torch.float32}
    by_digest: dict[str, Slot] = {}
    for name, p in module.named_parameters():
        if p.dtype != torch.float32:
            continue
        a = p.detach().numpy()
        by_digest[_digest(a)] = Slot(name)
        if a.ndim == 2:
            by_digest.setdefault(_digest(a.T), Slot(name, transposed=True))
    out = {}
    for t in weights.read(unmarked):
        if t.values.dtype != np.float32:
            continue
        slot = by_digest.get(_digest(t.values))
        if slot is None and np.ptp(t.values) > 0:  # (a constant matches any constant run)
            n = t.values.size
            slot = next((Slot(pname, prefix=n) for pname, flat in params.items()
                         if flat.size > n and np.array_equal(flat[:n], t.values.reshape(-1))),
                        None)
        if slot is not None:
            out[t.name] = slot
    return out


def fine_tune(marked: Path, dest: Path, module: Any, mapping: dict[str, Slot],
              loss: Callable[[], Any], *, steps: int, lr: float, optimizer: str = "adamw",
              seed: int = 0) -> Tuned:
    """`module` loaded with `marked`'s values, trained `steps` steps on `loss()` (a fresh
    batch's task loss each call), written back into a copy of `marked` at `dest`."""
    import torch

    torch.manual_seed(seed)
    marked_values = weights.by_name(weights.read(marked))
    params = dict(module.named_parameters())
    before = {}
    with torch.no_grad():
        # Whole parameters first, then the slices folded out of them (theirs win: a slice's
        # marks are the ones scored under its name).
        for name, slot in sorted(mapping.items(), key=lambda kv: kv[1].prefix > 0):
            p = params[slot.param]
            v = torch.from_numpy(marked_values[name].astype(np.float32).reshape(-1).copy())
            if slot.prefix:
                p.view(-1)[:slot.prefix].copy_(v)
            else:
                p.copy_(v.reshape(p.shape[::-1]).T if slot.transposed else v.reshape(p.shape))
            before[name] = marked_values[name].astype(np.float32).reshape(-1)
    make = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[optimizer]
    opt = make(module.parameters(), lr=lr)
    first = last = float("nan")
    for step in range(steps):
        value = loss()
        if step == 0:
            first = float(value.item())
        opt.zero_grad()
        value.backward()
        opt.step()
        last = float(value.item())
    tuned = {}
    for name, slot in mapping.items():
        a = params[slot.param].detach().numpy()
        flat = np.ascontiguousarray(a.T if slot.transposed else a).reshape(-1)
        tuned[name] = flat[:slot.prefix].copy() if slot.prefix else flat
    delta = np.concatenate([np.abs(tuned[n] - before[n]) for n in tuned])
    scale = np.concatenate([np.abs(before[n]) for n in tuned])
    # Moved past the mark: by more than one FP16 step of the weight (weight decay alone
    # nudges every weight, e.g. the embedding rows of tokens the task never uses).
    moved = delta > np.spacing(np.minimum(scale, 65504).astype(np.float16)).astype(np.float32)
    rel = delta[moved] / np.maximum(scale[moved], np.finfo(np.float32).tiny)
    shutil.copyfile(marked, dest)
    weights.rewrite(dest, lambda name, v: tuned[name].astype(v.dtype).reshape(v.shape)
                    if name in tuned else v)
    return Tuned(dest, first, last, float(np.median(rel)) if rel.size else 0.0,
                 float(moved.mean()))


def identified(leak: Path, unmarked: Path, marked: Path, key: bytes, cohorts: int
               ) -> wm.Identified:
    """`leak` scored as the server scores it: against the unmarked artifact, on the positions
    the marked copy moved (server/services/watermarks.py)."""
    original = [(t.name, t.values) for t in weights.read(unmarked) if t.markable]
    moved = wm.moved_positions(original, weights.by_name(weights.read(marked)))
    return wm.identify_tensors(weights.by_name(weights.read(leak)), original, key, cohorts,
                               moved=moved)
