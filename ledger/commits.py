"""Commits: one generation at a time under the writer lease, or a whole imported run in
one transaction (part of `Ledger`). A generation must be latest + 1: nothing is overwritten.
Each row gets its digest in the hash chain (ledger.chain) in the same transaction, over the
digest of the inputs record in force (ledger.sessions)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert
from sqlalchemy.exc import IntegrityError

from seedledger.ledger import chain, rows, sessions
from seedledger.ledger.base import run_spec
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.integrity import IntegrityMixin
from seedledger.ledger.lease import check_writer
from seedledger.ledger.records import GenerationRecord, RunInfo, RunSpec
from seedledger.ledger.schema import Generation, Member

_SQL_CACHE: dict[tuple[str, str, tuple[str, ...]], tuple[str, list[str] | None]] = {}


def _insert_many(conn: Connection, model: Any, params: list[dict[str, Any]]) -> None:
    """executemany with plain values: SQLAlchemy's per-row bind processing costs more than
    SQLite's insert for a 256-member generation. Values are already int/float/str/bytes."""
    names = tuple(params[0])
    ck = (conn.dialect.name, model.__tablename__, names)
    if ck not in _SQL_CACHE:
        compiled = insert(model).compile(dialect=conn.dialect, column_keys=list(names))
        order = list(compiled.positiontup or names) if compiled.positional else None
        _SQL_CACHE[ck] = (str(compiled), order)
    sql, order = _SQL_CACHE[ck]
    if order == list(names):  # the usual case: dicts are already in bind order
        conn.exec_driver_sql(sql, [tuple(p.values()) for p in params])
    elif order is not None:
        conn.exec_driver_sql(sql, [tuple(p[k] for k in order) for p in params])
    else:
        conn.exec_driver_sql(sql, params)


class CommitsMixin(IntegrityMixin):
    def commit_generation(self, name: str, record: GenerationRecord) -> None:
        """Commit one generation in ONE transaction; it must be latest + 1 (no overwrite)."""
        grow = rows.generation_row(0, record)
        with self.transaction() as conn:
            run = self._run_row(conn, name)
            check_writer(conn, name, run.id, self.held_leases.get(run.id))
            self._insert_generation(conn, name, run, record, grow)

    def import_run(
        self,
        name: str,
        records: list[GenerationRecord],
        spec: RunSpec | None = None,
        *,
        event: dict[str, Any] | None = None,
        trail: Sequence[tuple[str, dict[str, Any], datetime | None]] = (),
        origin: str | None = None,
        keep_times: bool = False,
        **fields: Any,
    ) -> RunInfo:
        """Create a run and commit its generations 1..n in ONE transaction (seed-file import),
        given its RunSpec or the RunSpec's fields as keywords; `trail`: (kind, payload,
        sent_at) events the file brought (its sessions' `inputs`, or a history file's
        events), written after the import event as imported ones: marked with `origin` (the
        file's digest), recorded now, the sender's time beside. `keep_times`: each
        generation keeps its record's `committed_at` (a history file's), else it is
        committed now."""
        spec = run_spec(spec, fields)
        grows = [rows.generation_row(0, r, r.committed_at if keep_times else None) for r in records]
        with self.transaction() as conn:
            row = self._create_run(conn, name, spec, None, "imported", ("import", event or {}))
            for kind, payload, sent_at in trail:
                self._event(conn, row.id, kind, payload, origin=origin or "", sent_at=sent_at)
            for rec, grow in zip(records, grows, strict=True):
                self._insert_generation(conn, name, row, rec, grow)
            return self._info(conn, row)

    def _insert_generation(
        self, conn: Connection, name: str, run: Any, record: GenerationRecord, grow: dict
    ) -> None:
        latest = self._latest(conn, run)
        if record.index <= latest:
            raise SeedLedgerError(f"generation {name}@{record.index} is already committed")
        if record.index != latest + 1:
            raise SeedLedgerError(
                f"cannot commit {name}@{record.index}: the next generation is {latest + 1}"
            )
        grow["run_id"] = run.id
        grow["inputs_digest"] = sessions.bound_digest(conn, run, record.index)  # the inputs it was trained on
        members = rows.member_rows(0, record)
        grow["digest"] = chain.generation_digest(self._prev_digest(conn, run, record.index), grow, members)
        try:
            gid = conn.execute(insert(Generation).returning(Generation.id), grow).scalar_one()
        except IntegrityError:
            raise SeedLedgerError(
                f"generation {name}@{record.index} is already committed"
            ) from None
        if members:
            for m in members:
                m["generation_id"] = gid
            _insert_many(conn, Member, members)
