"""off-policy bookkeeping (issue 10)

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 14:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('turns', sa.Column('weight_version_end', sa.Integer(), nullable=True))
    op.add_column('episodes', sa.Column('advantage', sa.Float(), nullable=True))
    op.add_column('episodes', sa.Column('trained_score', sa.Float(), nullable=True))
    op.add_column('runs', sa.Column('sync_error', sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column('runs', 'sync_error')
    op.drop_column('episodes', 'trained_score')
    op.drop_column('episodes', 'advantage')
    op.drop_column('turns', 'weight_version_end')
