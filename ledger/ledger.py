"""`Ledger`: the API over one ledger database (runs, generations, lineage, anchors, events).

Reads and writes go through SQLAlchemy Core statements on the typed ORM tables; every
write is one transaction (`_write`), so a generation, its members and its blobs land
together or not at all. Generation indices are global along a lineage: a fork of
`parent@g` starts at g + 1 and `child@g` is `parent@g`.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from ledger import codec, migrate, rows
from ledger.db import make_engine, sqlite_path, to_url
from ledger.errors import LeaseHeld, RunNotFound, SeedLedgerError
from ledger.lease import WriterLease, describe, stale_reason
from ledger.records import (
    AnchorInfo,
    EventInfo,
    GenerationRecord,
    ReplayStep,
    RunInfo,
)
from ledger.schema import COEFFICIENTS_DTYPE as DTYPE
from ledger.schema import Anchor, Event, Generation, Lease, Member, Run

Segment = tuple[str, int, int]


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


class Ledger:
    """One ledger database. Open with `Ledger.open(path_or_url)`; use as a context manager."""

    def __init__(self, engine: Engine, location: str = ""):
        self.engine = engine
        self.location = location or str(engine.url)
        self._ids: dict[str, int] = {}
        self._leases: dict[int, WriterLease] = {}
        # set by open() when it upgraded an old schema: before/after revision and the
        # backup file (show `upgraded.describe()` to the user: it names the backup)
        self.upgraded: migrate.UpgradeResult | None = None

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def open(cls, location: str | os.PathLike[str], upgrade: bool = True, create: bool = True):
        """Open (or create) a ledger; an old schema is backed up then upgraded.

        `upgrade=False` refuses an old schema with the command to run; a schema newer than
        this version knows is refused whatever `upgrade` says, and the file is not touched.
        `create=False` refuses a ledger that does not exist yet. After upgrading an old
        schema, `ledger.upgraded` holds the `UpgradeResult` (with the backup's path).
        Two processes creating or upgrading the same ledger at once take turns.
        """
        loc = os.fspath(location)
        url = to_url(loc)
        path = sqlite_path(url)
        if path is not None and not path.exists():
            if not create:
                raise SeedLedgerError(f"no ledger at {loc}")
            if not path.parent.is_dir():
                raise SeedLedgerError(
                    f"cannot create ledger {loc}: {path.parent} is not a directory"
                )
        state = migrate.inspect_schema(url)
        migrate.refuse_newer(loc, state)
        if state.status == "old" and not upgrade:
            raise SeedLedgerError(
                f"ledger {loc} has schema {state.revision}, this seedledger needs "
                f"{migrate.head()}; run `seedledger db upgrade --ledger {loc}`"
            )
        result = migrate.upgrade(url) if state.status != "current" else None
        led = cls(make_engine(url), loc)
        if result is not None and state.status == "old":
            led.upgraded = result
        return led

    def close(self) -> None:
        for lease in list(self._leases.values()):
            lease.release()
        self.engine.dispose()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self, raw_integrity: bool = False) -> Iterator[Connection]:
        """One write transaction (BEGIN IMMEDIATE on SQLite); DB errors become one line."""
        try:
            with self.engine.connect() as conn:
                conn.execution_options(write=True)
                with conn.begin():
                    yield conn
        except DBAPIError as exc:
            if raw_integrity and isinstance(exc, IntegrityError):
                raise
            raise SeedLedgerError(f"ledger {self.location}: {exc.orig}") from None

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        try:
            with self.engine.connect() as conn:
                yield conn
        except DBAPIError as exc:
            raise SeedLedgerError(f"ledger {self.location}: {exc.orig}") from None

    # -- runs ------------------------------------------------------------------------------

    def _run_row(self, conn: Connection, name: str) -> Any:
        row = conn.execute(select(Run).where(Run.name == name)).first()
        if row is None:
            raise RunNotFound(f"no run named {name!r} in {self.location}")
        return row

    def _run_id(self, name: str) -> int:
        if name not in self._ids:
            with self._read() as conn:
                self._ids[name] = self._run_row(conn, name).id
        return self._ids[name]

    def _info(self, conn: Connection, row: Any) -> RunInfo:
        parent = None
        if row.parent_id is not None:
            parent = conn.execute(select(Run.name).where(Run.id == row.parent_id)).scalar_one()
        return rows.run_info(row, parent)

    def create_run(
        self,
        name: str,
        *,
        base_model: str,
        base_revision: str | None = None,
        base_fingerprint: str | None = None,
        noise_spec: str,
        dtype_policy: str = "fp32-master",
        param_selection: str = "all",
        config: dict[str, Any] | None = None,
        seed: int | None = None,
        run_key: int,
        parent: tuple[str, int] | None = None,
        status: str = "created",
        software: dict[str, Any] | None = None,
        host: str | None = None,
    ) -> RunInfo:
        """Record a new run (a fork when `parent=(run, generation)`)."""
        with self._write() as conn:
            run_id = self._create_run(
                conn,
                name,
                base_model=base_model,
                base_revision=base_revision,
                base_fingerprint=base_fingerprint,
                noise_spec=noise_spec,
                dtype_policy=dtype_policy,
                param_selection=param_selection,
                config=config,
                seed=seed,
                run_key=run_key,
                parent=parent,
                status=status,
                software=software,
                host=host,
            )
            return self._info(conn, conn.execute(select(Run).where(Run.id == run_id)).one())

    def _create_run(
        self,
        conn: Connection,
        name: str,
        *,
        parent: tuple[str, int] | None,
        config: dict[str, Any] | None,
        run_key: int,
        software: dict[str, Any] | None,
        host: str | None,
        event: tuple[str, dict[str, Any]] | None = None,
        **columns: Any,
    ) -> int:
        if not name or "@" in name or len(name) > 200 or name != name.strip():
            raise SeedLedgerError(f"bad run name {name!r} (non-empty, no '@', no edge spaces)")
        seed = columns.get("seed")
        if seed is not None and (
            not isinstance(seed, int) or isinstance(seed, bool) or not codec.I64_MIN <= seed <= codec.I64_MAX
        ):
            raise SeedLedgerError(f"seed {seed!r} is not a signed 64-bit integer")
        software = software if software is not None else {"python": sys.version.split()[0]}
        if conn.execute(select(Run.id).where(Run.name == name)).first():
            raise SeedLedgerError(f"a run named {name!r} already exists")
        parent_id = parent_gen = None
        if parent is not None:
            pname, parent_gen = parent
            prow = self._run_row(conn, pname)
            latest = self._latest(conn, prow)
            if not isinstance(parent_gen, int) or not 0 <= parent_gen <= latest:
                raise SeedLedgerError(
                    f"cannot fork {pname}@{parent_gen}: it has generations 0..{latest}"
                )
            parent_id = prow.id
        run_id = conn.execute(
            insert(Run)
            .values(
                name=name,
                created_at=rows.now(),
                config=codec.dumps(config or {}),
                run_key=codec.key_to_sql(run_key),
                parent_id=parent_id,
                parent_generation=parent_gen,
                software=codec.dumps(software),
                host=host if host is not None else socket.gethostname(),
                **columns,
            )
            .returning(Run.id)
        ).scalar_one()
        if event is None:
            event = ("fork", {"parent": list(parent)}) if parent else ("create", {})
        self._event(conn, run_id, *event)
        return run_id

    def get_run(self, name: str) -> RunInfo:
        with self._read() as conn:
            return self._info(conn, self._run_row(conn, name))

    def has_run(self, name: str) -> bool:
        with self._read() as conn:
            return conn.execute(select(Run.id).where(Run.name == name)).first() is not None

    def list_runs(self) -> list[RunInfo]:
        with self._read() as conn:
            runs = conn.execute(select(Run).order_by(Run.id)).all()
            names = {r.id: r.name for r in runs}
            return [rows.run_info(r, names.get(r.parent_id)) for r in runs]

    def set_status(self, name: str, status: str) -> None:
        with self._write() as conn:
            conn.execute(
                update(Run).where(Run.id == self._run_row(conn, name).id).values(status=status)
            )

    def children(self, name: str) -> list[tuple[str, int]]:
        """Direct forks of a run: (child name, generation forked from)."""
        with self._read() as conn:
            rid = self._run_row(conn, name).id
            q = select(Run.name, Run.parent_generation).where(Run.parent_id == rid).order_by(Run.id)
            return [(n, g) for n, g in conn.execute(q)]

    def delete_run(self, name: str) -> None:
        """Delete a run and its records; refused while forks of it exist."""
        kids = self.children(name)
        with self._write() as conn:
            rid = self._run_row(conn, name).id
            if kids or conn.execute(select(Run.id).where(Run.parent_id == rid)).first():
                listed = ", ".join(k for k, _ in kids) or "forks"
                raise SeedLedgerError(f"run {name!r} has forks ({listed}); delete them first")
            gens = select(Generation.id).where(Generation.run_id == rid)
            conn.execute(delete(Member).where(Member.generation_id.in_(gens)))
            conn.execute(delete(Generation).where(Generation.run_id == rid))
            conn.execute(delete(Anchor).where(Anchor.run_id == rid))
            conn.execute(delete(Lease).where(Lease.run_id == rid))
            conn.execute(update(Event).where(Event.run_id == rid).values(run_id=None))
            conn.execute(delete(Run).where(Run.id == rid))
            self._event(conn, None, "run-deleted", {"run": name})
        self._ids.pop(name, None)

    # -- lineage ---------------------------------------------------------------------------

    def _latest(self, conn: Connection, run_row: Any) -> int:
        own = conn.execute(
            select(func.max(Generation.idx)).where(Generation.run_id == run_row.id)
        ).scalar()
        return own if own is not None else (run_row.parent_generation or 0)

    def latest_generation(self, name: str) -> int:
        """Latest generation of the run (0 for none; the fork point for a fresh fork)."""
        with self._read() as conn:
            return self._latest(conn, self._run_row(conn, name))

    def _segments(self, conn: Connection, name: str, g: int | None) -> list[Segment]:
        row = self._run_row(conn, name)
        latest = self._latest(conn, row)
        g = latest if g is None else g
        if not isinstance(g, int) or not 0 <= g <= latest:
            raise RunNotFound(f"run {name!r} has no generation {g} (it has 0..{latest})")
        out: list[Segment] = []
        seen: set[int] = set()
        while True:
            if row.id in seen:
                raise SeedLedgerError(f"run {name!r} has a cyclic lineage")
            seen.add(row.id)
            start = (row.parent_generation or 0) + 1 if row.parent_id is not None else 1
            if g >= start:
                out.append((row.name, start, g))
            if row.parent_id is None:
                break
            g = min(g, row.parent_generation)
            row = conn.execute(select(Run).where(Run.id == row.parent_id)).one()
        return out[::-1]

    def ancestors(self, name: str, g: int | None = None) -> list[Segment]:
        """(run, first_g, last_g) to replay for `name@g` (default latest), oldest first."""
        with self._read() as conn:
            return self._segments(conn, name, g)

    def replay_history(self, name: str, upto: int | None = None) -> list[ReplayStep]:
        """Keys and exact coefficients of generations 1..upto along the lineage, oldest first."""
        steps: list[ReplayStep] = []
        opt_cache: dict[str, dict[str, Any]] = {}
        with self._read() as conn:
            for run, first, last in self._segments(conn, name, upto):
                rid = self._run_row(conn, run).id
                q = (
                    select(
                        Generation.idx,
                        Generation.keys,
                        Generation.coefficients,
                        Generation.sigma,
                        Generation.optimizer,
                        Generation.population,
                        Generation.coefficients_dtype,
                    )
                    .where(Generation.run_id == rid, Generation.idx.between(first, last))
                    .order_by(Generation.idx)
                )
                expect = first
                for idx, keys, coefs, sigma, opt, pop, dtype in conn.execute(q):
                    if idx != expect:
                        raise SeedLedgerError(f"run {run!r} is missing generation {expect}")
                    if dtype != DTYPE or len(keys) != 8 * pop or len(coefs) != 8 * pop:
                        rows.check_blobs(run, idx, pop, dtype, keys, coefs)  # raises
                    if opt not in opt_cache:
                        opt_cache[opt] = codec.loads(opt)
                    steps.append(
                        ReplayStep(
                            run=run,
                            index=idx,
                            keys=codec.unpack_u64(keys),
                            coefficients=codec.unpack_f64(coefs),
                            sigma=sigma,
                            optimizer=dict(opt_cache[opt]),
                        )
                    )
                    expect += 1
                if expect != last + 1:
                    raise SeedLedgerError(f"run {run!r} is missing generation {expect}")
        return steps

    def fingerprints(self, name: str, upto: int | None = None) -> dict[int, str | None]:
        """Generation -> recorded fingerprint (None where none was stored) for 1..upto along
        the lineage: what a replay of `name@upto` can be checked against."""
        out: dict[int, str | None] = {}
        with self._read() as conn:
            for run, first, last in self._segments(conn, name, upto):
                q = select(Generation.idx, Generation.fingerprint).where(
                    Generation.run_id == self._run_row(conn, run).id,
                    Generation.idx.between(first, last),
                )
                out.update((g, fp) for g, fp in conn.execute(q))
        return out

    def records(self, name: str, upto: int | None = None) -> list[GenerationRecord]:
        """Every generation record along the lineage up to `upto`, oldest first, in few
        queries (members without per-sample blobs: use `generation()` for those)."""
        out: list[GenerationRecord] = []
        with self._read() as conn:
            for run, first, last in self._segments(conn, name, upto):
                rid = self._run_row(conn, run).id
                in_range = (Generation.run_id == rid, Generation.idx.between(first, last))
                gens = conn.execute(select(Generation).where(*in_range).order_by(Generation.idx))
                mq = (
                    select(Member.generation_id, Member.idx, Member.sign, Member.components)
                    .join(Generation, Generation.id == Member.generation_id)
                    .where(*in_range)
                    .order_by(Member.generation_id, Member.idx)
                )
                by_gen: dict[int, list[Any]] = {}
                for m in conn.execute(mq):
                    by_gen.setdefault(m.generation_id, []).append(m)
                recs = [rows.generation_record(run, g, by_gen.get(g.id, [])) for g in gens]
                if [r.index for r in recs] != list(range(first, last + 1)):
                    raise SeedLedgerError(f"run {run!r} is missing generations in {first}..{last}")
                out += recs
        return out

    # -- generations -----------------------------------------------------------------------

    def _check_lease(self, conn: Connection, run: str, run_id: int) -> None:
        row = conn.execute(select(Lease).where(Lease.run_id == run_id)).first()
        mine = self._leases.get(run_id)
        if mine is not None:
            mine.refresh(conn)  # raises LeaseHeld if it was taken over
        elif row is not None and stale_reason(row, socket.gethostname(), rows.now()) is None:
            raise LeaseHeld(describe(run, row))

    def commit_generation(self, name: str, record: GenerationRecord) -> None:
        """Commit one generation in ONE transaction; it must be latest + 1 (no overwrite)."""
        grow = rows.generation_row(0, record)
        with self._write() as conn:
            run = self._run_row(conn, name)
            self._check_lease(conn, name, run.id)
            self._insert_generation(conn, name, run, record, grow)

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
        try:
            gid = conn.execute(insert(Generation).returning(Generation.id), grow).scalar_one()
        except IntegrityError:
            raise SeedLedgerError(
                f"generation {name}@{record.index} is already committed"
            ) from None
        if record.members:
            _insert_many(conn, Member, rows.member_rows(gid, record))

    def import_run(
        self,
        name: str,
        records: list[GenerationRecord],
        *,
        base_model: str,
        base_revision: str | None = None,
        base_fingerprint: str | None = None,
        noise_spec: str,
        dtype_policy: str = "fp32-master",
        param_selection: str = "all",
        config: dict[str, Any] | None = None,
        seed: int | None = None,
        run_key: int,
        software: dict[str, Any] | None = None,
        event: dict[str, Any] | None = None,
    ) -> RunInfo:
        """Create a run and commit its generations 1..n in ONE transaction (seed-file import)."""
        grows = [rows.generation_row(0, r) for r in records]
        with self._write() as conn:
            rid = self._create_run(
                conn,
                name,
                parent=None,
                host=None,
                status="imported",
                event=("import", event or {}),
                base_model=base_model,
                base_revision=base_revision,
                base_fingerprint=base_fingerprint,
                noise_spec=noise_spec,
                dtype_policy=dtype_policy,
                param_selection=param_selection,
                config=config,
                seed=seed,
                run_key=run_key,
                software=software,
            )
            row = conn.execute(select(Run).where(Run.id == rid)).one()
            for rec, grow in zip(records, grows, strict=True):
                self._insert_generation(conn, name, row, rec, grow)
            return self._info(conn, row)

    def generation(self, name: str, g: int) -> GenerationRecord:
        """The record of `name@g`, which may live in an ancestor run."""
        if g < 1:
            raise RunNotFound(f"generation {g} has no record (generation 0 is the base model)")
        with self._read() as conn:
            holder = next(r for r, a, b in self._segments(conn, name, g) if a <= g <= b)
            rid = self._run_row(conn, holder).id
            grow = conn.execute(
                select(Generation).where(Generation.run_id == rid, Generation.idx == g)
            ).first()
            if grow is None:
                raise RunNotFound(f"run {holder!r} is missing generation {g}")
            members = conn.execute(
                select(Member).where(Member.generation_id == grow.id).order_by(Member.idx)
            ).all()
            return rows.generation_record(holder, grow, members)

    # -- anchors, events, lease ------------------------------------------------------------

    def add_anchor(
        self, name: str, g: int, path: str, sha256: str, fingerprint: str, size: int
    ) -> None:
        """Record a full-weight cache of `name@g` (idempotent for the same sha256)."""
        with self._write() as conn:
            run = self._run_row(conn, name)
            if not 0 <= g <= self._latest(conn, run):
                raise SeedLedgerError(f"cannot anchor {name}@{g}: no such generation")
            old = conn.execute(
                select(Anchor.sha256).where(Anchor.run_id == run.id, Anchor.generation == g)
            ).first()
            if old is not None:
                if old.sha256 == sha256:
                    return
                raise SeedLedgerError(f"{name}@{g} already has an anchor with another sha256")
            conn.execute(
                insert(Anchor).values(
                    run_id=run.id,
                    generation=g,
                    path=str(path),
                    sha256=sha256,
                    fingerprint=fingerprint,
                    size=size,
                    created_at=rows.now(),
                )
            )

    def anchors(self, name: str, lineage: bool = False) -> list[AnchorInfo]:
        """The run's anchors by generation; `lineage=True` adds ancestors' usable ones."""
        with self._read() as conn:
            wanted = [(name, 0, self._latest(conn, self._run_row(conn, name)))]
            if lineage:  # ancestor@x is this run's model for every x <= its segment's end
                wanted += [(r, 0, b) for r, _a, b in self._segments(conn, name, None) if r != name]
            out: list[AnchorInfo] = []
            for run, a, b in wanted:
                rid = self._run_row(conn, run).id
                q = (
                    select(Anchor)
                    .where(Anchor.run_id == rid, Anchor.generation.between(a, b))
                    .order_by(Anchor.generation)
                )
                out += [rows.anchor_info(run, x) for x in conn.execute(q)]
            return sorted(out, key=lambda x: x.generation)

    def _event(self, conn: Connection, run_id: int | None, kind: str, payload: dict) -> None:
        conn.execute(
            insert(Event).values(
                run_id=run_id, at=rows.now(), kind=kind, payload=codec.dumps(payload)
            )
        )

    def log_event(self, name: str | None, kind: str, payload: dict[str, Any]) -> None:
        """Append to the audit trail (resume, verify results, errors...)."""
        with self._write() as conn:
            rid = self._run_row(conn, name).id if name is not None else None
            self._event(conn, rid, kind, payload)

    def events(self, name: str | None = None, kind: str | None = None) -> list[EventInfo]:
        with self._read() as conn:
            q = select(Event, Run.name).join(Run, Run.id == Event.run_id, isouter=True)
            if name is not None:
                q = q.where(Event.run_id == self._run_row(conn, name).id)
            if kind is not None:
                q = q.where(Event.kind == kind)
            return [
                EventInfo(e.id, e.name, rows.utc(e.at), e.kind, codec.loads(e.payload))
                for e in conn.execute(q.order_by(Event.id))
            ]

    def lease(self, name: str, holder: str | None = None, ttl: float = 60.0) -> WriterLease:
        """`with led.lease(run):` the run's writer lease (LeaseHeld names a live holder)."""
        return WriterLease(self, name, holder, ttl)
