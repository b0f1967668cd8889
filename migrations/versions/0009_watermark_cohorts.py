"""Per-cohort watermarked artifacts (issue 23): each cohort's copy of a watermarked
version's artifact, the patches to each copy, and the private key of the unmarked artifact that identification
compares a leaked file with. Two tables and one nullable column; existing rows are
unwatermarked.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 01:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0009'
down_revision: str | None = '0008'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('artifacts') as batch:
        batch.add_column(sa.Column('unmarked_blob_key', sa.String(512), nullable=True))
    op.create_table(
        'cohort_artifacts',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('artifact_id', sa.Integer(), sa.ForeignKey('artifacts.id'), nullable=False),
        sa.Column('cohort', sa.Integer(), nullable=False),
        sa.Column('sha256', sa.String(64), nullable=False),
        sa.Column('length', sa.BigInteger(), nullable=False),
        sa.Column('blob_key', sa.String(512), nullable=False),
        sa.Column('plain_sha256', sa.String(64), nullable=True),
        sa.Column('plain_length', sa.BigInteger(), nullable=True),
        sa.UniqueConstraint('artifact_id', 'cohort', name='uq_cohort_artifacts_artifact_id'),
    )
    op.create_index('ix_cohort_artifacts_artifact_id', 'cohort_artifacts', ['artifact_id'])
    op.create_index('ix_cohort_artifacts_sha256', 'cohort_artifacts', ['sha256'])
    op.create_table(
        'cohort_patches',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('to_cohort_artifact_id', sa.Integer(), sa.ForeignKey('cohort_artifacts.id'),
                  nullable=False),
        sa.Column('from_sha256', sa.String(64), nullable=False),
        sa.Column('algorithm', sa.String(32), nullable=False),
        sa.Column('sha256', sa.String(64), nullable=False),
        sa.Column('length', sa.BigInteger(), nullable=False),
        sa.Column('blob_key', sa.String(512), nullable=False),
        sa.UniqueConstraint('to_cohort_artifact_id', 'from_sha256',
                            name='uq_cohort_patches_to_cohort_artifact_id'),
    )
    op.create_index('ix_cohort_patches_to_cohort_artifact_id', 'cohort_patches',
                    ['to_cohort_artifact_id'])
    op.create_index('ix_cohort_patches_sha256', 'cohort_patches', ['sha256'])


def downgrade() -> None:
    op.drop_index('ix_cohort_patches_sha256', 'cohort_patches')
    op.drop_index('ix_cohort_patches_to_cohort_artifact_id', 'cohort_patches')
    op.drop_table('cohort_patches')
    op.drop_index('ix_cohort_artifacts_sha256', 'cohort_artifacts')
    op.drop_index('ix_cohort_artifacts_artifact_id', 'cohort_artifacts')
    op.drop_table('cohort_artifacts')
    with op.batch_alter_table('artifacts') as batch:
        batch.drop_column('unmarked_blob_key')
