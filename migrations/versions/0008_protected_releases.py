"""Protected releases (issue 23): a version may be protected (its artifacts and patches
stored sealed), its content key wrapped under the server's key-encryption key, each sealed
artifact's plaintext sha256 and length, and each device's X25519 key (NULL for agents that
predate it). Columns and one table; existing rows stay unprotected.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 23:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0008'
down_revision: str | None = '0007'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('model_versions') as batch:
        batch.add_column(sa.Column('protected', sa.Boolean(), nullable=False,
                                   server_default=sa.false()))
    with op.batch_alter_table('artifacts') as batch:
        batch.add_column(sa.Column('plain_sha256', sa.String(64), nullable=True))
        batch.add_column(sa.Column('plain_length', sa.BigInteger(), nullable=True))
    with op.batch_alter_table('devices') as batch:
        batch.add_column(sa.Column('box_public_key', sa.String(64), nullable=True))
    op.create_table(
        'content_keys',
        sa.Column('version_id', sa.Integer(), sa.ForeignKey('model_versions.id'),
                  primary_key=True),
        sa.Column('wrapped', sa.LargeBinary(), nullable=False),
        sa.Column('kek_id', sa.String(64), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table('content_keys')
    with op.batch_alter_table('devices') as batch:
        batch.drop_column('box_public_key')
    with op.batch_alter_table('artifacts') as batch:
        batch.drop_column('plain_length')
        batch.drop_column('plain_sha256')
    with op.batch_alter_table('model_versions') as batch:
        batch.drop_column('protected')
