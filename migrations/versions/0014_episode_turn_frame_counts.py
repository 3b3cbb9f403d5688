"""each episode's turn-frame counts: prefix breaks, unparsed tool calls, turns without a tool call (issue 48)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 10:40:00

Three counters on `episodes`, 0 for every episode stored before (nothing was counted then).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0014'
down_revision: str | None = '0013'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ('prefix_breaks', 'unparsed_tool_calls', 'turns_without_tool_call')


def upgrade() -> None:
    for column in COLUMNS:
        op.add_column('episodes', sa.Column(column, sa.Integer(), server_default='0', nullable=False))


def downgrade() -> None:
    for column in reversed(COLUMNS):
        op.drop_column('episodes', column)
