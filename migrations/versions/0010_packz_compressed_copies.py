"""Compressed artifact copies (manifests/compressed.py): per artifact and per watermark
cohort copy, the codec, sha256, length and blob key of the compressed copy the manifest
offers beside the content. Nullable columns; existing rows have no copy and are offered as
before.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 10:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0010'
down_revision: str | None = '0009'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ('artifacts', 'cohort_artifacts')


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column('compressed_codec', sa.String(16), nullable=True))
            batch.add_column(sa.Column('compressed_sha256', sa.String(64), nullable=True))
            batch.add_column(sa.Column('compressed_length', sa.BigInteger(), nullable=True))
            batch.add_column(sa.Column('compressed_blob_key', sa.String(512), nullable=True))
        op.create_index(f'ix_{table}_compressed_sha256', table, ['compressed_sha256'])


def downgrade() -> None:
    for table in TABLES:
        op.drop_index(f'ix_{table}_compressed_sha256', table)
        with op.batch_alter_table(table) as batch:
            for column in ('compressed_blob_key', 'compressed_length', 'compressed_sha256',
                           'compressed_codec'):
                batch.drop_column(column)
