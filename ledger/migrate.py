"""Schema versions: Alembic upgrade / current / history, and the check `Ledger.open` runs.

The CLI's `seedledger db upgrade | current | history` call `upgrade`, `current` and
`history`. Before upgrading a SQLite ledger that holds data, a timestamped copy is made
beside it (SQLite's online backup, so WAL content is included). A ledger whose revision
this version does not know (written by a newer seedledger) is refused and left untouched.

Migrations run on `migration_connection`: foreign keys OFF (so Alembic's batch mode can
rebuild a SQLite table without cascading deletes; `migrations/env.py` runs
`PRAGMA foreign_key_check` before committing and refuses on any violation), and a write
transaction from the first statement (BEGIN IMMEDIATE on SQLite), so two processes that
create or upgrade the same ledger at once take turns instead of failing.
"""

from __future__ import annotations

import ast
import importlib.util
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, text
from sqlalchemy.exc import DBAPIError

from seedledger.ledger.db import display_location, driver_error, make_engine, sqlite_path, to_url
from seedledger.ledger.errors import SeedLedgerError

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory


@dataclass
class SchemaState:
    """What a ledger's schema is: `empty` (no tables), `current`, `old`, `newer`."""

    url: str
    revision: str | None
    status: str


@dataclass
class UpgradeResult:
    """What `upgrade` did: revision `before` (None: empty) -> `after`, and the `backup`
    copy of the SQLite file it made first (None when nothing needed one: an empty or
    non-SQLite ledger, or one already at the target). Callers should show the backup's
    path to the user: it is the way back if the new version misbehaves."""

    before: str | None
    after: str
    backup: Path | None

    @property
    def changed(self) -> bool:
        return self.before != self.after

    def describe(self) -> str:
        """One line for the user, e.g. `upgraded schema 0001 -> 0003 (backup: /x.db.bak-..)`."""
        if not self.changed:
            return f"schema already at {self.after}"
        line = f"upgraded schema {self.before or '(empty)'} -> {self.after}"
        return line + (f" (backup: {self.backup})" if self.backup else "")


def _script_location() -> str:
    spec = importlib.util.find_spec("seedledger.migrations")
    if spec is None or not spec.submodule_search_locations:
        raise SeedLedgerError("the `migrations` package is missing from this installation")
    return str(Path(next(iter(spec.submodule_search_locations))))


