"""worker incarnations: the process beating under a worker name, and the one that leased an episode;
the policy replicas a worker holds out of rotation; the judge_error termination reason; dashboard
sessions (issue 24)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 15:00:00

Nullable columns only. A worker row or an episode from before this migration has no incarnation: the
controller judges it by the worker's name and the episode's deadline, as before. The reasons' check
constraint gains judge_error (a played episode a judge never scored); a downgrade refuses while an
episode holds it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0012'
down_revision: str | None = '0011'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


BEFORE = ('submitted', 'max_turns', 'context_exhausted', 'episode_timeout', 'format_error', 'tool_error_limit',
          'policy_error', 'sandbox_error', 'worker_lost', 'cancelled')
AFTER = (*BEFORE[:8], 'judge_error', *BEFORE[8:])  # core.termination.TerminationReason's order


def _reasons(reasons: tuple[str, ...]) -> None:
    op.drop_constraint(op.f('ck_episodes_reason_known'), 'episodes', type_='check')
    listed = ", ".join(f"'{reason}'" for reason in reasons)
    op.create_check_constraint(op.f('ck_episodes_reason_known'), 'episodes',
                               f"termination_reason IS NULL OR termination_reason IN ({listed})")


def upgrade() -> None:
    op.add_column('workers', sa.Column('incarnation', sa.String(length=64), nullable=True))
    op.add_column('episodes', sa.Column('worker_incarnation', sa.String(length=64), nullable=True))
    op.add_column('workers', sa.Column('replicas_out', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    _reasons(AFTER)
    op.create_table('dashboard_sessions',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('token_id', sa.BigInteger(), nullable=False),
    sa.Column('secret_hash', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['token_id'], ['api_tokens.id'], name=op.f('fk_dashboard_sessions_token_id_api_tokens'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_dashboard_sessions')),
    sa.UniqueConstraint('secret_hash', name=op.f('uq_dashboard_sessions_secret_hash'))
    )
    op.create_index(op.f('ix_dashboard_sessions_token_id'), 'dashboard_sessions', ['token_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_dashboard_sessions_token_id'), table_name='dashboard_sessions')
    op.drop_table('dashboard_sessions')
    _reasons(BEFORE)
    op.drop_column('workers', 'replicas_out')
    op.drop_column('episodes', 'worker_incarnation')
    op.drop_column('workers', 'incarnation')
