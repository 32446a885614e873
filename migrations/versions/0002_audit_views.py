"""Audit views and lookup indexes.

Views (plain SQL, same on SQLite and PostgreSQL), for `sqlite3 seedledger.db`:

- generation_summary: one row per generation: run, generation, population, lr, sigma,
  schedule_step, reward mean/std/min/max, fingerprint, wall_time (s), committed_at.
- member_audit: one row per member: run, generation, member, key (as signed int64; add
  2**64 when negative), sign, reward, coefficient (audit copy; the exact value is in
  generations.coefficients, float64 LE), components (JSON).
- run_lineage: one row per run: run, parent, parent_generation, status, created_at,
  first_generation, latest_generation (its own records), generations (count).

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

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


def upgrade() -> None:
    op.create_index("ix_runs_parent_id", "runs", ["parent_id"])
    op.create_index("ix_events_run_id_at", "events", ["run_id", "at"])
    op.create_index("ix_events_kind", "events", ["kind"])
    for name, sql in VIEWS.items():
        op.execute(f"CREATE VIEW {name} AS {sql}")


def downgrade() -> None:
    for name in VIEWS:
        op.execute(f"DROP VIEW {name}")
    op.drop_index("ix_events_kind", "events")
    op.drop_index("ix_events_run_id_at", "events")
    op.drop_index("ix_runs_parent_id", "runs")
