"""releases.failed_platforms: platforms released without their build (devices get the
portable ONNX artifact)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 07:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('releases') as batch:
        batch.add_column(sa.Column('failed_platforms', sa.JSON(), nullable=False,
                                   server_default='[]'))


def downgrade() -> None:
    with op.batch_alter_table('releases') as batch:
        batch.drop_column('failed_platforms')
