"""The ledger's tables (SQLAlchemy 2 typed ORM). Every change here ships an Alembic
migration in `migrations/versions/`; the migrations, not `create_all`, build ledgers.

Exactness: member keys (uint64), coefficients and rewards (float64) are stored as
little-endian blobs on the generation row (read in one go by replay, bit-exact); the
`members` table repeats them per member (keys as signed int64) for SQL audit. The row
declares the blobs' encoding in `coefficients_dtype` (migration 0003): 'float64-le' for
`coefficients` and `rewards` (and 'uint64-le' `keys` with it); a CHECK admits only
encodings this version reads, and the reader refuses any other.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    status: Mapped[str] = mapped_column(String(32))
    base_model: Mapped[str] = mapped_column(Text)
    base_revision: Mapped[str | None] = mapped_column(Text)
    base_fingerprint: Mapped[str | None] = mapped_column(String(64))
    noise_spec: Mapped[str] = mapped_column(String(32))
    dtype_policy: Mapped[str] = mapped_column(String(64))
    param_selection: Mapped[str] = mapped_column(Text)
    config: Mapped[str] = mapped_column(Text)  # JSON
    seed: Mapped[int | None] = mapped_column(BigInteger)
    run_key: Mapped[int] = mapped_column(BigInteger)  # uint64 as int64
    parent_id: Mapped[int | None] = mapped_column(
        ForeignKey("runs.id", ondelete="RESTRICT"), index=True
    )
    parent_generation: Mapped[int | None] = mapped_column(Integer)
    software: Mapped[str] = mapped_column(Text)  # JSON
    host: Mapped[str | None] = mapped_column(String(255))


COEFFICIENTS_DTYPE = "float64-le"  # the one encoding of the exact blobs (see module doc)


class Generation(Base):
    __tablename__ = "generations"
    __table_args__ = (
        UniqueConstraint("run_id", "idx", name="uq_generation_run_idx"),
        CheckConstraint(
            f"coefficients_dtype IN ('{COEFFICIENTS_DTYPE}')",
            name="ck_generation_coefficients_dtype",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    idx: Mapped[int] = mapped_column(Integer)
    lr: Mapped[float] = mapped_column(Float)
    sigma: Mapped[float] = mapped_column(Float)
    population: Mapped[int] = mapped_column(Integer)
    optimizer: Mapped[str] = mapped_column(Text)  # JSON
    schedule_step: Mapped[int] = mapped_column(Integer)
    batch_indices: Mapped[str] = mapped_column(Text)  # JSON list
    keys: Mapped[bytes] = mapped_column(LargeBinary)  # uint64 LE, member order
    coefficients: Mapped[bytes] = mapped_column(LargeBinary)  # float64 LE, as applied
    coefficients_dtype: Mapped[str] = mapped_column(
        String(16), server_default=COEFFICIENTS_DTYPE
    )  # encoding of coefficients / rewards (float64-le) and keys (uint64-le)
    rewards: Mapped[bytes] = mapped_column(LargeBinary)  # float64 LE (NaN = unknown)
    reward_mean: Mapped[float | None] = mapped_column(Float)
    reward_std: Mapped[float | None] = mapped_column(Float)
    reward_min: Mapped[float | None] = mapped_column(Float)
    reward_max: Mapped[float | None] = mapped_column(Float)
    fingerprint: Mapped[str | None] = mapped_column(String(64))
    timings: Mapped[str] = mapped_column(Text)  # JSON {phase: seconds}
    wall_time: Mapped[float | None] = mapped_column(Float)  # timings["wall"]: the generation up to its commit
    extra: Mapped[str] = mapped_column(Text)  # JSON
    committed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # sha256 over this row, its members and the previous generation's digest (ledger.chain;
    # migration 0004 filled it for older ledgers)
    digest: Mapped[str | None] = mapped_column(String(64))
    # this generation's perturbation where it is not its run's (migration 0005): an
    # imported lineage is one run, but its forks may have changed kind. NULL: the run's.
    noise_spec: Mapped[str | None] = mapped_column(String(32))
    param_selection: Mapped[str | None] = mapped_column(Text)
    # sha256 of the inputs record (the session's `inputs` event) in force when this row
    # committed, inside the chain's digest (ledger.sessions; migration 0007). NULL: none
    # recorded, or a row committed before.
    inputs_digest: Mapped[str | None] = mapped_column(String(64))
    # each member's score on each batch row (ledger.rowscores, migration 0008), what
    # `attribute` recomputes coefficients from without a row. NULL: not kept (`row_scores:
    # false`, a module run, an import) or a row committed before.
    row_scores: Mapped[bytes | None] = mapped_column(LargeBinary)


class Member(Base):
    __tablename__ = "members"

    generation_id: Mapped[int] = mapped_column(
        ForeignKey("generations.id", ondelete="CASCADE"), primary_key=True
    )
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[int] = mapped_column(BigInteger)  # uint64 as int64
    sign: Mapped[int] = mapped_column(Integer)
    reward: Mapped[float | None] = mapped_column(Float)  # audit copy (exact: generations.rewards)
    coefficient: Mapped[float] = mapped_column(
        Float
    )  # audit copy (exact: generations.coefficients)
    components: Mapped[str] = mapped_column(Text)  # JSON {name: value|null}
    samples: Mapped[bytes | None] = mapped_column(LargeBinary)  # zstd JSON, optional


class Anchor(Base):
    __tablename__ = "anchors"
    __table_args__ = (UniqueConstraint("run_id", "generation", name="uq_anchor_run_generation"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    generation: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    sha256: Mapped[str] = mapped_column(String(64))
    fingerprint: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (
        Index("ix_events_run_id_at", "run_id", "at"),
        Index("ix_events_kind", "kind"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    kind: Mapped[str] = mapped_column(String(64))
    payload: Mapped[str] = mapped_column(Text)  # JSON
    # an event an import brought (migration 0006): the digest of the seed file it came with,
    # and when the sender's ledger recorded it (`at`: when it was imported). NULL: our own.
    origin: Mapped[str | None] = mapped_column(String(64))
    sent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Lease(Base):
    __tablename__ = "leases"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    token: Mapped[str] = mapped_column(String(64))
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    holder: Mapped[str] = mapped_column(Text)
    since: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    heartbeat: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
