"""Alembic environment for seedledger ledgers.

Called by `ledger.migrate` (and by the `alembic` command with `-x url=...` or a
`sqlalchemy.url` in an ini file). `ledger.migrate` passes an open connection in
`config.attributes["connection"]` (`ledger.migrate.migration_connection`): SQLite
pragmas of `ledger.db` but with foreign keys OFF, and BEGIN IMMEDIATE. The whole
upgrade runs in one transaction (SQLite and PostgreSQL both have transactional DDL), so
a failed upgrade leaves the old schema intact.

Rules for writing a migration (SQLite, where `render_as_batch` is on):

- A table change that SQLite's ALTER cannot do is a batch operation
  (`op.batch_alter_table`): a copy of the table, then DROP of the old one and a rename.
  Foreign keys are OFF during migrations so that the DROP of, say, `generations` does not
  cascade-delete `members` (Alembic's documented SQLite batch procedure); before the
  transaction commits, `PRAGMA foreign_key_check` runs and any violation refuses the
  upgrade (rolled back, nothing changed).
- The audit views of 0002 (`generation_summary`, `member_audit`, `run_lineage`) name
  `runs`, `generations` and `members`; SQLite refuses to rename a table into place while
  a view names a missing table. A migration that batch-alters one of those tables drops
  the views first and recreates them after (0003 is the example to copy), and carries
  its own copy of the view SQL (migrations are snapshots: never import another one).
"""

from __future__ import annotations

from alembic import context

from seedledger.ledger.db import foreign_key_violations, lock_for_migration, make_engine, to_url
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.schema import Base

config = context.config
target_metadata = Base.metadata


def _ours(name, type_, parent_names) -> bool:
    """Tables the ledger does not own (Optuna's, from `seedledger tune`, live in the same
    database) are invisible to migrations: never compared, altered or dropped."""
    return type_ != "table" or name in target_metadata.tables


def _url() -> str:
    x = context.get_x_argument(as_dictionary=True)
    return to_url(x.get("url") or config.get_main_option("sqlalchemy.url"))


def run_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True, include_name=_ours)
    with context.begin_transaction():
        context.run_migrations()


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        transactional_ddl=True,
        render_as_batch=connection.dialect.name == "sqlite",
        include_name=_ours,
    )
    with context.begin_transaction():
        lock_for_migration(connection)  # concurrent creators/upgraders take turns
        context.run_migrations()
        bad = [(t, r) for t, r in foreign_key_violations(connection) if t in target_metadata.tables]
        if bad:  # raising here rolls the whole upgrade back
            tables = sorted({t for t, _ in bad})
            raise SeedLedgerError(
                f"{len(bad)} rows would break foreign keys ({', '.join(tables)}); "
                "nothing was changed"
            )


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_url(), foreign_keys=False)  # see the module docstring
    try:
        with engine.connect() as conn:
            conn.execution_options(write=True)
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
