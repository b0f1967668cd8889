"""Fleet verdicts that cannot be forged (issue 20): enrolment tokens with a device quota,
an expiry and a rate limit; who enrolled a device and whether it was attested; channels
that require attestation; each report's standing (counted | not_offered | forged |
unattested); when a device's counted pass first arrived; the promotion evidence a rollout
asks for; and what a resumed halt restores. Columns only; existing rows keep today's
behaviour (no quota, no expiry, no attestation, evidence from the guard's min_devices).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 22:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0007'
down_revision: str | None = '0006'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('api_tokens') as batch:
        batch.add_column(sa.Column('device_quota', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('enroll_per_hour', sa.Integer(), nullable=True))
    with op.batch_alter_table('devices') as batch:
        batch.add_column(sa.Column('enrolled_by_token_id', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('attested_by', sa.String(64), nullable=True))
        batch.create_index('ix_devices_enrolled_by_token_id', ['enrolled_by_token_id'])
    with op.batch_alter_table('channels') as batch:
        batch.add_column(sa.Column('require_attestation', sa.Boolean(), nullable=False,
                                   server_default=sa.false()))
    with op.batch_alter_table('releases') as batch:
        batch.add_column(sa.Column('promote_min_passed', sa.Integer(), nullable=True))
        batch.add_column(sa.Column('promote_min_spread_s', sa.Integer(), nullable=False,
                                   server_default='0'))
        batch.add_column(sa.Column('evidence_since', sa.DateTime(timezone=True),
                                   nullable=True))
        batch.add_column(sa.Column('share_before_halt_ppm', sa.Integer(), nullable=True))
    with op.batch_alter_table('device_releases') as batch:
        batch.add_column(sa.Column('passed_at', sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table('telemetry_events') as batch:
        batch.add_column(sa.Column('standing', sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('telemetry_events') as batch:
        batch.drop_column('standing')
    with op.batch_alter_table('device_releases') as batch:
        batch.drop_column('passed_at')
    with op.batch_alter_table('releases') as batch:
        for column in ('share_before_halt_ppm', 'evidence_since', 'promote_min_spread_s',
                       'promote_min_passed'):
            batch.drop_column(column)
    with op.batch_alter_table('channels') as batch:
        batch.drop_column('require_attestation')
    with op.batch_alter_table('devices') as batch:
        batch.drop_index('ix_devices_enrolled_by_token_id')
        batch.drop_column('attested_by')
        batch.drop_column('enrolled_by_token_id')
    with op.batch_alter_table('api_tokens') as batch:
        for column in ('enroll_per_hour', 'expires_at', 'device_quota'):
            batch.drop_column(column)
