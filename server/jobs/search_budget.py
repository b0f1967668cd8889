"""The compile seconds a version's `precision: auto` builds share (issue 22: the precision
search is bounded by a per-version budget, not a per-build one).

Each build of a version (one platform × shape variant) is its own job, possibly on its own
worker, and a Pipeline only knows its own build. So the version's budget — the
`search_budget_seconds` its auto platforms set (the smallest, if they differ; default 900)
— is shared out as each auto build starts: what the version's finished auto builds did not
spend, divided among its unfinished auto builds, this one included. A build never gets more
than its fair share of what is left, so the builds together stay within the version's
budget in any order and on any number of workers, and builds that finished cheaply leave
their savings to the ones still to run. What a finished build spent is the
`spent_seconds` its precision-search frontiers recorded (cumulative over its targets).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.compile.precision_search import DEFAULT_BUDGET_SECONDS, budget_of
from server.db.models import Build
from server.db.states import BuildState

_FINISHED = (BuildState.succeeded, BuildState.failed)


def _auto(build: Build) -> bool:
    return str((build.compile_settings or {}).get("precision", "")).strip() == "auto"


def _spent(build: Build) -> float:
    outcomes = (build.gates_report or {}).get("outcomes") or []
    return max((float(o.get("gates", {}).get("precision_search", {}).get("spent_seconds", 0))
                for o in outcomes), default=0.0)


def version_share(session: Session, build: Build) -> float | None:
    """Seconds this auto build's search may spend (None: not an auto build)."""
    if not _auto(build):
        return None
    siblings = [b for b in session.scalars(select(Build).where(
        Build.version_id == build.version_id)) if _auto(b)]
    budget = min(budget_of(b.compile_settings or {}).seconds for b in siblings) \
        if siblings else DEFAULT_BUDGET_SECONDS
    spent = sum(_spent(b) for b in siblings if b.state in _FINISHED and b.id != build.id)
    waiting = sum(1 for b in siblings if b.state not in _FINISHED or b.id == build.id)
    return max(budget - spent, 0.0) / max(waiting, 1)


def with_share(settings: dict[str, Any], share: float | None) -> dict[str, Any]:
    """The build's flat settings with its share as `search_budget_seconds`."""
    if share is None:
        return settings
    return {**settings, "search_budget_seconds": round(share, 3)}
