"""Shadow mode statistics: how a candidate model compares with the active one on live inputs.

(The shadow workers' common shape — ``Shadow``, ``Session``, ``ShadowConfig``, the one
``Evaluator`` — is ``client_sdk.shadow``; this module is the arithmetic and the files.)

Per sample (one input the app predicted on, offered to the candidate off the app's thread):

- KL divergence KL(active ‖ candidate) of the output distributions, per floating output whose
  last axis has ≥ 2 entries: the outputs themselves when they already are probabilities
  (non-negative, rows summing to 1), else the softmax of them (logits); the sample's value is
  the largest over outputs, mean over batch rows;
- cosine similarity and SNR (dB, active as signal, the difference as noise) of every floating
  output, the sample's value the smallest over outputs;
- the latency of both models (µs).

``ShadowStats`` aggregates them per candidate artifact (its sha256) and decides the verdict
(``TELEMETRY_SPEC``): after ``min_samples`` samples (and ``min_duration_s`` seconds since the
first one, when the thresholds give it) *passed* iff mean KL ≤ ``max_kl_micro`` and the
candidate's p99 latency ≤ ``max_latency_p99_us``, *failed* otherwise. ``ShadowStore`` persists
them atomically as ``<data_dir>/shadow/<sha256>.json`` so they survive app restarts; a failed
artifact stays recorded there and is never loaded or fetched again. Only these aggregates are
stored — never an input or an output.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from client_sdk.errors import InstallError
from client_sdk.fsutil import atomic_write_bytes

PENDING, PASSED, FAILED = "pending", "passed", "failed"
VERDICTS = (PENDING, PASSED, FAILED)
# Latencies kept per model for the percentiles (the most recent ones).
MAX_LATENCIES = 2048
# SNR of identical outputs (no noise at all): a finite stand-in for +inf.
SNR_IDENTICAL_DB = 200.0
_SHA = re.compile(r"[0-9a-f]{64}")
_EPS = 1e-12

Arrays = Mapping[str, np.ndarray[Any, Any]]


@dataclass(frozen=True)
class Sample:
    """The comparison of one input: ``kl`` None when no output is a distribution."""

    kl: float | None
    cosine: float | None
    snr_db: float | None
    active_us: int
    candidate_us: int


def _rows_as_distributions(rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``rows`` (float64, 2-D) as probability distributions: as-is when they already are
    (non-negative, each summing to 1 within 1e-3), else their softmax (they are logits)."""
    # The bound np.allclose(sums, 1.0, atol=1e-3) applies (atol + rtol·1), without its cost.
    if rows.min() >= 0 and float(np.abs(rows.sum(axis=1) - 1.0).max()) <= 1e-3 + 1e-5:
        return rows
    e = np.exp(rows - rows.max(axis=1, keepdims=True))
    out: np.ndarray[Any, Any] = e / e.sum(axis=1, keepdims=True)
    return out


def _kl_rows(p_rows: np.ndarray[Any, Any], q_rows: np.ndarray[Any, Any]) -> float:
    p = np.clip(_rows_as_distributions(p_rows), _EPS, 1.0)
    q = np.clip(_rows_as_distributions(q_rows), _EPS, 1.0)
    return max(float(np.sum(p * np.log(p / q))) / int(p.shape[0]), 0.0)


def _cosine(aa: float, cc: float, ac: float) -> float:
    """From the dot products a·a, c·c and a·c."""
    if aa == 0.0 or cc == 0.0:
        return 1.0 if aa == cc else 0.0
    return ac / (math.sqrt(aa) * math.sqrt(cc))


def _snr_db(signal: float, noise: float) -> float:
    if noise == 0.0:
        return SNR_IDENTICAL_DB
    if signal == 0.0:
        return -SNR_IDENTICAL_DB
    return max(min(10.0 * math.log10(signal / noise), SNR_IDENTICAL_DB), -SNR_IDENTICAL_DB)


