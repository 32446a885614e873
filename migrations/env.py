"""Alembic environment for seedledger ledgers.

Called by `ledger.migrate` (and by the `alembic` command with `-x url=...` or a
`sqlalchemy.url` in an ini file). `ledger.migrate` passes an open connection in
`config.attributes["connection"]` so the SQLite pragmas of `ledger.db` apply.
The whole upgrade runs in one transaction (SQLite and PostgreSQL both have
transactional DDL), so a failed upgrade leaves the old schema intact.
"""

from __future__ import annotations

from alembic import context

from ledger.db import make_engine, to_url
from ledger.schema import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    x = context.get_x_argument(as_dictionary=True)
    return to_url(x.get("url") or config.get_main_option("sqlalchemy.url"))


def run_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        transactional_ddl=True,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
