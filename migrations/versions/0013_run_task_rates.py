"""each run's own pass rate of each task, and whether the task is in the run's band (issue 47)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06 07:15:00

A new table only. A run has no row until it next draws from a task's environment and split (or its trainer
next counts the task): the row is then seeded from `tasks.pass_rate`, which a run from before this
migration finds as the runs before it left it; from here on only the pass-rate job writes that column.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0013'
down_revision: str | None = '0012'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('run_task_rates',
    sa.Column('run_id', sa.BigInteger(), nullable=False),
    sa.Column('task_id', sa.BigInteger(), nullable=False),
    sa.Column('rate', sa.Float(), nullable=True),
    sa.Column('samples', sa.Float(), nullable=False),
    sa.Column('in_band', sa.Boolean(), nullable=False),
    sa.Column('policy_version', sa.BigInteger(), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('rate IS NULL OR (rate >= 0 AND rate <= 1)', name=op.f('ck_run_task_rates_rate_range')),
    sa.CheckConstraint('samples >= 0', name=op.f('ck_run_task_rates_samples_nonnegative')),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_run_task_rates_run_id_runs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['task_id'], ['tasks.id'], name=op.f('fk_run_task_rates_task_id_tasks'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'task_id', name=op.f('pk_run_task_rates'))
    )
    op.create_index(op.f('ix_run_task_rates_task_id'), 'run_task_rates', ['task_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_run_task_rates_task_id'), table_name='run_task_rates')
    op.drop_table('run_task_rates')
