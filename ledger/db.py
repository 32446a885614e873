"""Engines: ledger path/URL resolution and the SQLite settings that make commits durable.

SQLite-specific statements live only in the hooks below (installed for the sqlite
dialect alone), so the ledger's own SQL runs unchanged on PostgreSQL.

- WAL journal: readers (`seedledger log` while training) never block the writer.
- synchronous=FULL: with WAL, NORMAL survives a process crash but may lose the last
  commits on power loss; a committed generation must survive both, so FULL (one fsync
  of the WAL per commit, well under a millisecond on SSDs).
- foreign_keys=ON (off by default in SQLite), busy_timeout so concurrent writers wait
  instead of failing at once. Switching a new file to WAL ignores the busy timeout, so
  that one pragma is retried while the file is locked (two processes creating a ledger).
- Write transactions start with BEGIN IMMEDIATE (execution option `write=True`): a
  deferred transaction that reads then writes can fail with SQLITE_BUSY at the upgrade,
  which busy_timeout cannot help.
- Schema migrations run on a connection made with `foreign_keys=False`: Alembic's batch
  mode rebuilds a SQLite table by copy, DROP and rename, and with foreign keys on, the
  DROP of `generations` would cascade-delete every member. The pragma is a no-op inside a
  transaction, so it is set when the connection is made; `foreign_key_violations` is run
  before the migration commits instead (Alembic's documented SQLite batch procedure).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from urllib.parse import quote, unquote

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.extras import missing

BUSY_TIMEOUT_MS = 30_000


_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)[^\s@]*@")


def redact(text: str) -> str:
    """`text` with the password of every `scheme://user:password@` in it replaced by ***."""
    return _PASSWORD.sub(r"\1***@", text)


def display_location(location: str | os.PathLike[str]) -> str:
    """A ledger location as it may be shown or logged: a URL's password is masked."""
    return redact(os.fspath(location))


def to_url(location: str | os.PathLike[str]) -> str:
    """A SQLAlchemy URL from a URL or a plain file path (`x.db` -> `sqlite:///x.db`)."""
    text = os.fspath(location)
    if "://" in text:
        try:
            make_url(text)
        except ArgumentError:
            raise SeedLedgerError(f"bad ledger URL {display_location(text)!r}") from None
        return text
    try:
        return f"sqlite:///{Path(text).expanduser().resolve()}"
    except RuntimeError as exc:  # `~nouser/x.db`: no such user's home
        raise SeedLedgerError(f"cannot use ledger path {text!r}: {exc}") from None


def sqlite_path(url: str) -> Path | None:
    """The file behind a SQLite URL (a `file:` URI one too); None for other databases and
    in-memory SQLite."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    if u.query.get("uri") == "true" and u.database.startswith("file:"):
        return Path(unquote(u.database.removeprefix("file:").partition("?")[0]))
    return Path(u.database)


def read_only_reason(url: str) -> str | None:
    """Why a SQLite ledger must be opened read-only, or None: the URL asks for it
    (`?mode=ro`), or the file or its directory cannot be written (a read-only mount, a
    copy without write permission: SQLite's WAL needs to write `-shm` beside the file)."""
    path = sqlite_path(url)
    if path is None:
        return None
    if make_url(url).query.get("mode") == "ro":
        return "?mode=ro"
    if path.exists() and not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)):
        return "its file or directory is not writable"
    return None


LOW_DISK_BYTES = 1 << 20  # SQLite needs room for its WAL and shm files even to read


def driver_error(url: str, orig: BaseException) -> str:
    """The driver's message, with the real cause when SQLite's "disk I/O error" or "database
    or disk is full" comes from a nearly full disk (SQLite cannot even open its WAL index)."""
    why = str(orig)
    path = sqlite_path(url)
    if path is None or not ("disk I/O error" in why or "disk is full" in why):
        return why
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        return why
    if free >= LOW_DISK_BYTES:
        return why
    return f"no space left on the disk holding it ({free:,} bytes free; SQLite says {why!r})"


