"""workers, run purpose, episode verifier layers and diff

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 10:25:10.480576
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('workers',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('hostname', sa.String(length=128), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('queues', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('last_heartbeat_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('stopped_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_workers')),
    sa.UniqueConstraint('name', name=op.f('uq_workers_name'))
    )
    op.add_column('runs', sa.Column('purpose', sa.String(length=16), server_default='train', nullable=False))
    op.add_column('episodes', sa.Column('verifier_layers', postgresql.JSONB(astext_type=sa.Text()),
                                        server_default='[]', nullable=False))
    op.add_column('episodes', sa.Column('final_diff', sa.Text(), nullable=True))
    # Autogenerate does not see check constraints.
    op.create_check_constraint(
        op.f('ck_runs_purpose_known'), 'runs', "purpose IN ('train', 'pass_rate', 'eval')"
    )


def downgrade() -> None:
    op.drop_constraint(op.f('ck_runs_purpose_known'), 'runs', type_='check')
    op.drop_column('runs', 'purpose')
    op.drop_column('episodes', 'final_diff')
    op.drop_column('episodes', 'verifier_layers')
    op.drop_table('workers')
