"""episodes by run

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 11:24:04.764393
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(op.f('ix_episodes_run_id_id'), 'episodes', ['run_id', 'id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_episodes_run_id_id'), table_name='episodes')
