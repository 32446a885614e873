"""Hash chain: generations.digest over each row, its members and its predecessor's digest.

Adds the column and fills it for every existing generation, run by run in creation order
(a parent is always older than its forks), with the encoding of `ledger.chain` (versioned:
`seedledger-chain-v1` is frozen, so this migration computes what every later version
checks). Rows are read through reflected tables, so times and floats come back typed as
the ledger reads them. Adding a nullable column needs no table rebuild, even on SQLite.

Revision ID: 0004_postgres
Revises: 0003
Create Date: 2025-01-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from seedledger.ledger import chain

revision = "0004_postgres"
down_revision = "0003"
branch_labels = None
depends_on = None

# A snapshot of 0002's views (a migration never imports another one): the downgrade's
# table rebuild on SQLite needs them dropped and recreated.
VIEWS = {
    "generation_summary": """
        SELECT r.name AS run, g.idx AS generation, g.population, g.lr, g.sigma,
               g.schedule_step, g.reward_mean, g.reward_std, g.reward_min, g.reward_max,
               g.fingerprint, g.wall_time, g.committed_at
        FROM generations g JOIN runs r ON r.id = g.run_id
    """,
    "member_audit": """
        SELECT r.name AS run, g.idx AS generation, m.idx AS member, m.key, m.sign,
               m.reward, m.coefficient, m.components
        FROM members m
        JOIN generations g ON g.id = m.generation_id
        JOIN runs r ON r.id = g.run_id
    """,
    "run_lineage": """
        SELECT r.name AS run, p.name AS parent, r.parent_generation, r.status,
               r.created_at, MIN(g.idx) AS first_generation,
               MAX(g.idx) AS latest_generation, COUNT(g.id) AS generations
        FROM runs r
        LEFT JOIN runs p ON p.id = r.parent_id
        LEFT JOIN generations g ON g.run_id = r.id
        GROUP BY r.id, r.name, p.name, r.parent_generation, r.status, r.created_at
    """,
}


def _fill(bind) -> None:
    meta = sa.MetaData()
    runs, gens, members = (
        sa.Table(name, meta, autoload_with=bind) for name in ("runs", "generations", "members")
    )
    genesis: dict[int, str] = {}
    digests: dict[tuple[int, int], str] = {}
    by_id = {r.id: r for r in bind.execute(sa.select(runs).order_by(runs.c.id))}

    def start(row) -> int:
        return (row.parent_generation or 0) + 1 if row.parent_id is not None else 1

    def head(row, g: int) -> str:  # as ledger.integrity: the digest at g along row's lineage
        while g < start(row) and row.parent_id is not None:
            row = by_id[row.parent_id]
        return genesis[row.id] if g == 0 else digests.get((row.id, g), "")

    for row in by_id.values():  # creation order: parents first
        parent_head = head(by_id[row.parent_id], row.parent_generation) if row.parent_id is not None else None
        genesis[row.id] = chain.genesis(row, parent_head)
        prev = genesis[row.id]
        for g in bind.execute(sa.select(gens).where(gens.c.run_id == row.id).order_by(gens.c.idx)):
            ms = list(
                bind.execute(
                    sa.select(members).where(members.c.generation_id == g.id).order_by(members.c.idx)
                )
            )
            prev = digests[(row.id, g.idx)] = chain.generation_digest(prev, g, ms)
            bind.execute(gens.update().where(gens.c.id == g.id).values(digest=prev))


def upgrade() -> None:
    op.add_column("generations", sa.Column("digest", sa.String(64)))
    _fill(op.get_bind())


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    for name in VIEWS:
        op.execute(f"DROP VIEW IF EXISTS {name}")
    with op.batch_alter_table("generations", recreate="always" if sqlite else "auto") as batch:
        batch.drop_column("digest")
    for name, sql in VIEWS.items():
        op.execute(f"CREATE VIEW {name} AS {sql}")
