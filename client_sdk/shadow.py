"""Shadow mode on the device: the one shape both shadow workers share.

- ``Shadow``: what ``ModelRuntime`` asks of the place candidates run — ``ShadowWorker`` (a
  thread of the app's process, ``client_sdk.shadow_worker``) or ``ShadowProcess`` (a child
  process, ``client_sdk.shadow_process`` and ``client_sdk.shadow_child``);
- ``Session``: one candidate under comparison, its loaded model and its statistics;
- ``Evaluator``: the one sequence every sample goes through, wherever it runs: run the
  candidate → compare with the active outputs → add to the statistics → decide the verdict →
  persist. The thread worker and the child differ only in how the candidate is run (a
  low-priority thread; a marked run in the child), whether a comparison waits for the app to be
  idle, and what a decided verdict tells whom: those are the evaluator's arguments;
- ``ShadowConfig``: the runtime's shadow settings (queue, sampling, budget, persistence,
  priority, isolation), ``ModelRuntime(shadow_config=...)``; the older ``shadow_*`` keywords of
  ``ModelRuntime`` map onto it (``from_keywords``).

The statistics, the metrics and their files are ``client_sdk.shadow_stats``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict

import numpy as np

from client_sdk.clock import Clock
from client_sdk.errors import ConfigError, ModelNotLoadedError
from client_sdk.loaded import LoadedModel
from client_sdk.shadow_stats import PENDING, ShadowStats, compare

Array = np.ndarray[Any, Any]
Arrays = Mapping[str, Array]
# Runs the candidate (the function given) and returns its outputs and wall time in µs.
Runner = Callable[[Callable[[], Arrays]], tuple[Arrays, int]]

# Where candidates run (``ShadowConfig.isolation``).
AUTO, PROCESS, THREAD = "auto", "process", "thread"
ISOLATIONS = (AUTO, PROCESS, THREAD)
# Offering shadow samples adds at most this share to the app's predict time (on its thread).
DEFAULT_BUDGET = 0.02


@dataclass
class Session:
    """One candidate under comparison: its loaded model and its stats."""

    loaded: LoadedModel
    stats: ShadowStats
    lock: threading.Lock = field(default_factory=threading.Lock)
    dropped: int = 0  # drops since the last merge into stats (under ``lock``)
    detached: bool = False


Decided = Callable[[str, Session], None]


class Shadow(Protocol):
    """Where candidates run, are compared and judged (``ModelRuntime.shadow``)."""

    @property
    def setups(self) -> int:
        """Offers so far that set something up (a layout sent to the child, a new ring): the
        runtime does not charge those to the shadow budget."""
        ...

    @property
    def priority(self) -> str:
        """The CPU priority candidates run at (``client_sdk.background``), once one ran."""
        ...

    def attach(self, loaded: LoadedModel) -> Session | None:
        """Start (or resume, from the persisted stats) comparing ``loaded`` as its model's
        candidate; None when that artifact already has a verdict."""
        ...

    def detach(self, model: str) -> None:
        """Stop comparing the model's candidate; its stats are persisted."""
        ...

    def session(self, model: str) -> Session | None:
        """The model's candidate under comparison, if any."""
        ...

    def offer(self, model: str, inputs: Arrays, outputs: Arrays, active_us: int,
              shape_variant: str | None) -> bool:
        """One sample for the model's candidate, never blocking the app; False when dropped
        (counted) or when there is no candidate."""
        ...

    def flush(self) -> None:
        """Wait until every sample offered is processed; the stats on disk are then current."""
        ...

    def close(self) -> None:
        """Drain, persist and stop."""
        ...


def _always() -> bool:
    return True


