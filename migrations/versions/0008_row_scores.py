"""Per-row, per-member scores: generations.row_scores (nullable zstd blob).

Each generation row may hold its members' scores on each batch row (ledger.rowscores), from
which `attribute` recomputes the generation's coefficients without one training row. The
row's chain digest covers the blob where it is set (ledger.chain), so rows committed
before this migration (NULL) keep their digests: nothing is recomputed and an old ledger
verifies and exports as before.

Adding a nullable column needs no table rebuild on SQLite (ALTER TABLE ADD COLUMN).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("generations", sa.Column("row_scores", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE generations DROP COLUMN row_scores")
    else:
        op.drop_column("generations", "row_scores")
