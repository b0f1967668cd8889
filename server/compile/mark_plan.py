"""Which tensors a watermark can afford (issue 23; used by server/compile/cohorts.py).

A model's outputs are not equally sensitive to every weight: on PP-OCR's text detector one
72-weight tensor of ~100 (`conv2d_399.w_0`, the head before the probability map) causes 80%
of the output error a one-FP16-step mark costs, the first conv another 9%. Thinning every
tensor's mark alike (the cohort loop's `share`) pays for those few with the marks of all the
others. So, once a mark at strength 1 is too costly, each markable tensor is marked alone and
the error it causes measured per output and sample; the marks add in power (independent
keyed signs), so the plan that keeps the most marked weights within the outputs' budget is
a fractional knapsack: tensors by marked weights per unit of budget they use, each given the
share the budget still has room for (1: all, 0: left unmarked).

The detector (server/watermark.py) scores every masked position of every tensor whatever the
plan: an unmarked tensor adds no signal (and, after noise, noise), so the statistic and its
false-positive bound do not change, and `identify` needs no record of the plan.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from server import watermark as wm
from server.compile import weights
from server.compile.compilers.base import Compiler
from server.compile.types import CompiledArtifact

MAX_PROBED = 256  # tensors marked alone, the most marked first; the others stay unmarked
# The probe's budget, in CPU seconds of this process (the compiles and runs are in it):
# tensors not reached by then stay unmarked. Not wall seconds: a worker slowed by others
# would plan over fewer tensors, and whether a marginal model's cohorts pass would depend on
# the load (ppocr-cls on QNN: 64/64 alone, its 99 tensors probed in 267 s; 0/64 in a run
# beside five other benches).
PROBE_SECONDS = 600.0


@dataclass(frozen=True)
class MarkPlan:
    """Per-tensor shares of the mark (a tensor absent from `shares` is left unmarked)."""

    shares: dict[str, float]
    marked: int  # weights the plan marks (at share 1 of the cohort loop)
    probed: int
    unmarked: list[str] = field(default_factory=list)  # tensors left out, most marked first

    def share_of(self, name: str) -> float:
        return self.shares.get(name, 0.0)

    def summary(self) -> dict[str, Any]:
        return {"tensors_marked": sum(1 for s in self.shares.values() if s > 0),
                "tensors_unmarked": len(self.unmarked), "unmarked": self.unmarked[:20],
                "partial": dict(sorted((n, round(s, 6)) for n, s in self.shares.items()
                                       if 0 < s < 1)[:20]),
                "marked_weights": self.marked, "probed": self.probed}


def everything(_: str) -> float:
    return 1.0


def _only(name: str) -> Callable[[str], float]:
    return lambda n: 1.0 if n == name else 0.0


def changed(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> int:
    """How many values of `b` differ from `a` (same dtype), compared as bit patterns (NaN
    is unchanged)."""
    bits = f"u{a.dtype.itemsize}"
    return int(np.count_nonzero(a.view(bits) != b.view(bits)))


def marked_counts(path: Path, key: bytes) -> dict[str, int]:
    """Weights cohort 0's mark moves in each tensor of the artifact at `path`."""
    out = {}
    for t in weights.read(path):
        if not t.markable:  # what weights.rewrite leaves alone (sizes, shapes, indices)
            continue
        n = changed(t.values, wm.embed(t.values, key, 0, 1, name=t.name))
        if n:
            out[t.name] = n
    return out


def budgets(unmarked: Sequence[Sequence[Any]], min_db: float) -> np.ndarray[Any, Any]:
    """Per (sample, output): the squared error a mark may add and keep both that output's
    SNR and its PSNR (peak: max |output|) at `min_db` or above."""
    out = []
    for sample in unmarked:
        for u in sample:
            a = np.asarray(u, dtype=np.float64).reshape(-1)
            power = min(float(np.sum(a * a)), float(np.max(np.abs(a), initial=0.0)) ** 2 * a.size)
            out.append(power * 10 ** (-min_db / 10))
    return np.asarray(out)


def errors(unmarked: Sequence[Sequence[Any]], marked: Sequence[Sequence[Any]]
           ) -> np.ndarray[Any, Any]:
    return np.asarray([float(np.sum((np.asarray(u, dtype=np.float64).reshape(-1)
                                     - np.asarray(m, dtype=np.float64).reshape(-1)) ** 2))
                       for su, sm in zip(unmarked, marked, strict=True)
                       for u, m in zip(su, sm, strict=True)])


def knapsack(counts: dict[str, int], cost: dict[str, np.ndarray[Any, Any]],
             budget: np.ndarray[Any, Any]) -> dict[str, float]:
    """The shares that mark the most weights with Σ share·cost ≤ budget everywhere: tensors
    by weights per unit of their tightest budget, each given what the budget has left."""
    left = budget.astype(np.float64).copy()
    use = {n: float(np.max(c / np.maximum(budget, 1e-300))) for n, c in cost.items()}
    shares = {}
    for name in sorted(cost, key=lambda n: (-counts[n] / max(use[n], 1e-300), n)):
        c = cost[name]
        loaded = c > 0
        room = 1.0 if not loaded.any() else float(np.min(left[loaded] / c[loaded]))
        share = max(0.0, min(1.0, room))
        if share <= 0:
            continue
        shares[name] = share
        left -= share * c
    return shares


def plan(compiler: Compiler, art: CompiledArtifact, feeds: Any, unmarked: Any, key: bytes,
         where: Path, min_db: float,
         mark: Callable[[Path, Path, Callable[[str], float]], Path],
         log: Callable[[str], None] = lambda _: None,
         counts: dict[str, int] | None = None) -> MarkPlan:
    """Cohort 0's mark at strength 1 on each tensor alone (`mark(src, dest, share_of)`
    makes the copy: for a QNN artifact, the marked graph compiled), and the shares that
    keep the outputs at `min_db`; `counts`: the weights the mark moves per tensor (default:
    read from the artifact)."""
    counts = marked_counts(art.path, key) if counts is None else counts
    order = sorted(counts, key=lambda n: (-counts[n], n))[:MAX_PROBED]
    cost: dict[str, np.ndarray[Any, Any]] = {}
    started = time.process_time()
    for name in order:
        if time.process_time() - started > PROBE_SECONDS:
            log(f"mark plan: probed {len(cost)} of {len(counts)} tensors within "
                f"{PROBE_SECONDS:.0f} CPU seconds; the others stay unmarked")
            break
        copy = mark(art.path, where / name.replace("/", "_")[:80] / art.path.name,
                    _only(name))
        try:
            cost[name] = errors(unmarked, compiler.run(replace(art, path=copy), feeds))
        finally:
            shutil.rmtree(copy.parent, ignore_errors=True)
    shares = knapsack(counts, cost, budgets(unmarked, min_db))
    marked = int(sum(math.floor(counts[n] * s) for n, s in shares.items()))
    left_out = [n for n in sorted(counts, key=lambda n: (-counts[n], n))
                if shares.get(n, 0.0) <= 0]
    return MarkPlan(shares, marked, len(cost), left_out)
