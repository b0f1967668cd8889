"""patch jobs: durable delta-patch generation; one patch per (base, target) pair

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 13:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'patch_jobs',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('version_id', sa.Integer(), nullable=False),
        sa.Column('state', sa.String(length=32), nullable=False),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('requests', sa.Integer(), nullable=False),
        sa.Column('requests_claimed', sa.Integer(), nullable=False),
        sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('locked_by', sa.String(length=128), nullable=True),
        sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('patches_added', sa.Integer(), nullable=False),
        sa.Column('error', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['version_id'], ['model_versions.id'],
                                name=op.f('fk_patch_jobs_version_id_model_versions')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_patch_jobs')),
        sa.UniqueConstraint('version_id', name=op.f('uq_patch_jobs_version_id')),
    )
    with op.batch_alter_table('patch_jobs', schema=None) as batch_op:
        batch_op.create_index('ix_patch_jobs_state_next_attempt_at',
                              ['state', 'next_attempt_at'], unique=False)
    # Rows from before this revision cannot hold two algorithms for one pair (one job made
    # one patch per pair), so the stricter constraint applies without a data fix.
    with op.batch_alter_table('patches', schema=None) as batch_op:
        batch_op.drop_constraint('uq_patches_from_artifact_id', type_='unique')
        batch_op.create_unique_constraint('uq_patches_pair',
                                          ['from_artifact_id', 'to_artifact_id'])


def downgrade() -> None:
    with op.batch_alter_table('patches', schema=None) as batch_op:
        batch_op.drop_constraint('uq_patches_pair', type_='unique')
        batch_op.create_unique_constraint('uq_patches_from_artifact_id',
                                          ['from_artifact_id', 'to_artifact_id', 'algorithm'])
    with op.batch_alter_table('patch_jobs', schema=None) as batch_op:
        batch_op.drop_index('ix_patch_jobs_state_next_attempt_at')
    op.drop_table('patch_jobs')
