"""agent-program episodes: each turn's token segment, each episode's program record, the program_exited
termination reason (issue 51)

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07 07:00:00

`turns.segment` (0 for every turn stored before: Crucible's own loop makes one token stream per episode):
an agent program's call that does not extend the previous call's tokens starts a new segment, trained as a
sequence of its own. `episodes.program` (null for every episode of the tool loop): the program's exit status,
calls, refused requests, segments and last output (core.schemas.episode.ProgramRecord). The reasons' check
constraint gains program_exited; a downgrade refuses while an episode holds it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0016'
down_revision: str | None = '0015'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BEFORE = ('submitted', 'max_turns', 'context_exhausted', 'episode_timeout', 'format_error', 'tool_error_limit',
          'policy_error', 'sandbox_error', 'judge_error', 'worker_lost', 'cancelled')
AFTER = (*BEFORE[:6], 'program_exited', *BEFORE[6:])  # core.termination.TerminationReason's order


def _reasons(reasons: tuple[str, ...]) -> None:
    op.drop_constraint(op.f('ck_episodes_reason_known'), 'episodes', type_='check')
    listed = ", ".join(f"'{reason}'" for reason in reasons)
    op.create_check_constraint(op.f('ck_episodes_reason_known'), 'episodes',
                               f"termination_reason IS NULL OR termination_reason IN ({listed})")


def upgrade() -> None:
    op.add_column('turns', sa.Column('segment', sa.Integer(), server_default='0', nullable=False))
    op.add_column('episodes', sa.Column('program', postgresql.JSONB(astext_type=sa.Text()), nullable=True))
    _reasons(AFTER)


def downgrade() -> None:
    _reasons(BEFORE)
    op.drop_column('episodes', 'program')
    op.drop_column('turns', 'segment')
