"""The devices the server has seen (what rollout previews run against)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.db import models as db


def recently_seen(session: Session, *, limit: int, offset: int) -> list[db.Device]:
    """Most recently seen first (ties by id, so pages do not overlap)."""
    return list(session.scalars(select(db.Device)
                                .order_by(db.Device.last_seen_at.desc(), db.Device.id)
                                .limit(limit).offset(offset)))
