"""worker incarnations: the process beating under a worker name, and the one that leased an episode
(issue 24)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 15:00:00

Nullable columns only. A worker row or an episode from before this migration has no incarnation: the
controller judges it by the worker's name and the episode's deadline, as before.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0012'
down_revision: str | None = '0011'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column('workers', sa.Column('incarnation', sa.String(length=64), nullable=True))
    op.add_column('episodes', sa.Column('worker_incarnation', sa.String(length=64), nullable=True))


def downgrade() -> None:
    op.drop_column('episodes', 'worker_incarnation')
    op.drop_column('workers', 'incarnation')
