"""Two processes opening (creating) the same new ledger at once: both succeed."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import traceback

from ledger import Ledger, migrate


def _open_and_write(path, barrier, queue, name) -> None:
    try:
        barrier.wait(timeout=30)
        with Ledger.open(path) as led:
            led.create_run(name, base_model="tiny", noise_spec="v1", run_key=1)
        queue.put((name, "ok"))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
        queue.put((name, traceback.format_exc(limit=3)))


def test_two_processes_create_the_same_ledger(tmp_path):
    ctx = mp.get_context("fork")  # the children start at once, with modules already loaded
    for trial in range(10):
        path = tmp_path / f"l{trial}.db"
        barrier, queue = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_open_and_write, args=(path, barrier, queue, n)) for n in "ab"]
        for p in procs:
            p.start()
        results = dict(queue.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(timeout=60)
        assert results == {"a": "ok", "b": "ok"}, f"trial {trial}: {results}"
        assert migrate.current(str(path)) == migrate.head()
        con = sqlite3.connect(path)
        assert sorted(r[0] for r in con.execute("SELECT name FROM runs")) == ["a", "b"]
        assert con.execute("SELECT count(*) FROM alembic_version").fetchone() == (1,)
        con.close()
