"""Copy a ledger's rows verbatim into another database (SQLite or PostgreSQL): how tests
build a ledger at an old schema revision, or check that one database's digests verify
when read back from the other."""

from __future__ import annotations

import sqlalchemy as sa

from ledger.db import make_engine, to_url
from ledger.rows import utc

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
