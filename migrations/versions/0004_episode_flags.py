"""episode flags (hack monitors)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 14:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('episodes', sa.Column('flags', postgresql.ARRAY(sa.String(length=32)), server_default='{}',
                                        nullable=False))
    op.create_index('ix_episodes_flags', 'episodes', ['flags'], unique=False, postgresql_using='gin')


def downgrade() -> None:
    op.drop_index('ix_episodes_flags', table_name='episodes', postgresql_using='gin')
    op.drop_column('episodes', 'flags')
