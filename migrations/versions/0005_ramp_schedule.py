"""Ramp schedules (issue 12): a release may step its share through a schedule (e.g. 1 → 5 →
25 → 100%) while it stays healthy. Columns only; existing releases get no schedule.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('releases') as batch:
        batch.add_column(sa.Column('ramp_steps_ppm', sa.JSON(), nullable=False,
                                   server_default='[]'))
        batch.add_column(sa.Column('ramp_interval_s', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('ramp_step', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('ramp_next_at', sa.BigInteger(), nullable=True))
        batch.create_index('ix_releases_ramp_next_at', ['ramp_next_at'])


def downgrade() -> None:
    with op.batch_alter_table('releases') as batch:
        batch.drop_index('ix_releases_ramp_next_at')
        for column in ('ramp_next_at', 'ramp_step', 'ramp_interval_s', 'ramp_steps_ppm'):
            batch.drop_column(column)
