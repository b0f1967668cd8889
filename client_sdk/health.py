"""Run-time health of each model's active bundle, and when to roll it back locally.

A bundle that just became active is *on probation* until it has served ``probation``
predictions. During probation it is rolled back to the previous bundle (``ModelRuntime`` does
it: no download) when

- ``error_limit`` predictions in a row raise (after the circuit breaker's CPU fallback);
- the app crashes in a loop: ``crash_loop_starts`` starts of the app with this bundle in a row
  that never ended cleanly (``ModelRuntime.close``) nor finished probation;
- its p99 latency over the probation window is more than ``p99_factor`` × the candidate p99 it
  showed in shadow mode (when it ran in shadow on this device).

``<data_dir>/health/<model>.json`` keeps the bundle id, the unclean start count, whether it is
proven, its prediction/error counters and whether it was rolled back (for the health report).
Only counters are stored.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client_sdk.fsutil import atomic_write_json, check_name
from client_sdk.shadow_stats import ShadowStore, percentile_us


@dataclass
class Record:
    bundle_id: str
    sha256: str = ""
    version: str = ""
    unclean_starts: int = 0
    proven: bool = False
    predictions: int = 0
    errors: int = 0
    rolled_back: bool = False
    p99_us: int | None = None
    # in memory only
    consecutive_errors: int = 0
    latencies: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"bundle_id": self.bundle_id, "sha256": self.sha256, "version": self.version,
                "unclean_starts": self.unclean_starts, "proven": self.proven,
                "predictions": self.predictions, "errors": self.errors,
                "rolled_back": self.rolled_back, "p99_us": self.p99_us}


@dataclass(frozen=True)
class Policy:
    error_limit: int = 5
    crash_loop_starts: int = 3
    probation: int = 200
    p99_factor: float = 3.0


class HealthMonitor:
    """Counts each active bundle's predictions and failures; says when to roll back."""

    def __init__(self, data_dir: Path, policy: Policy | None = None) -> None:
        self.dir = Path(data_dir) / "health"
        self.policy = policy or Policy()
        self._shadow = ShadowStore(data_dir)
        self._records: dict[str, Record] = {}
        self._lock = threading.Lock()

    def _path(self, model: str) -> Path:
        return self.dir / f"{check_name('model', model)}.json"

    def load(self, model: str) -> Record | None:
        try:
            d = json.loads(self._path(model).read_bytes())
            p99 = d.get("p99_us")
            return Record(
                str(d["bundle_id"]), str(d.get("sha256", "")), str(d.get("version", "")),
                int(d.get("unclean_starts", 0)), bool(d.get("proven", False)),
                int(d.get("predictions", 0)), int(d.get("errors", 0)),
                bool(d.get("rolled_back", False)), None if p99 is None else int(p99))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _save(self, model: str, r: Record) -> None:
        atomic_write_json(self._path(model), r.to_dict())

    def started(self, model: str, bundle_id: str, sha256: str, version: str) -> str | None:
        """The app loaded ``bundle_id`` as the active bundle: count the start; returns why to
        roll back when it is crash-looping, else None."""
        old = self.load(model)
        r = old if old is not None and old.bundle_id == bundle_id else Record(
            bundle_id, sha256, version)
        if not r.proven:
            r.unclean_starts += 1
            self._save(model, r)
        self._records[model] = r
        if not r.proven and r.unclean_starts > self.policy.crash_loop_starts:
            return (f"crash loop: {r.unclean_starts - 1} starts in a row with {version} never "
                    "ended cleanly")
        return None

    def swapped(self, model: str, bundle_id: str, sha256: str, version: str) -> None:
        """A new bundle became active in this process (the updater swapped it in)."""
        r = self._records.get(model)
        if r is not None and r.bundle_id == bundle_id:
            return
        on_disk = self.load(model)
        if on_disk is not None and on_disk.bundle_id == bundle_id:
            self._records[model] = on_disk  # loaded at start: ``started`` counts it
            return
        self._records[model] = r = Record(bundle_id, sha256, version)
        self._save(model, r)

    def ok(self, model: str, bundle_id: str, us: int) -> str | None:
        """A prediction succeeded in ``us`` µs; returns why to roll back, else None."""
        r = self._records.get(model)
        if r is None or r.bundle_id != bundle_id:
            return None
        r.predictions += 1
        r.consecutive_errors = 0
        if r.proven:
            return None
        r.latencies.append(us)
        if len(r.latencies) < self.policy.probation:
            return None
        with self._lock:
            if r.proven:
                return None
            r.p99_us = percentile_us(r.latencies, 99)
            r.latencies = []
            r.proven, r.unclean_starts = True, 0
            self._save(model, r)
        shadow = self._shadow.load(r.sha256) if len(r.sha256) == 64 else None
        if shadow is not None and shadow.candidate_us:
            figure = shadow.summary()["candidate_p99_us"]
            if figure and r.p99_us > self.policy.p99_factor * figure:
                return (f"p99 latency {r.p99_us} µs is over {self.policy.p99_factor}x its "
                        f"shadow figure of {figure} µs")
        return None

    def error(self, model: str, bundle_id: str) -> str | None:
        """A prediction raised; returns why to roll back, else None."""
        r = self._records.get(model)
        if r is None or r.bundle_id != bundle_id:
            return None
        r.errors += 1
        r.consecutive_errors += 1
        if not r.proven and r.consecutive_errors >= self.policy.error_limit:
            return f"{r.consecutive_errors} predictions in a row failed"
        return None

    def rolled_back(self, model: str, to_bundle: str, sha256: str, version: str) -> None:
        r = Record(to_bundle, sha256, version, proven=True, rolled_back=True)
        self._records[model] = r
        self._save(model, r)

    def clean_exit(self) -> None:
        """The app is closing normally: the unclean-start counts go back to zero."""
        for model, r in list(self._records.items()):
            r.unclean_starts = 0
            self._save(model, r)

    def records(self) -> dict[str, Record]:
        out: dict[str, Record] = {}
        if self.dir.exists():
            for p in sorted(self.dir.glob("*.json")):
                r = self.load(p.stem)
                if r is not None:
                    out[p.stem] = r
        return out