class Evaluator:
    """Run → compare → add → decide → persist, for one sample of one session.

    ``run``: how the candidate runs (its outputs and µs); ``settle``: called between the run
    and the comparison, False drops the sample (the thread worker: the app started a
    prediction and did not finish in time); ``persist``: writes a session's stats every
    ``persist_every`` samples; ``decided``: a verdict was decided (passed, failed, or the
    candidate raised) and must be persisted and told. Samples of a candidate that lacks the
    input-shape variant are skipped, not counted."""

    def __init__(self, *, run: Runner, persist_every: int, persist: Callable[[Session], None],
                 decided: Callable[[Session], None], settle: Callable[[], bool] = _always,
                 clock: Clock | None = None) -> None:
        self._run = run
        self._persist_every = max(persist_every, 1)
        self._persist = persist
        self._decided = decided
        self._settle = settle
        self._clock = clock

    def sample(self, s: Session, inputs: Arrays, outputs: Arrays, active_us: int,
               shape_variant: str | None, at: int | None = None) -> None:
        """``outputs``/``active_us``: the active model's for ``inputs``; ``at``: the time the
        sample counts at (None: now, by the evaluator's clock, after the comparison)."""
        if s.detached or s.stats.verdict != PENDING:
            return
        try:
            got, cand_us = self._run(lambda: s.loaded.run(inputs, shape_variant).outputs)
        except ModelNotLoadedError:
            return  # the candidate lacks that input-shape variant: not comparable
        except Exception as e:
            with s.lock:
                s.stats.fail(f"candidate raised {type(e).__name__}: {e}")
            self._decided(s)
            return
        if not self._settle():
            with s.lock:
                s.dropped += 1
            return
        sample = compare(outputs, got, active_us, cand_us)
        if at is None:
            assert self._clock is not None, "an Evaluator without a clock needs `at`"
            at = int(self._clock.time())
        with s.lock:
            s.stats.add(sample, at)
            verdict = s.stats.decide(at)
            due = s.stats.samples % self._persist_every == 0
        if verdict != PENDING:
            self._decided(s)
        elif due:
            self._persist(s)


class ShadowKeywords(TypedDict, total=False):
    """``ModelRuntime``'s older shadow keywords, each one ``ShadowConfig`` field."""

    shadow_queue: int
    shadow_persist_every: int
    shadow_sample_every: int
    shadow_budget: float | None
    shadow_background: bool
    shadow_isolation: str


# keyword → ShadowConfig field
KEYWORDS = {
    "shadow_queue": "queue_size", "shadow_persist_every": "persist_every",
    "shadow_sample_every": "sample_every", "shadow_budget": "budget",
    "shadow_background": "background", "shadow_isolation": "isolation",
}


@dataclass(frozen=True)
class ShadowConfig:
    """How ``ModelRuntime`` runs shadow candidates.

    ``queue_size``: samples waiting for the candidate before new ones are dropped;
    ``sample_every``: offer one active prediction in N to the candidate (a candidate running
    beside the app shares its CPU: sample when the app's tail latency matters more than a
    fast verdict — see docs/benchmarks.md);
    ``budget``: the share of the app's predict time that offering samples may add on the
    app's thread (default 0.02: 2%): after each offer, the next ones wait until the
    predictions since then ran ``cost / budget`` (the offer's measured cost: copying the
    sample, ≈ 20 µs on a small VM core), so a fast model is sampled less often than a slow
    one; None: every ``sample_every``-th prediction, whatever it costs;
    ``persist_every``: samples between two writes of the shadow statistics;
    ``background``: run the candidate at the lowest CPU priority the OS allows (False only to
    measure the difference);
    ``isolation``: where candidates run — ``"process"``: a child process
    (``client_sdk.shadow_process``: no GIL shared with the app; Linux, the default backend
    factory), ``"thread"``: a worker thread of the app's process (``client_sdk.shadow_worker``),
    ``"auto"``: the process where it can run, else the thread."""

    queue_size: int = 8
    persist_every: int = 25
    sample_every: int = 1
    budget: float | None = DEFAULT_BUDGET
    background: bool = True
    isolation: str = AUTO

    def __post_init__(self) -> None:
        if self.sample_every < 1:
            raise ConfigError("ShadowConfig.sample_every (shadow_sample_every) must be >= 1")
        if self.budget is not None and not 0 < self.budget <= 1:
            raise ConfigError("ShadowConfig.budget (shadow_budget) must be in (0, 1], or None "
                              "for no budget")
        if self.isolation not in ISOLATIONS:
            raise ConfigError(f"ShadowConfig.isolation (shadow_isolation) must be one of "
                              f"{', '.join(ISOLATIONS)}, not {self.isolation!r}")

    @classmethod
    def from_keywords(cls, config: ShadowConfig | None, keywords: Mapping[str, Any]
                      ) -> ShadowConfig:
        """``config``, or the one the older ``shadow_*`` keywords describe (defaults for the
        rest); both at once is refused, and so is a keyword that is not one of them."""
        unknown = sorted(set(keywords) - set(KEYWORDS))
        if unknown:
            raise TypeError(f"ModelRuntime() got unexpected keyword arguments {unknown}")
        if not keywords:
            return config or cls()
        if config is not None:
            raise ConfigError(f"give ModelRuntime either shadow_config=ShadowConfig(...) or "
                              f"the shadow_* keywords, not both (got {sorted(keywords)})")
        return cls(**{KEYWORDS[k]: v for k, v in keywords.items()})