def _f64(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.asarray(a, dtype=np.float64).ravel()


def kl_divergence(active: np.ndarray[Any, Any], candidate: np.ndarray[Any, Any]) -> float:
    """Mean over rows (last axis) of KL(p ‖ q), p from the active model, q from the
    candidate."""
    n = active.shape[-1]
    return _kl_rows(_f64(active).reshape(-1, n), _f64(candidate).reshape(-1, n))


def cosine(active: np.ndarray[Any, Any], candidate: np.ndarray[Any, Any]) -> float:
    a, c = _f64(active), _f64(candidate)
    return _cosine(float(a @ a), float(c @ c), float(a @ c))


def snr_db(active: np.ndarray[Any, Any], candidate: np.ndarray[Any, Any]) -> float:
    a = _f64(active)
    d = a - _f64(candidate)
    return _snr_db(float(a @ a), float(d @ d))


def compare(active: Arrays, candidate: Arrays, active_us: int, candidate_us: int) -> Sample:
    """One sample from the two models' outputs for the same input. An output the candidate
    lacks or shapes differently counts as total divergence (cosine 0, KL of 1e6 micro).

    It runs on the shadow worker while holding the GIL, so each output is converted to
    float64 once and every metric is taken from those two vectors (a handful of numpy calls
    per output): the app's thread waits for the GIL as briefly as possible."""
    kls: list[float] = []
    cosines: list[float] = []
    snrs: list[float] = []
    for name, a in active.items():
        if not np.issubdtype(a.dtype, np.floating):
            continue
        c = candidate.get(name)
        if c is None or c.shape != a.shape:
            kls.append(1.0)
            cosines.append(0.0)
            snrs.append(-SNR_IDENTICAL_DB)
            continue
        av, cv = _f64(a), _f64(c)
        if a.ndim >= 1 and a.shape[-1] >= 2:
            n = a.shape[-1]
            kls.append(_kl_rows(av.reshape(-1, n), cv.reshape(-1, n)))
        aa, d = float(av @ av), av - cv
        cosines.append(_cosine(aa, float(cv @ cv), float(av @ cv)))
        snrs.append(_snr_db(aa, float(d @ d)))
    return Sample(max(kls) if kls else None, min(cosines) if cosines else None,
                  min(snrs) if snrs else None, active_us, candidate_us)


def percentile_us(values: list[int], q: float) -> int:
    return int(np.percentile(np.asarray(values, dtype=np.int64), q)) if values else 0


@dataclass
class ShadowStats:
    """The running comparison of one candidate artifact (JSON-serialisable aggregates only)."""

    sha256: str
    model: str
    version: str
    thresholds: dict[str, int] | None = None  # max_kl_micro, max_latency_p99_us, min_samples,
    # and min_duration_s when the release gives it
    samples: int = 0
    dropped: int = 0
    kl_samples: int = 0
    kl_sum: float = 0.0
    kl_max: float = 0.0
    cosine_min: float | None = None
    snr_min_db: float | None = None
    active_us: list[int] = field(default_factory=list)
    candidate_us: list[int] = field(default_factory=list)
    first_at: int | None = None
    verdict: str = PENDING
    reason: str | None = None

    # -- aggregation ---------------------------------------------------------------------

    def add(self, s: Sample, now: int) -> None:
        self.samples += 1
        if self.first_at is None:
            self.first_at = now
        if s.kl is not None:
            self.kl_samples += 1
            self.kl_sum += s.kl
            self.kl_max = max(self.kl_max, s.kl)
        if s.cosine is not None:
            self.cosine_min = s.cosine if self.cosine_min is None else min(self.cosine_min,
                                                                           s.cosine)
        if s.snr_db is not None:
            self.snr_min_db = s.snr_db if self.snr_min_db is None else min(self.snr_min_db,
                                                                           s.snr_db)
        for seq, v in ((self.active_us, s.active_us), (self.candidate_us, s.candidate_us)):
            seq.append(v)
            if len(seq) > MAX_LATENCIES:
                del seq[: len(seq) - MAX_LATENCIES]

    @property
    def kl_mean_micro(self) -> int:
        return round(self.kl_sum / self.kl_samples * 1e6) if self.kl_samples else 0

    @property
    def kl_max_micro(self) -> int:
        return round(self.kl_max * 1e6)

    def decide(self, now: int) -> str:
        """Set and return the verdict once the window is complete (pending before; a
        decided verdict never changes)."""
        t = self.thresholds
        if self.verdict != PENDING or t is None or self.samples < t["min_samples"]:
            return self.verdict
        min_duration = t.get("min_duration_s", 0)
        if min_duration and (self.first_at is None or now - self.first_at < min_duration):
            return self.verdict
        p99 = percentile_us(self.candidate_us, 99)
        problems = []
        if self.kl_mean_micro > t["max_kl_micro"]:
            problems.append(f"mean KL {self.kl_mean_micro} µ over the limit "
                            f"{t['max_kl_micro']} µ")
        if p99 > t["max_latency_p99_us"]:
            problems.append(f"candidate p99 {p99} µs over the limit {t['max_latency_p99_us']} µs")
        self.verdict = FAILED if problems else PASSED
        self.reason = "; ".join(problems) or None
        return self.verdict

    def fail(self, reason: str) -> None:
        """Record a failure decided elsewhere (the candidate crashed, or the model was rolled
        back at run time after its promotion)."""
        self.verdict, self.reason = FAILED, reason[:500]

    # -- the report (TELEMETRY_SPEC kind "shadow" fields) --------------------------------

    def summary(self) -> dict[str, Any]:
        return {
            "samples": self.samples, "dropped": self.dropped,
            "kl_mean_micro": self.kl_mean_micro, "kl_max_micro": self.kl_max_micro,
            "cosine_min_micro": None if self.cosine_min is None
            else round(self.cosine_min * 1e6),
            "snr_min_centi_db": None if self.snr_min_db is None
            else round(self.snr_min_db * 100),
            "active_p50_us": percentile_us(self.active_us, 50),
            "active_p99_us": percentile_us(self.active_us, 99),
            "candidate_p50_us": percentile_us(self.candidate_us, 50),
            "candidate_p99_us": percentile_us(self.candidate_us, 99),
            "verdict": self.verdict, "reason": self.reason,
        }

    # -- persistence ---------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in self.__dataclass_fields__:
            v = getattr(self, k)
            out[k] = list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v
        return out

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ShadowStats:
        s = ShadowStats(str(d["sha256"]), str(d["model"]), str(d["version"]))
        for k in s.__dataclass_fields__:
            if k in d and k not in ("sha256", "model", "version"):
                setattr(s, k, d[k])
        if s.verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {s.verdict!r}")
        return s


class ShadowStore:
    """``<data_dir>/shadow/<sha256>.json``: one ``ShadowStats`` per candidate artifact."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = Path(data_dir) / "shadow"

    def _path(self, sha256: str) -> Path:
        if not _SHA.fullmatch(sha256):
            raise InstallError(f"not a sha256: {sha256!r}")
        return self.dir / f"{sha256}.json"

    def load(self, sha256: str) -> ShadowStats | None:
        path = self._path(sha256)
        try:
            return ShadowStats.from_dict(json.loads(path.read_bytes()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            return None  # a torn or foreign file: start the comparison again

    def save(self, stats: ShadowStats) -> None:
        # Compact JSON: with ``indent`` the json module falls back to its pure-Python encoder
        # (~3 ms for the 4,096 latencies, all of it holding the GIL on the shadow worker while
        # the app waits for it); without, its C encoder takes ~0.3 ms.
        data = json.dumps(stats.to_dict(), sort_keys=True, separators=(",", ":"))
        atomic_write_bytes(self._path(stats.sha256), data.encode())

    def register(self, sha256: str, model: str, version: str,
                 thresholds: dict[str, int] | None) -> ShadowStats:
        """The stats of a candidate the updater just installed (kept if already there), with
        the release's thresholds recorded for the runtime."""
        stats = self.load(sha256) or ShadowStats(sha256, model, version)
        if thresholds is not None and stats.thresholds != thresholds:
            stats.thresholds = dict(thresholds)
            self.save(stats)
        elif not self._path(sha256).exists():
            self.save(stats)
        return stats

    def verdict(self, sha256: str) -> str | None:
        stats = self.load(sha256)
        return None if stats is None else stats.verdict

    def failed(self, sha256: str) -> ShadowStats | None:
        stats = self.load(sha256)
        return stats if stats is not None and stats.verdict == FAILED else None

    def mark_failed(self, sha256: str, model: str, version: str, reason: str) -> None:
        stats = self.load(sha256) or ShadowStats(sha256, model, version)
        stats.fail(reason)
        self.save(stats)

    def all(self) -> list[ShadowStats]:
        if not self.dir.exists():
            return []
        out = []
        for p in sorted(self.dir.glob("*.json")):
            s = self.load(p.stem) if _SHA.fullmatch(p.stem) else None
            if s is not None:
                out.append(s)
        return out
