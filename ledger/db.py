"""Engines: ledger path/URL resolution and the SQLite settings that make commits durable.

SQLite-specific statements live only in the hooks below (installed for the sqlite
dialect alone), so the ledger's own SQL runs unchanged on PostgreSQL.

- WAL journal: readers (`seedledger log` while training) never block the writer.
- synchronous=FULL: with WAL, NORMAL survives a process crash but may lose the last
  commits on power loss; a committed generation must survive both, so FULL (one fsync
  of the WAL per commit, well under a millisecond on SSDs).
- foreign_keys=ON (off by default in SQLite), busy_timeout so concurrent writers wait
  instead of failing at once.
- Write transactions start with BEGIN IMMEDIATE (execution option `write=True`): a
  deferred transaction that reads then writes can fail with SQLITE_BUSY at the upgrade,
  which busy_timeout cannot help.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from ledger.errors import SeedLedgerError

BUSY_TIMEOUT_MS = 30_000


def to_url(location: str | os.PathLike[str]) -> str:
    """A SQLAlchemy URL from a URL or a plain file path (`x.db` -> `sqlite:///x.db`)."""
    text = os.fspath(location)
    if "://" in text:
        try:
            make_url(text)
        except ArgumentError as exc:
            raise SeedLedgerError(f"bad ledger URL {text!r}: {exc}") from None
        return text
    return f"sqlite:///{Path(text).expanduser().resolve()}"


def sqlite_path(url: str) -> Path | None:
    """The file behind a SQLite URL; None for other databases and in-memory SQLite."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    return Path(u.database)


def make_engine(url: str, *, tuned: bool = True) -> Engine:
    """An engine for `url`; `tuned=False` skips the SQLite pragmas (read-only probing)."""
    try:
        engine = create_engine(url)
    except (ArgumentError, ImportError) as exc:  # unknown dialect / missing driver
        raise SeedLedgerError(f"cannot open ledger {url!r}: {exc}") from None
    if engine.dialect.name == "sqlite":
        _install_sqlite_hooks(engine, tuned)
    return engine


def _install_sqlite_hooks(engine: Engine, tuned: bool) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (see `_begin`)
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys = ON")
        if tuned:
            cur.execute("PRAGMA journal_mode = WAL")
            cur.execute("PRAGMA synchronous = FULL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn) -> None:
        write = conn.get_execution_options().get("write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
