"""Initial schema: runs, generations, members, anchors, events, leases.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("base_model", sa.Text, nullable=False),
        sa.Column("base_revision", sa.Text),
        sa.Column("base_fingerprint", sa.String(64)),
        sa.Column("noise_spec", sa.String(32), nullable=False),
        sa.Column("dtype_policy", sa.String(64), nullable=False),
        sa.Column("param_selection", sa.Text, nullable=False),
        sa.Column("config", sa.Text, nullable=False),
        sa.Column("seed", sa.BigInteger),
        sa.Column("run_key", sa.BigInteger, nullable=False),
        sa.Column("parent_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="RESTRICT")),
        sa.Column("parent_generation", sa.Integer),
        sa.Column("software", sa.Text, nullable=False),
        sa.Column("host", sa.String(255)),
    )
    op.create_table(
        "generations",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column(
            "run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("idx", sa.Integer, nullable=False),
        sa.Column("lr", sa.Float, nullable=False),
        sa.Column("sigma", sa.Float, nullable=False),
        sa.Column("population", sa.Integer, nullable=False),
        sa.Column("optimizer", sa.Text, nullable=False),
        sa.Column("schedule_step", sa.Integer, nullable=False),
        sa.Column("batch_indices", sa.Text, nullable=False),
        sa.Column("keys", sa.LargeBinary, nullable=False),
        sa.Column("coefficients", sa.LargeBinary, nullable=False),
        sa.Column("rewards", sa.LargeBinary, nullable=False),
        sa.Column("reward_mean", sa.Float),
        sa.Column("reward_std", sa.Float),
        sa.Column("reward_min", sa.Float),
        sa.Column("reward_max", sa.Float),
        sa.Column("fingerprint", sa.String(64)),
        sa.Column("timings", sa.Text, nullable=False),
        sa.Column("wall_time", sa.Float),
        sa.Column("extra", sa.Text, nullable=False),
        sa.Column("committed_at", TZ, nullable=False),
        sa.UniqueConstraint("run_id", "idx", name="uq_generation_run_idx"),
    )
    op.create_table(
        "members",
        sa.Column(
            "generation_id",
            sa.Integer,
            sa.ForeignKey("generations.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("idx", sa.Integer, primary_key=True),
        sa.Column("key", sa.BigInteger, nullable=False),
        sa.Column("sign", sa.Integer, nullable=False),
        sa.Column("reward", sa.Float),
        sa.Column("coefficient", sa.Float, nullable=False),
        sa.Column("components", sa.Text, nullable=False),
        sa.Column("samples", sa.LargeBinary),
    )
    op.create_table(
        "anchors",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column(
            "run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger, nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.UniqueConstraint("run_id", "generation", name="uq_anchor_run_generation"),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="SET NULL")),
        sa.Column("at", TZ, nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
    )
    op.create_table(
        "leases",
        sa.Column(
            "run_id",
            sa.Integer,
            sa.ForeignKey("runs.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("token", sa.String(64), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("holder", sa.Text, nullable=False),
        sa.Column("since", TZ, nullable=False),
        sa.Column("heartbeat", TZ, nullable=False),
        sa.Column("expires_at", TZ, nullable=False),
    )


def downgrade() -> None:
    for table in ("leases", "events", "anchors", "members", "generations", "runs"):
        op.drop_table(table)
