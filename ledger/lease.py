"""The writer lease: one writer per run, so two `train`/`resume` never interleave commits.

The lease row names its holder (host, pid, since) and carries a heartbeat and an expiry.
A lease is taken over, with an event recorded, when its holder is provably dead (same
host, pid gone or a zombie) or its heartbeat expired. Every change is a compare-and-swap
on the row's token inside a write transaction, so two racing processes cannot both win.

A lease sees its ledger only through `LeaseHost` (a write transaction, a run's id, the
leases it holds): this module never imports ledger.ledger, which imports it.
"""

from __future__ import annotations

import os
import socket
import uuid
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import Connection, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from seedledger.ledger import codec
from seedledger.ledger.errors import LeaseHeld, SeedLedgerError
from seedledger.ledger.rows import now, utc
from seedledger.ledger.schema import Event, Lease


class LeaseHost(Protocol):
    """What a lease needs of its ledger (ledger.base.LedgerBase provides it)."""

    held_leases: dict[int, WriterLease]  # by run id: the leases held through this ledger

    def transaction(self, raw_integrity: bool = False) -> AbstractContextManager[Connection]: ...

    def run_id(self, name: str) -> int: ...


def pid_alive(pid: int) -> bool:
    """True unless the process is gone or a zombie (killed, not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def stale_reason(row: Any, host: str, at: datetime) -> str | None:
    """Why an existing lease may be taken over, or None while its holder is alive."""
    if utc(row.expires_at) <= at:
        return "heartbeat expired"
    if row.host == host and not pid_alive(row.pid):
        return f"holder pid {row.pid} is dead"
    return None


TAKE_OVER = "taken over on request (--take-over)"


def describe(run: str, row: Any, at: datetime | None = None) -> str:
    """Who holds the lease, since when, its last heartbeat, and how to take it over if
    that writer is gone (a process on another host is not visible from here)."""
    at = at or now()
    since = utc(row.since).strftime("%Y-%m-%d %H:%M:%S UTC")
    exp = utc(row.expires_at).strftime("%H:%M:%S UTC")
    beat = max((at - utc(row.heartbeat)).total_seconds(), 0.0)
    return (
        f"run {run!r} is being written by {row.holder} (host {row.host}, pid {row.pid}) "
        f"since {since}, last heartbeat {beat:.0f}s ago; its lease expires at {exp} unless "
        f"renewed; if that session is gone, `seedledger resume {run} --take-over`"
    )


def check_writer(conn: Connection, run: str, run_id: int, mine: WriterLease | None) -> None:
    """Before a commit, inside its transaction: renew `mine` (LeaseHeld if it was taken
    over meanwhile), or, holding none, refuse while another live writer holds the run."""
    if mine is not None:
        mine.refresh(conn)
        return
    row = conn.execute(select(Lease).where(Lease.run_id == run_id)).first()
    if row is not None and stale_reason(row, socket.gethostname(), now()) is None:
        raise LeaseHeld(describe(run, row))


class WriterLease:
    """`with ledger.lease(run):` holds the run's lease; call `heartbeat()` at least every ttl."""

    def __init__(self, ledger: LeaseHost, run: str, holder: str | None, ttl: float):
        if ttl <= 0:
            raise SeedLedgerError("lease ttl must be positive")
        self.ledger = ledger
        self.run = run
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.holder = holder or f"seedledger@{self.host}:{self.pid}"
        self.ttl = ttl
        self.token = uuid.uuid4().hex
        self.held = False
        self.takeover: dict[str, Any] | None = None  # the lease-takeover event's payload, if one

    def _values(self, at: datetime) -> dict[str, Any]:
        return {
            "token": self.token,
            "host": self.host,
            "pid": self.pid,
            "holder": self.holder,
            "since": at,
            "heartbeat": at,
            "expires_at": at + timedelta(seconds=self.ttl),
        }

    def acquire(self, force: bool = False) -> WriterLease:
        """Take the lease; LeaseHeld names a live holder. `force` takes it from a holder
        that looks alive (one on another host, whose process cannot be checked from here):
        its next heartbeat or commit then fails, so two writers never interleave."""
        if self.held:
            return self
        run_id = self.ledger.run_id(self.run)
        for _ in range(3):
            try:
                with self.ledger.transaction(raw_integrity=True) as conn:
                    at = now()
                    row = conn.execute(select(Lease).where(Lease.run_id == run_id)).first()
                    if row is None:
                        conn.execute(insert(Lease).values(run_id=run_id, **self._values(at)))
                        kind, payload = "lease-acquired", {}
                    else:
                        reason = stale_reason(row, self.host, at) or (TAKE_OVER if force else None)
                        if reason is None:
                            raise LeaseHeld(describe(self.run, row, at))
                        res = conn.execute(
                            update(Lease)
                            .where(Lease.run_id == run_id, Lease.token == row.token)
                            .values(**self._values(at))
                        )
                        if res.rowcount != 1:
                            continue  # someone else changed it first; look again
                        kind = "lease-takeover"
                        payload = {
                            "reason": reason,
                            "previous": {
                                "holder": row.holder,
                                "host": row.host,
                                "pid": row.pid,
                                "since": utc(row.since).isoformat(),
                                "heartbeat": utc(row.heartbeat).isoformat(),
                            },
                        }
                    payload |= {"holder": self.holder, "host": self.host, "pid": self.pid}
                    conn.execute(
                        insert(Event).values(
                            run_id=run_id, at=at, kind=kind, payload=codec.dumps(payload)
                        )
                    )
                self.held = True
                self.takeover = payload if kind == "lease-takeover" else None
                self.ledger.held_leases[run_id] = self
                return self
            except IntegrityError:
                continue  # a racer inserted first; the next look names it
        raise SeedLedgerError(f"could not take the lease of run {self.run!r} (contention)")

    def heartbeat(self) -> None:
        """Extend the expiry; raises LeaseHeld if the lease was taken over meanwhile."""
        with self.ledger.transaction() as conn:
            self.refresh(conn)

    def refresh(self, conn: Any) -> None:
        at = now()
        res = conn.execute(
            update(Lease)
            .where(Lease.run_id == self.ledger.run_id(self.run), Lease.token == self.token)
            .values(heartbeat=at, expires_at=at + timedelta(seconds=self.ttl))
        )
        if res.rowcount != 1:
            self.held = False
            raise LeaseHeld(f"the lease of run {self.run!r} was taken over by another writer")

    def release(self) -> None:
        if not self.held:
            return
        run_id = self.ledger.run_id(self.run)
        self.ledger.held_leases.pop(run_id, None)
        self.held = False
        with self.ledger.transaction() as conn:
            res = conn.execute(
                delete(Lease).where(Lease.run_id == run_id, Lease.token == self.token)
            )
            if res.rowcount == 1:
                conn.execute(
                    insert(Event).values(
                        run_id=run_id,
                        at=now(),
                        kind="lease-released",
                        payload=codec.dumps({"holder": self.holder}),
                    )
                )

    def describe_takeover(self) -> str:
        """One line for the user about the takeover `acquire` just did."""
        t = self.takeover or {}
        prev = t.get("previous", {})
        return (
            f"took over the lease of run {self.run!r} from {prev.get('holder')} (host "
            f"{prev.get('host')}, pid {prev.get('pid')}, last heartbeat {prev.get('heartbeat')}): "
            f"{t.get('reason')}; that session had not released it"
        )

    def __enter__(self) -> WriterLease:
        return self if self.held else self.acquire()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.release()
            return
        try:  # an error is on its way out: a failing release (full disk) must not mask it
            self.release()
        except SeedLedgerError:
            pass  # the lease stays; the next writer takes it over (dead pid, expiry, --take-over)
