"""Telemetry ingestion (issue 12): drop the index on telemetry_events.device_id. No query
reads the table by device (the timeline and health read by release, through
ix_telemetry_events_release_id_received_at; a device's standing is device_releases), and
keeping it up to date was about a sixth of PostgreSQL's CPU per stored report. Index only;
no data changes, and code before and after runs against either schema.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 14:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = '0006'
down_revision: str | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('telemetry_events') as batch:
        batch.drop_index('ix_telemetry_events_device_id')


def downgrade() -> None:
    with op.batch_alter_table('telemetry_events') as batch:
        batch.create_index('ix_telemetry_events_device_id', ['device_id'], unique=False)
