"""episode regrades: a newer grader's verdicts beside the stored ones (issue 22)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 23:10:00

A new table only: rows already stored are untouched, so it applies to a populated database as is.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0010'
down_revision: str | None = '0009'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('episode_regrades',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('run_id', sa.BigInteger(), nullable=False),
    sa.Column('episode_id', sa.BigInteger(), nullable=False),
    sa.Column('grader', sa.String(length=64), nullable=False),
    sa.Column('reward', sa.Float(), nullable=False),
    sa.Column('reward_components', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('verifier_layers', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('flags', postgresql.ARRAY(sa.String(length=32)), nullable=False),
    sa.Column('previous_reward', sa.Float(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['episode_id'], ['episodes.id'], name=op.f('fk_episode_regrades_episode_id_episodes'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_episode_regrades_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_episode_regrades'))
    )
    op.create_index(op.f('ix_episode_regrades_run_id_episode_id'), 'episode_regrades', ['run_id', 'episode_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_episode_regrades_run_id_episode_id'), table_name='episode_regrades')
    op.drop_table('episode_regrades')
