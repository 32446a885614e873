"""Where a study lives: Optuna's storage in the ledger's database, and its tuner's lease.

Storage. Optuna's RDB storage on the ledger's URL creates its tables (`studies`, `trials`,
…) beside the ledger's. Optuna keeps its schema revision in `alembic_version`, where the
ledger keeps its own, so it runs with `skip_compatibility_check` and `open_study` checks
Optuna's schema itself (the study records the head revision of the Optuna that made it;
another is refused).

One tuner per study (issue 31 item 7), a lease as a run's writer has (`ledger.lease`). Two
`tune` processes on one study would ask and tell the same trials (one tells FAIL a trial
the other trains), so the tuner holds the study's lease from before it touches a trial
until it ends, and a second is refused in one line naming the holder. The lease is a row
of the study's own table (Optuna's `study_system_attributes`, key `seedledger:tuner`,
unique per study; no ledger migration): taken by an insert, taken over by a
compare-and-swap on its value when its holder is provably dead (same host, pid gone) or its
heartbeat expired (`ledger.lease.stale_reason`), renewed from a thread, deleted on exit. A
tuner killed with SIGKILL leaves its row; the next one takes it over.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from seedledger.ledger import Ledger
from seedledger.ledger.db import to_url
from seedledger.ledger.errors import LeaseHeld, SeedLedgerError
from seedledger.ledger.extras import require
from seedledger.ledger.lease import stale_reason
from seedledger.ledger.rows import now, utc

FEATURE = "seedledger tune"
KEY = "seedledger:tuner"
TTL = 300.0  # seconds; renewed every TTL / 5 (as a run's writer lease)

_READ = text("SELECT value_json FROM study_system_attributes WHERE study_id = :sid AND key = :key")
_INSERT = text("INSERT INTO study_system_attributes (study_id, key, value_json) VALUES (:sid, :key, :value)")
_SWAP = text("UPDATE study_system_attributes SET value_json = :value "
             "WHERE study_id = :sid AND key = :key AND value_json = :old")
_DELETE = text("DELETE FROM study_system_attributes WHERE study_id = :sid AND key = :key AND value_json = :old")


def optuna_schema_head() -> str:
    """Head revision of the installed Optuna's own storage migrations."""
    rdb = require("optuna.storages._rdb", FEATURE)
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(rdb.__file__).parent / "alembic"))
    return ScriptDirectory.from_config(cfg).get_current_head()


def open_study(ledger: Ledger, name: str, sampler: Any, pruner: Any):
    """The study `name` in the ledger's database (created on first use)."""
    optuna = require("optuna", FEATURE)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = to_url(ledger.location)
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs, skip_compatibility_check=True)
    study = optuna.create_study(
        study_name=name, storage=storage, direction="maximize", load_if_exists=True,
        pruner=_pruner(pruner),
    )
    head = optuna_schema_head()
    made = storage.get_study_system_attrs(study._study_id).get("seedledger:optuna_schema")
    if made is None:
        storage.set_study_system_attr(study._study_id, "seedledger:optuna_schema", head)
    elif made != head:
        raise SeedLedgerError(
            f"study {name!r} was made with Optuna schema {made}; the installed Optuna's is {head}"
        )
    return study


def _pruner(spec: Any):
    optuna = require("optuna", FEATURE)

    if spec.name == "none":
        return optuna.pruners.NopPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=spec.startup_trials, n_warmup_steps=spec.warmup)


def _holder(value: str) -> SimpleNamespace | None:
    """The stored holder, or None when the row is not one (then it may be replaced)."""
    try:
        data = json.loads(value)
        return SimpleNamespace(host=str(data["host"]), pid=int(data["pid"]), holder=str(data["holder"]),
                               since=datetime.fromisoformat(data["since"]),
                               expires_at=datetime.fromisoformat(data["expires_at"]))
    except (ValueError, TypeError, KeyError):
        return None


class StudyLease:
    """`with StudyLease(ledger, study_id, name):` holds the study; `heartbeat()` renews it."""

    def __init__(self, ledger: Ledger, study_id: int, study: str, ttl: float = TTL):
        self.ledger, self.sid, self.study, self.ttl = ledger, study_id, study, ttl
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.holder = f"seedledger tune@{self.host}:{self.pid}"
        self.token = uuid.uuid4().hex
        self.since = now()
        self.value: str | None = None  # what the row holds while this lease has it

    def _value(self, at: datetime) -> str:
        return json.dumps({"token": self.token, "host": self.host, "pid": self.pid, "holder": self.holder,
                           "since": self.since.isoformat(), "heartbeat": at.isoformat(),
                           "expires_at": (at + timedelta(seconds=self.ttl)).isoformat()})

    def acquire(self) -> StudyLease:
        key = {"sid": self.sid, "key": KEY}
        for _ in range(3):
            at, value = now(), None
            try:
                with self.ledger.transaction(raw_integrity=True) as conn:
                    old = conn.execute(_READ, key).scalar()
                    value = self._value(at)
                    if old is None:
                        conn.execute(_INSERT, {**key, "value": value})
                    else:
                        row = _holder(old)
                        if row is not None and self._live(row, at):
                            raise LeaseHeld(self._describe(row, at))
                        if conn.execute(_SWAP, {**key, "value": value, "old": old}).rowcount != 1:
                            continue  # someone else changed it first; look again
            except IntegrityError:
                continue  # a racer inserted first; the next look names it
            self.value = value
            return self
        raise SeedLedgerError(f"could not take the lease of study {self.study!r} (contention)")

    def _live(self, row: SimpleNamespace, at: datetime) -> bool:
        """Held by a live tuner: not stale, and not expiring later than any heartbeat sets it
        (a row from a copied ledger may claim the year 9999; twice the ttl allows for clock skew)."""
        return stale_reason(row, self.host, at) is None and utc(row.expires_at) <= at + timedelta(seconds=2 * self.ttl)

    def _describe(self, row: SimpleNamespace, at: datetime) -> str:
        return (f"study {self.study!r} is being tuned by {row.holder} (host {row.host}, pid {row.pid}) since "
                f"{utc(row.since).strftime('%Y-%m-%d %H:%M:%S UTC')}; one tuner per study: rerun when it "
                f"ends (a dead tuner's lease is taken over, at once on this host, else after "
                f"{utc(row.expires_at).strftime('%H:%M:%S UTC')})")

    def heartbeat(self) -> None:
        """Extend the expiry; LeaseHeld if another tuner took the study over meanwhile."""
        value = self._value(now())
        with self.ledger.transaction() as conn:
            if conn.execute(_SWAP, {"sid": self.sid, "key": KEY, "value": value, "old": self.value}).rowcount != 1:
                raise LeaseHeld(f"the lease of study {self.study!r} was taken over by another tuner")
        self.value = value

    def release(self) -> None:
        if self.value is None:
            return
        old, self.value = self.value, None
        with self.ledger.transaction() as conn:
            conn.execute(_DELETE, {"sid": self.sid, "key": KEY, "old": old})

    def __enter__(self) -> StudyLease:
        return self if self.value is not None else self.acquire()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            self.release()
        except SeedLedgerError:
            if exc_type is None:
                raise  # an error on its way out is not masked; the row is taken over later


@contextmanager
def held(ledger: Ledger, study_id: int, study: str) -> Iterator[StudyLease]:
    """The study's lease, renewed from a thread (trials outlast its ttl) until the block ends."""
    from seedledger.engine.runtime.session import _keepalive

    with StudyLease(ledger, study_id, study) as lease, _keepalive(lease, TTL / 5):
        yield lease