def alembic_config(url: str | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", _script_location())
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


@cache
def _script() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


@cache
def head() -> str:
    """The newest revision: the one no migration names as its `down_revision`. Read from
    the scripts' source, not through Alembic, whose import (~0.15 s) every command that
    opens a ledger would otherwise pay for this one string; `known_revisions` (Alembic's
    own walk, tests/test_migrations.py) ends with the same one."""
    links = dict(_links(path) for path in sorted((Path(_script_location()) / "versions").glob("*.py")))
    links.pop(None, None)  # not a migration
    heads = sorted(set(links) - {down for downs in links.values() for down in downs})
    assert len(heads) == 1, f"migrations must have one head, found {heads}"
    return heads[0]


def _links(path: Path) -> tuple[str | None, tuple[str, ...]]:
    """(revision, down revisions) that a migration script assigns at module level."""
    found: dict[str, object] = {}
    for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in ("revision", "down_revision"):
            found[target.id] = ast.literal_eval(value)
    down = found.get("down_revision")
    return found.get("revision"), tuple(down) if isinstance(down, tuple | list) else (down,) if down else ()


def known_revisions() -> list[str]:
    """Revision ids, oldest first."""
    return [s.revision for s in reversed(list(_script().walk_revisions()))]


def revisions() -> list[tuple[str, str]]:
    """(revision, first docstring line), oldest first."""
    return [
        (s.revision, (s.doc or "").strip().splitlines()[0] if (s.doc or "").strip() else "")
        for s in reversed(list(_script().walk_revisions()))
    ]


def history() -> list[str]:
    """`<revision>  <first docstring line>`, oldest first."""
    return [f"{rev}  {title}" for rev, title in revisions()]


def current(location: str) -> str | None:
    """The ledger's schema revision (None for an empty database). Writes nothing."""
    return inspect_schema(location).revision


def inspect_schema(location: str) -> SchemaState:
    """Probe without the SQLite pragmas, so the file is not modified (even by WAL setup)."""
    url = to_url(location)
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return SchemaState(url, None, "empty")
    engine = make_engine(url, tuned=False)
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            if "alembic_version" not in tables:
                if tables:
                    raise SeedLedgerError(f"{display_location(location)} is not a seedledger ledger")
                return SchemaState(url, None, "empty")
            revs = [r[0] for r in conn.execute(text("SELECT version_num FROM alembic_version"))]
    except DBAPIError as exc:
        raise SeedLedgerError(
            f"cannot read ledger {display_location(location)}: {driver_error(url, exc.orig)}"
        ) from None
    finally:
        engine.dispose()
    if len(revs) != 1:
        raise SeedLedgerError(f"ledger {display_location(location)} has a broken schema version table: {revs}")
    rev = revs[0]
    if rev == head():
        status = "current"
    elif rev in known_revisions():
        status = "old"
    else:
        status = "newer"
    return SchemaState(url, rev, status)


def refuse_newer(location: str, state: SchemaState) -> None:
    if state.status == "newer":
        raise SeedLedgerError(
            f"ledger {display_location(location)} has schema revision {state.revision}, newer than this "
            f"seedledger knows (up to {head()}); upgrade seedledger to open it"
        )


def backup_sqlite(path: Path, revision: str | None) -> Path:
    """A consistent timestamped copy (`<name>.bak-<rev>-<UTC time>`) beside the ledger."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    dest = path.with_name(f"{path.name}.bak-{revision or 'none'}-{stamp}")
    src = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        dst = sqlite3.connect(dest)
        try:
            src.backup(dst)
        finally:
            dst.close()
    finally:
        src.close()
    return dest


@contextmanager
def migration_connection(url: str) -> Iterator[Connection]:
    """The connection that migrations run on: foreign keys OFF (set when the connection is
    made, before any transaction, since SQLite ignores the pragma inside one) and write
    transactions (BEGIN IMMEDIATE on SQLite). Other connections keep foreign keys ON."""
    engine = make_engine(url, foreign_keys=False)
    try:
        with engine.connect() as conn:
            conn.execution_options(write=True)
            yield conn
    finally:
        engine.dispose()


def upgrade(location: str, revision: str = "head", *, backup: bool = True) -> UpgradeResult:
    """Bring the schema to `revision` (default head) in one transaction.

    A SQLite ledger that already has a schema is first copied to a timestamped backup
    (`UpgradeResult.backup`). Safe against a concurrent upgrade of the same ledger: the
    second waits for the first and finds nothing left to do.
    """
    state = inspect_schema(location)
    refuse_newer(location, state)
    target = head() if revision == "head" else revision
    if state.revision == target:
        return UpgradeResult(state.revision, target, None)
    path = sqlite_path(state.url)
    saved = None
    if backup and path is not None and state.status != "empty":
        saved = backup_sqlite(path, state.revision)
    from alembic import command

    try:
        with migration_connection(state.url) as conn:
            cfg = alembic_config(state.url)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, target)
    except DBAPIError as exc:
        # e.g. PostgreSQL, where two creators can still collide: fine if the other won
        if _revision_or_none(location) == target:
            return UpgradeResult(state.revision, target, saved)
        raise SeedLedgerError(f"schema upgrade of {display_location(location)} failed: {exc.orig}") from None
    except SeedLedgerError as exc:
        raise SeedLedgerError(f"schema upgrade of {display_location(location)} refused: {exc}") from None
    return UpgradeResult(state.revision, target, saved)


def _revision_or_none(location: str) -> str | None:
    try:
        return current(location)
    except SeedLedgerError:
        return None
