"""Per-generation perturbation: generations.noise_spec / param_selection (nullable).

A seed file's lineage is imported as one run, but a fork along it may have changed the
perturbation kind (low-rank parent, full-rank fork). The run row holds one kind (its own,
the one `resume` continues with); a generation whose kind differs records its own here,
and replay uses it. NULL, what every existing row holds, means "the run's".

Adding nullable columns needs no table rebuild on SQLite (plain ALTER TABLE ADD COLUMN),
so the audit views stay in place; SQLite >= 3.35 drops them the same way.

Revision ID: 0005
Revises: 0004_postgres
Create Date: 2025-01-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004_postgres"
branch_labels = None
depends_on = None

COLUMNS = ("noise_spec", "param_selection")


def upgrade() -> None:
    op.add_column("generations", sa.Column("noise_spec", sa.String(32), nullable=True))
    op.add_column("generations", sa.Column("param_selection", sa.Text(), nullable=True))


def downgrade() -> None:
    for name in COLUMNS:
        if op.get_bind().dialect.name == "sqlite":
            op.execute(f"ALTER TABLE generations DROP COLUMN {name}")
        else:
            op.drop_column("generations", name)
