"""Copy a ledger's rows verbatim into another database (SQLite or PostgreSQL): how tests
build a ledger at an old schema revision, or check that one database's digests verify
when read back from the other."""

from __future__ import annotations

import sqlalchemy as sa

from seedledger.ledger.db import make_engine, to_url
from seedledger.ledger.rows import utc

TABLES = ("runs", "generations", "members", "anchors", "events", "leases")


def _plain(value):
    return utc(value) if hasattr(value, "tzinfo") and hasattr(value, "microsecond") else value


def copy_rows(source: str, dest: str) -> None:
    """Insert every row of `source` into `dest` (whose schema exists: the columns both have,
    times as UTC), then move PostgreSQL's id sequences past the copied ids."""
    src, dst = make_engine(to_url(source)), make_engine(to_url(dest))
    try:
        with src.connect() as s, dst.begin() as d:
            for name in TABLES:
                st = sa.Table(name, sa.MetaData(), autoload_with=s)
                dt = sa.Table(name, sa.MetaData(), autoload_with=d)
                cols = [c.name for c in dt.columns if c.name in st.c]
                order = st.c[dt.primary_key.columns.keys()[0]] if dt.primary_key else None
                query = sa.select(*(st.c[c] for c in cols)).order_by(order)
                rows = [{k: _plain(v) for k, v in r._mapping.items()} for r in s.execute(query)]
                if rows:
                    d.execute(dt.insert(), rows)
                if d.dialect.name == "postgresql" and "id" in dt.c:
                    d.exec_driver_sql(
                        f"SELECT setval(pg_get_serial_sequence('{name}', 'id'), "
                        f"coalesce(max(id), 0) + 1, false) FROM {name}"
                    )
    finally:
        src.dispose()
        dst.dispose()


def rechain(location: str) -> None:
    """Recompute every generation's hash-chain digest from the rows as they now stand: a
    ledger whose rows agree with their digests, e.g. one written by a faulty seedledger
    (tests that need a wrong fingerprint the chain does not flag as a hand edit)."""
    from seedledger.ledger import chain
    from seedledger.ledger.schema import Generation, Member, Run

    engine = make_engine(to_url(location))
    try:
        with engine.begin() as conn:
            runs = {r.id: r for r in conn.execute(sa.select(Run).order_by(Run.id))}
            genesis: dict[int, str] = {}
            digests: dict[tuple[int, int], str] = {}

            def head(row, g: int) -> str:
                while g < (row.parent_generation or 0) + 1 and row.parent_id is not None:
                    row = runs[row.parent_id]
                return genesis[row.id] if g == 0 else digests[(row.id, g)]

            for row in runs.values():  # parents first
                parent = head(runs[row.parent_id], row.parent_generation) if row.parent_id else None
                prev = genesis[row.id] = chain.genesis(row, parent)
                gens = conn.execute(sa.select(Generation).where(Generation.run_id == row.id).order_by(Generation.idx))
                for g in gens.all():
                    ms = conn.execute(sa.select(Member).where(Member.generation_id == g.id).order_by(Member.idx)).all()
                    prev = digests[(row.id, g.idx)] = chain.generation_digest(prev, g, ms)
                    conn.execute(sa.update(Generation).where(Generation.id == g.id).values(digest=prev))
    finally:
        engine.dispose()
