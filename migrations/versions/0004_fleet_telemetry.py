"""Fleet telemetry (issue 12): device identity and revocation, idempotent report ids, each
device's standing per release, and the per-rollout guard.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 08:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('devices') as batch:
        batch.add_column(sa.Column('public_key', sa.String(64), nullable=True))
        batch.add_column(sa.Column('keyid', sa.String(64), nullable=True))
        batch.add_column(sa.Column('enrolled_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('active_versions', sa.JSON(), nullable=False,
                                   server_default='{}'))
    with op.batch_alter_table('telemetry_events') as batch:
        batch.add_column(sa.Column('report_id', sa.String(32), nullable=True))
        batch.create_unique_constraint('uq_telemetry_events_report_id', ['report_id'])
    with op.batch_alter_table('releases') as batch:
        batch.add_column(sa.Column('guard_min_devices', sa.Integer(), nullable=False,
                                   server_default='5'))
        batch.add_column(sa.Column('guard_max_fail_share_ppm', sa.Integer(), nullable=False,
                                   server_default='200000'))
        batch.add_column(sa.Column('guard_max_latency_p99_us', sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column('auto_promote', sa.Boolean(), nullable=False,
                                   server_default=sa.false()))
    op.create_table(
        'device_releases',
        sa.Column('device_id', sa.String(128), nullable=False),
        sa.Column('release_id', sa.Integer(), nullable=False),
        sa.Column('event', sa.String(16), nullable=True),
        sa.Column('event_at', sa.BigInteger(), nullable=True),
        sa.Column('downloaded', sa.Boolean(), nullable=False),
        sa.Column('rolled_back', sa.Boolean(), nullable=False),
        sa.Column('verdict', sa.String(16), nullable=True),
        sa.Column('shadow_at', sa.BigInteger(), nullable=True),
        sa.Column('samples', sa.BigInteger(), nullable=True),
        sa.Column('kl_mean_micro', sa.BigInteger(), nullable=True),
        sa.Column('kl_max_micro', sa.BigInteger(), nullable=True),
        sa.Column('active_p50_us', sa.BigInteger(), nullable=True),
        sa.Column('candidate_p50_us', sa.BigInteger(), nullable=True),
        sa.Column('candidate_p99_us', sa.BigInteger(), nullable=True),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['release_id'], ['releases.id'],
                                name='fk_device_releases_release_id_releases'),
        sa.PrimaryKeyConstraint('device_id', 'release_id', name='pk_device_releases'),
    )
    op.create_index('ix_device_releases_release_id_verdict', 'device_releases',
                    ['release_id', 'verdict'])


def downgrade() -> None:
    op.drop_index('ix_device_releases_release_id_verdict', table_name='device_releases')
    op.drop_table('device_releases')
    with op.batch_alter_table('releases') as batch:
        for column in ('auto_promote', 'guard_max_latency_p99_us', 'guard_max_fail_share_ppm',
                       'guard_min_devices'):
            batch.drop_column(column)
    with op.batch_alter_table('telemetry_events') as batch:
        batch.drop_constraint('uq_telemetry_events_report_id', type_='unique')
        batch.drop_column('report_id')
    with op.batch_alter_table('devices') as batch:
        for column in ('active_versions', 'revoked_at', 'enrolled_at', 'keyid', 'public_key'):
            batch.drop_column(column)
