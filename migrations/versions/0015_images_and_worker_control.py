"""the catalogue of sandbox images pushed to a registry; each worker's sandbox control address (issue 50)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06 23:40:00

`sandbox_images`: per local image name, the registry it was pushed to (`pushed_to`), its repository there and its
digest, which a worker host that lacks the image pulls (`crucible images push` writes it). `workers.control_url`: where the API
reaches a worker's sandbox control service (task_workers/control.py), published with its heartbeat.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0015'
down_revision: str | None = '0014'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'sandbox_images',
        sa.Column('image', sa.String(length=512), nullable=False),
        sa.Column('pushed_to', sa.String(length=512), nullable=False),
        sa.Column('repository', sa.String(length=512), nullable=False),
        sa.Column('digest', sa.String(length=80), nullable=False),
        sa.Column('pushed_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
        sa.PrimaryKeyConstraint('image', name=op.f('pk_sandbox_images')),
    )
    op.add_column('workers', sa.Column('control_url', sa.String(length=256), nullable=True))


def downgrade() -> None:
    op.drop_column('workers', 'control_url')
    op.drop_table('sandbox_images')
