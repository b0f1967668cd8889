"""The audit log: every write records who did what to which target, in the same transaction
as the write itself (so a rolled-back write leaves no audit row and vice versa)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from server.db.models import AuditEvent

MAX_AUDIT_PAGE = 500


def record(
    session: Session, actor: str, action: str, target: str = "", **details: object
) -> AuditEvent:
    event = AuditEvent(actor=actor, action=action, target=target, details=details)
    session.add(event)
    return event


def list_events(
    session: Session,
    *,
    limit: int = 100,
    before_id: int | None = None,
    action: str | None = None,
    target_prefix: str | None = None,
) -> list[AuditEvent]:
    """Newest first; page with `before_id` (the smallest id of the previous page)."""
    query = select(AuditEvent).order_by(AuditEvent.id.desc()).limit(min(limit, MAX_AUDIT_PAGE))
    if before_id is not None:
        query = query.where(AuditEvent.id < before_id)
    if action:
        query = query.where(AuditEvent.action == action)
    if target_prefix:
        query = query.where(AuditEvent.target.startswith(target_prefix, autoescape=True))
    return list(session.scalars(query))
