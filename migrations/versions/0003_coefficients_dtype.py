"""Declare the dtype of the exact arrays: generations.coefficients_dtype ('float64-le').

`generations.coefficients` (and `rewards`) hold little-endian float64, `keys` little-endian
uint64; until now only a comment said so. The column `coefficients_dtype` declares it per
row, server default 'float64-le' (what every existing row holds), with a CHECK that only
encodings this version reads are stored. The ledger refuses to read a row whose dtype it
does not know instead of misreading its bytes.

On SQLite the CHECK needs a table rebuild (batch mode: copy, drop, rename). That runs with
foreign keys OFF (see migrations/env.py), so dropping the old `generations` does not
cascade to `members`, and the audit views, which SQLite would not let a table be renamed
under, are dropped first and recreated after.

Revision ID: 0003
Revises: 0002
Create Date: 2025-01-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

DTYPE = "float64-le"

# A snapshot of 0002's views (a migration never imports another one).
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


def _drop_views() -> None:
    for name in VIEWS:
        op.execute(f"DROP VIEW IF EXISTS {name}")


def _create_views() -> None:
    for name, sql in VIEWS.items():
        op.execute(f"CREATE VIEW {name} AS {sql}")


def _recreate() -> str:
    return "always" if op.get_bind().dialect.name == "sqlite" else "auto"


def upgrade() -> None:
    _drop_views()
    with op.batch_alter_table("generations", recreate=_recreate()) as batch:
        batch.add_column(
            sa.Column(
                "coefficients_dtype",
                sa.String(16),
                nullable=False,
                server_default=DTYPE,
            )
        )
        batch.create_check_constraint(
            "ck_generation_coefficients_dtype", f"coefficients_dtype IN ('{DTYPE}')"
        )
    _create_views()


def downgrade() -> None:
    _drop_views()
    with op.batch_alter_table("generations", recreate=_recreate()) as batch:
        batch.drop_constraint("ck_generation_coefficients_dtype", type_="check")
        batch.drop_column("coefficients_dtype")
    _create_views()
