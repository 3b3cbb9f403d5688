"""per-token behaviour versions on turns; why a group was not trained on; the rule a task's pass rate
was measured with and how long its episodes take (issue 23)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 02:30:00

Nullable columns only (no rewrite of stored rows). A turn stored before this migration has no
`version_runs`: the trainer labels each of its sampled tokens with the turn's `weight_version`, the
oldest that can have sampled it (trainer.rollouts). A group dropped before it has no `drop_reason`.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0011'
down_revision: str | None = '0010'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # On the partitioned parent: Postgres adds the column to every partition.
    op.add_column('turns', sa.Column('version_runs', postgresql.ARRAY(sa.Integer()), nullable=True))
    op.add_column('episode_groups', sa.Column('drop_reason', sa.String(length=32), nullable=True))
    op.add_column('episode_groups', sa.Column('dropped_step', sa.Integer(), nullable=True))
    op.add_column('tasks', sa.Column('pass_rate_rule', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    op.add_column('tasks', sa.Column('episode_seconds', sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column('tasks', 'episode_seconds')
    op.drop_column('tasks', 'pass_rate_rule')
    op.drop_column('episode_groups', 'dropped_step')
    op.drop_column('episode_groups', 'drop_reason')
    op.drop_column('turns', 'version_runs')
