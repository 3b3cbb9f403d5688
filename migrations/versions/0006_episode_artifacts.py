"""episode artifacts: screenshots and opening observations per turn (issue 12)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 19:05:18

A new table only: rows already stored are untouched, so it applies to a populated database as is.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0006'
down_revision: str | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('episode_artifacts',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('run_id', sa.BigInteger(), nullable=False),
    sa.Column('episode_id', sa.BigInteger(), nullable=False),
    sa.Column('turn_index', sa.Integer(), nullable=True),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('media_type', sa.String(length=64), nullable=False),
    sa.Column('size', sa.Integer(), nullable=False),
    sa.Column('data', sa.LargeBinary(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("media_type IN ('image/png', 'image/jpeg', 'text/plain')", name=op.f('ck_episode_artifacts_media_type_allowed')),
    sa.CheckConstraint('size = octet_length(data)', name=op.f('ck_episode_artifacts_size_matches_data')),
    sa.CheckConstraint('turn_index IS NULL OR turn_index >= 0', name=op.f('ck_episode_artifacts_turn_index_non_negative')),
    sa.ForeignKeyConstraint(['episode_id'], ['episodes.id'], name=op.f('fk_episode_artifacts_episode_id_episodes'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_episode_artifacts_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_episode_artifacts'))
    )
    op.create_index(op.f('ix_episode_artifacts_episode_id'), 'episode_artifacts', ['episode_id'], unique=False)
    # PNG and JPEG are compressed already: keep TOAST from trying again on every screenshot.
    op.execute('ALTER TABLE episode_artifacts ALTER COLUMN data SET STORAGE EXTERNAL')


def downgrade() -> None:
    op.drop_index(op.f('ix_episode_artifacts_episode_id'), table_name='episode_artifacts')
    op.drop_table('episode_artifacts')