def read_only_url(path: Path) -> str:
    """A URL that reads the SQLite file at `path` without writing anything beside it:
    `mode=ro`, and `immutable=1` when no `-shm` exists to share (SQLite could not create
    one on a read-only mount). A `-wal` holding data that SQLite could only read through a
    new `-shm` is refused: immutable mode would silently skip those commits."""
    shm, wal = Path(f"{path}-shm"), Path(f"{path}-wal")
    immutable = not shm.exists()
    if immutable and wal.exists() and wal.stat().st_size > 0:
        raise SeedLedgerError(
            f"ledger {path} is read-only and has commits in {wal.name} that SQLite cannot read "
            "without writing beside it; open it where it is writable, or copy the three files"
        )
    query = "mode=ro" + ("&immutable=1" if immutable else "")
    return f"sqlite:///file:{quote(str(path.resolve()))}?{query}&uri=true"


def make_engine(url: str, *, tuned: bool = True, foreign_keys: bool = True) -> Engine:
    """An engine for `url`; `tuned=False` skips the SQLite pragmas (read-only probing).

    `foreign_keys=False` is for schema migrations only (see the module docstring).
    """
    try:
        engine = create_engine(url)
    except ImportError as exc:  # the dialect's driver is not installed
        raise SeedLedgerError(_no_driver(url, exc)) from None
    except ArgumentError as exc:  # unknown dialect
        raise SeedLedgerError(f"cannot open ledger {display_location(url)!r}: {redact(str(exc))}") from None
    if engine.dialect.name == "sqlite":
        _install_sqlite_hooks(engine, tuned, foreign_keys)
    return engine


def _no_driver(url: str, exc: ImportError) -> str:
    """The line for a URL whose driver is missing: PostgreSQL's names the extra, which
    installs psycopg (3), the driver of `postgresql+psycopg://` (and of plain `postgresql://`
    in SQLAlchemy 2.1)."""
    where = f"ledger {display_location(url)!r}"
    u = make_url(url)
    if u.get_backend_name() != "postgresql":
        return f"cannot open {where}: {redact(str(exc))}"
    if u.get_driver_name() == "psycopg":
        return missing("psycopg", where)
    return (f"cannot open {where}: its driver {u.get_driver_name()} is not installed; "
            f"{missing('psycopg', 'a postgresql+psycopg:// URL')}")


def foreign_key_violations(conn: Connection) -> list[tuple[str, int]]:
    """SQLite: (table, rowid) of rows whose foreign key points nowhere; [] elsewhere
    (other databases check foreign keys on every statement, migrations included)."""
    if conn.dialect.name != "sqlite":
        return []
    return [(r[0], r[1]) for r in conn.exec_driver_sql("PRAGMA foreign_key_check")]


MIGRATION_LOCK = 0x5EED_1ED6E5  # PostgreSQL advisory lock key held by schema migrations


def lock_for_migration(conn: Connection) -> None:
    """Inside a migration's transaction: make concurrent migrations take turns. SQLite's
    BEGIN IMMEDIATE already does; PostgreSQL takes a transaction-scoped advisory lock, so
    a second creator waits, then finds the schema at head and has nothing to do."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})")


def _retry_locked(fn) -> None:
    """Run `fn`, retrying while SQLite says "database is locked", up to the busy timeout.

    Switching a fresh database to WAL takes an exclusive lock without consulting the busy
    handler, so two processes opening a new ledger at once would fail at once otherwise.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    delay = 0.001
    while True:
        try:
            fn()
            return
        except Exception as exc:  # the driver's OperationalError; only "locked" is retried
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(delay)
        delay = min(2 * delay, 0.05)


def _install_sqlite_hooks(engine: Engine, tuned: bool, foreign_keys: bool) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (see `_begin`)
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cur.execute(f"PRAGMA foreign_keys = {'ON' if foreign_keys else 'OFF'}")
        if tuned:
            _retry_locked(lambda: cur.execute("PRAGMA journal_mode = WAL"))
            cur.execute("PRAGMA synchronous = FULL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn) -> None:
        write = conn.get_execution_options().get("write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
