"""Two processes opening (creating) the same new ledger at once: both succeed (SQLite and
PostgreSQL)."""

from __future__ import annotations

import multiprocessing as mp
import traceback

import pytest
import sqlalchemy as sa

from seedledger.ledger import Ledger, migrate
from seedledger.ledger.db import make_engine, to_url


def _open_and_write(path, barrier, queue, name) -> None:
    try:
        barrier.wait(timeout=30)
        with Ledger.open(path) as led:
            led.create_run(name, base_model="tiny", noise_spec="v1", run_key=1)
        queue.put((name, "ok"))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
        queue.put((name, traceback.format_exc(limit=3)))


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
@pytest.mark.slow
def test_two_processes_create_the_same_ledger(tmp_path, request, db):
    ctx = mp.get_context("fork")  # the children start at once, with modules already loaded
    server = request.getfixturevalue("pg_server") if db == "postgres" else None
    for trial in range(4 if server else 10):  # a PostgreSQL trial costs a new database
        path = server.database() if server else str(tmp_path / f"l{trial}.db")
        barrier, queue = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_open_and_write, args=(path, barrier, queue, n)) for n in "ab"]
        for p in procs:
            p.start()
        results = dict(queue.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(timeout=60)
        assert results == {"a": "ok", "b": "ok"}, f"trial {trial}: {results}"
        assert migrate.current(path) == migrate.head()
        engine = make_engine(to_url(path))
        with engine.connect() as con:
            assert sorted(r[0] for r in con.execute(sa.text("SELECT name FROM runs"))) == ["a", "b"]
            assert con.execute(sa.text("SELECT count(*) FROM alembic_version")).scalar() == 1
        engine.dispose()
