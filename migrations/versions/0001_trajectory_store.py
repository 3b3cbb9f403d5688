"""trajectory store

Revision ID: 0001
Revises: 
Create Date: 2026-11-29 10:21:11.766757
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('api_tokens',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_api_tokens_token_hash'))
    )
    op.create_table('environments',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=64), nullable=False),
    sa.Column('spec', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('spec_hash', sa.String(length=64), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('version >= 1', name=op.f('ck_environments_version_positive')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_environments')),
    sa.UniqueConstraint('name', 'spec_hash', name=op.f('uq_environments_name_spec_hash')),
    sa.UniqueConstraint('name', 'version', name=op.f('uq_environments_name_version'))
    )
    op.create_table('runs',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('model', sa.Text(), nullable=False),
    sa.Column('mode', sa.String(length=8), nullable=False),
    sa.Column('group_size', sa.Integer(), nullable=False),
    sa.Column('batch_size', sa.Integer(), nullable=False),
    sa.Column('max_staleness', sa.Integer(), nullable=False),
    sa.Column('policy_version', sa.Integer(), nullable=False),
    sa.Column('config', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("mode IN ('sync', 'async')", name=op.f('ck_runs_mode_known')),
    sa.CheckConstraint('batch_size >= 1', name=op.f('ck_runs_batch_size_positive')),
    sa.CheckConstraint('group_size >= 1', name=op.f('ck_runs_group_size_positive')),
    sa.CheckConstraint('max_staleness >= 0', name=op.f('ck_runs_max_staleness_nonnegative')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs')),
    sa.UniqueConstraint('name', name=op.f('uq_runs_name'))
    )
    op.create_index(op.f('ix_runs_status'), 'runs', ['status'], unique=False)
    op.create_table('tasks',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('environment_name', sa.String(length=128), nullable=False),
    sa.Column('external_id', sa.String(length=256), nullable=False),
    sa.Column('split', sa.String(length=32), nullable=False),
    sa.Column('instruction', sa.Text(), nullable=False),
    sa.Column('payload', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('pass_rate', sa.Float(), nullable=True),
    sa.Column('pass_rate_samples', sa.Integer(), nullable=False),
    sa.Column('pass_rate_policy_version', sa.BigInteger(), nullable=True),
    sa.Column('difficulty', sa.String(length=16), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('pass_rate IS NULL OR (pass_rate >= 0 AND pass_rate <= 1)', name=op.f('ck_tasks_pass_rate_range')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tasks')),
    sa.UniqueConstraint('environment_name', 'external_id', name=op.f('uq_tasks_environment_name_external_id'))
    )
    op.create_index(op.f('ix_tasks_environment_name_split_difficulty'), 'tasks', ['environment_name', 'split', 'difficulty'], unique=False)
    op.create_table('episode_groups',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('run_id', sa.BigInteger(), nullable=False),
    sa.Column('group_index', sa.Integer(), nullable=False),
    sa.Column('task_id', sa.BigInteger(), nullable=False),
    sa.Column('environment_id', sa.BigInteger(), nullable=False),
    sa.Column('size', sa.Integer(), nullable=False),
    sa.Column('policy_version', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('consumed_step', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('size >= 1', name=op.f('ck_episode_groups_size_positive')),
    sa.ForeignKeyConstraint(['environment_id'], ['environments.id'], name=op.f('fk_episode_groups_environment_id_environments')),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_episode_groups_run_id_runs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['task_id'], ['tasks.id'], name=op.f('fk_episode_groups_task_id_tasks')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_episode_groups')),
    sa.UniqueConstraint('run_id', 'group_index', name=op.f('uq_episode_groups_run_id_group_index'))
    )
    op.create_index(op.f('ix_episode_groups_run_id_status'), 'episode_groups', ['run_id', 'status'], unique=False)
    op.create_table('policy_versions',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('run_id', sa.BigInteger(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('checkpoint_path', sa.Text(), nullable=True),
    sa.Column('training_step', sa.Integer(), nullable=True),
    sa.Column('sync_seconds', sa.Float(), nullable=True),
    sa.Column('probe_kl', sa.Float(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_policy_versions_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_policy_versions')),
    sa.UniqueConstraint('run_id', 'version', name=op.f('uq_policy_versions_run_id_version'))
    )
    op.create_table('run_environments',
    sa.Column('run_id', sa.BigInteger(), nullable=False),
    sa.Column('environment_id', sa.BigInteger(), nullable=False),
    sa.Column('weight', sa.Float(), nullable=False),
    sa.CheckConstraint('weight > 0', name=op.f('ck_run_environments_weight_positive')),
    sa.ForeignKeyConstraint(['environment_id'], ['environments.id'], name=op.f('fk_run_environments_environment_id_environments')),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_run_environments_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'environment_id', name=op.f('pk_run_environments'))
    )
    op.create_table('training_steps',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('run_id', sa.BigInteger(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('policy_version', sa.Integer(), nullable=False),
    sa.Column('metrics', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_training_steps_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_training_steps')),
    sa.UniqueConstraint('run_id', 'step', name=op.f('uq_training_steps_run_id_step'))
    )
    op.create_table('episodes',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('run_id', sa.BigInteger(), nullable=False),
    sa.Column('group_id', sa.BigInteger(), nullable=False),
    sa.Column('sample_index', sa.Integer(), nullable=False),
    sa.Column('task_id', sa.BigInteger(), nullable=False),
    sa.Column('environment_id', sa.BigInteger(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('failures', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('termination_reason', sa.String(length=32), nullable=True),
    sa.Column('reward', sa.Float(), nullable=True),
    sa.Column('reward_components', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('policy_version', sa.Integer(), nullable=True),
    sa.Column('policy_version_last', sa.Integer(), nullable=True),
    sa.Column('num_turns', sa.Integer(), nullable=False),
    sa.Column('num_tokens', sa.Integer(), nullable=False),
    sa.Column('timings', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('sandbox_id', sa.String(length=64), nullable=True),
    sa.Column('worker', sa.String(length=128), nullable=True),
    sa.Column('deadline_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("termination_reason IS NULL OR termination_reason IN ('submitted', 'max_turns', 'context_exhausted', 'episode_timeout', 'format_error', 'tool_error_limit', 'policy_error', 'sandbox_error', 'worker_lost', 'cancelled')", name=op.f('ck_episodes_reason_known')),
    sa.ForeignKeyConstraint(['environment_id'], ['environments.id'], name=op.f('fk_episodes_environment_id_environments')),
    sa.ForeignKeyConstraint(['group_id'], ['episode_groups.id'], name=op.f('fk_episodes_group_id_episode_groups'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_episodes_run_id_runs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['task_id'], ['tasks.id'], name=op.f('fk_episodes_task_id_tasks')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_episodes')),
    sa.UniqueConstraint('run_id', 'group_id', 'sample_index', name='uq_episodes_idempotency_key')
    )
    op.create_index(op.f('ix_episodes_group_id'), 'episodes', ['group_id'], unique=False)
    op.create_index('ix_episodes_reward_components', 'episodes', ['reward_components'], unique=False, postgresql_using='gin')
    op.create_index(op.f('ix_episodes_run_id_environment_id_id'), 'episodes', ['run_id', 'environment_id', 'id'], unique=False)
    op.create_index(op.f('ix_episodes_run_id_policy_version'), 'episodes', ['run_id', 'policy_version'], unique=False)
    op.create_index(op.f('ix_episodes_run_id_reward'), 'episodes', ['run_id', 'reward'], unique=False)
    op.create_index(op.f('ix_episodes_run_id_status'), 'episodes', ['run_id', 'status'], unique=False)
    op.create_index(op.f('ix_episodes_run_id_termination_reason'), 'episodes', ['run_id', 'termination_reason'], unique=False)
    op.create_table('sandbox_events',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('sandbox_id', sa.String(length=64), nullable=False),
    sa.Column('container_id', sa.String(length=80), nullable=True),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('worker', sa.String(length=128), nullable=True),
    sa.Column('run_id', sa.BigInteger(), nullable=True),
    sa.Column('episode_id', sa.BigInteger(), nullable=True),
    sa.Column('duration_ms', sa.Float(), nullable=True),
    sa.Column('detail', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.ForeignKeyConstraint(['episode_id'], ['episodes.id'], name=op.f('fk_sandbox_events_episode_id_episodes'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_sandbox_events_run_id_runs'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_sandbox_events'))
    )
    op.create_index(op.f('ix_sandbox_events_episode_id'), 'sandbox_events', ['episode_id'], unique=False)
    op.create_index(op.f('ix_sandbox_events_kind_created_at'), 'sandbox_events', ['kind', 'created_at'], unique=False)
    op.create_index(op.f('ix_sandbox_events_sandbox_id_id'), 'sandbox_events', ['sandbox_id', 'id'], unique=False)
    op.create_table('turns',
    sa.Column('run_id', sa.BigInteger(), nullable=False),
    sa.Column('episode_id', sa.BigInteger(), nullable=False),
    sa.Column('index', sa.Integer(), nullable=False),
    sa.Column('token_ids', postgresql.ARRAY(sa.Integer()), nullable=False),
    sa.Column('logprobs', postgresql.ARRAY(sa.REAL()), nullable=False),
    sa.Column('loss_mask', postgresql.ARRAY(sa.SmallInteger()), nullable=False),
    sa.Column('prompt_length', sa.Integer(), nullable=False),
    sa.Column('completion_text', sa.Text(), nullable=False),
    sa.Column('tool_call', postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    sa.Column('observation', sa.Text(), nullable=True),
    sa.Column('tool_output_full', sa.Text(), nullable=True),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('tool_status', sa.String(length=32), nullable=True),
    sa.Column('duration_s', sa.Float(), nullable=True),
    sa.Column('generation_s', sa.Float(), nullable=True),
    sa.Column('truncated', sa.Boolean(), nullable=False),
    sa.Column('truncated_bytes', sa.Integer(), nullable=False),
    sa.Column('weight_version', sa.Integer(), nullable=True),
    sa.Column('finish_reason', sa.String(length=32), nullable=True),
    sa.Column('search', postgresql.TSVECTOR(), sa.Computed("to_tsvector('simple', left(coalesce(completion_text, '') || ' ' || coalesce(observation, ''), 200000))", persisted=True), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('cardinality(token_ids) = cardinality(logprobs) AND cardinality(token_ids) = cardinality(loss_mask)', name=op.f('ck_turns_token_arrays_aligned')),
    sa.ForeignKeyConstraint(['episode_id'], ['episodes.id'], name=op.f('fk_turns_episode_id_episodes'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_turns_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'episode_id', 'index', name=op.f('pk_turns'))
    )
    op.create_index('ix_turns_search', 'turns', ['search'], unique=False, postgresql_using='gin')


def downgrade() -> None:
    op.drop_index('ix_turns_search', table_name='turns', postgresql_using='gin')
    op.drop_table('turns')
    op.drop_index(op.f('ix_sandbox_events_sandbox_id_id'), table_name='sandbox_events')
    op.drop_index(op.f('ix_sandbox_events_kind_created_at'), table_name='sandbox_events')
    op.drop_index(op.f('ix_sandbox_events_episode_id'), table_name='sandbox_events')
    op.drop_table('sandbox_events')
    op.drop_index(op.f('ix_episodes_run_id_termination_reason'), table_name='episodes')
    op.drop_index(op.f('ix_episodes_run_id_status'), table_name='episodes')
    op.drop_index(op.f('ix_episodes_run_id_reward'), table_name='episodes')
    op.drop_index(op.f('ix_episodes_run_id_policy_version'), table_name='episodes')
    op.drop_index(op.f('ix_episodes_run_id_environment_id_id'), table_name='episodes')
    op.drop_index('ix_episodes_reward_components', table_name='episodes', postgresql_using='gin')
    op.drop_index(op.f('ix_episodes_group_id'), table_name='episodes')
    op.drop_table('episodes')
    op.drop_table('training_steps')
    op.drop_table('run_environments')
    op.drop_table('policy_versions')
    op.drop_index(op.f('ix_episode_groups_run_id_status'), table_name='episode_groups')
    op.drop_table('episode_groups')
    op.drop_index(op.f('ix_tasks_environment_name_split_difficulty'), table_name='tasks')
    op.drop_table('tasks')
    op.drop_index(op.f('ix_runs_status'), table_name='runs')
    op.drop_table('runs')
    op.drop_table('environments')
    op.drop_table('api_tokens')
