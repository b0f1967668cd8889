"""The audit log: every write records who did what to which target, in the same transaction
as the write itself (so a rolled-back write leaves no audit row and vice versa)."""

from __future__ import annotations

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from server.db.models import AuditEvent

MAX_AUDIT_PAGE = 500
_PENDING = "modelfleet.audit.pending"  # session.info key: events recorded, not yet stamped


def record(
    session: Session, actor: str, action: str, target: str = "", **details: object
) -> AuditEvent:
    row = AuditEvent(actor=actor, action=action, target=target, details=details)
    session.add(row)
    session.info.setdefault(_PENDING, []).append(row)
    return row


@event.listens_for(Session, "after_commit")
@event.listens_for(Session, "after_rollback")
def _forget_pending(session: Session) -> None:  # a new transaction starts with none pending
    session.info.pop(_PENDING, None)


def stamp_serial(session: Session, serial: int) -> None:
    """Names the manifest serial that the session's transaction publishes in each event it
    recorded so far: the audit log then says which change made which serial, and a serial
    with no event (or an event naming a serial that was never committed) is a lost or
    phantom change (tests/support/invariants.py checks both)."""
    for row in session.info.pop(_PENDING, []):
        row.details = {**row.details, "serial": serial}


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
