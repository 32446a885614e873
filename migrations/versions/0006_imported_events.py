"""Imported events: events.origin and events.sent_at (nullable).

An import writes the events a history file (or a seed file's sessions) brought. They are
the sender's audit trail, not the receiver's: `origin` holds the digest of the seed file
they came with, `sent_at` the time the sender's ledger recorded them, and `at` the time
they were imported. Readers leave them out unless they ask for them (`Ledger.events`),
so a planted `verify`, `tune-trial` or `module` event never reads as the receiver's own.
Events written before this migration are the ledger's own: NULL in both.

Adding nullable columns needs no table rebuild on SQLite (ALTER TABLE ADD COLUMN).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

COLUMNS = ("origin", "sent_at")


def upgrade() -> None:
    op.add_column("events", sa.Column("origin", sa.String(64), nullable=True))
    op.add_column("events", sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    for name in COLUMNS:
        if op.get_bind().dialect.name == "sqlite":
            op.execute(f"ALTER TABLE events DROP COLUMN {name}")
        else:
            op.drop_column("events", name)
