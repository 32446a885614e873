"""Inputs inside the hash chain: generations.inputs_digest (nullable).

Each generation row names the digest of the inputs record (the session's `inputs` event)
in force when it committed, and the row's chain digest covers it (ledger.chain hashes the
field where it is set; ledger.sessions checks the record against it). Rows committed
before this migration keep NULL, so their chain digests stay what they were: nothing is
recomputed, and an old ledger verifies as before; rows committed after bind their record.

Adding a nullable column needs no table rebuild on SQLite (ALTER TABLE ADD COLUMN).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("generations", sa.Column("inputs_digest", sa.String(64), nullable=True))


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE generations DROP COLUMN inputs_digest")
    else:
        op.drop_column("generations", "inputs_digest")
