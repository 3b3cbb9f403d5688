"""turns.replica: the policy replica that sampled each turn (issue 14, the policy pool)

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 23:58:00

A nullable column without a default: Postgres adds it without rewriting the table, so it applies to
a populated database as is (turns stored before it read None: one server, not recorded).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0007'
down_revision: str | None = '0006'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('turns', sa.Column('replica', sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column('turns', 'replica')
