"""Tamper-evident history: every generation row carries a digest over its own content, its
member rows and its predecessor's digest (a hash chain, as git's objects are).

The chain of a run starts at its genesis: a digest over the run's own settings (the ones
replay depends on and its provenance) and, for a fork, the digest of the parent's
generation it was forked at. So a row edited by hand no longer matches its digest, and a
digest rewritten to match breaks the next generation's link. `Ledger.check_chain` walks a
lineage without replaying weights (`seedledger verify --quick`); replay runs it first.

The encoding is canonical and computed here in Python, never in SQL, so SQLite and
PostgreSQL give the same digests: each field is its name, a type tag and its value (UTF-8
text, decimal integers, IEEE float64 bits, raw bytes, UTC times to the microsecond),
length-prefixed. Values are taken as they read back from either database: NaN is NULL
and -0.0 is 0.0 (SQLite stores both so), times are UTC. The version string is part of the
digest: a different encoding would be a new version, never a change to this one.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from seedledger.ledger.rows import utc

VERSION = b"seedledger-chain-v1"

RUN_FIELDS = (
    "name", "created_at", "base_model", "base_revision", "base_fingerprint", "noise_spec",
    "dtype_policy", "param_selection", "config", "seed", "run_key", "parent_generation",
    "software", "host",
)  # not id, parent_id (the parent's digest stands for it) or status (it changes)
GENERATION_FIELDS = (
    "idx", "lr", "sigma", "population", "optimizer", "schedule_step", "batch_indices", "keys",
    "coefficients", "coefficients_dtype", "rewards", "reward_mean", "reward_std", "reward_min",
    "reward_max", "fingerprint", "timings", "wall_time", "extra", "committed_at",
)  # not id, run_id (the chain places the row) or digest itself
# added later (migrations 0005, 0007, 0008): hashed only where set, so the digests of older rows hold
OPTIONAL_GENERATION_FIELDS = ("noise_spec", "param_selection", "inputs_digest", "row_scores")
MEMBER_FIELDS = ("idx", "key", "sign", "reward", "coefficient", "components", "samples")

Getter = Callable[[Any, str], Any]


def _value(v: Any) -> bytes:
    if v is None:
        return b"N"
    if isinstance(v, bool):
        raise TypeError("booleans are not ledger values")
    if isinstance(v, int):
        return b"I" + str(v).encode()
    if isinstance(v, float):
        if math.isnan(v):
            return b"N"  # SQLite stores NaN as NULL
        return b"F" + struct.pack("<d", v + 0.0)  # -0.0 + 0.0 == 0.0, as SQLite returns it
    if isinstance(v, str):
        return b"S" + v.encode()
    if isinstance(v, bytes | bytearray | memoryview):
        return b"B" + bytes(v)
    if isinstance(v, datetime):
        return b"T" + utc(v).strftime("%Y-%m-%dT%H:%M:%S.%f").encode()
    raise TypeError(f"cannot encode {type(v).__name__} in the chain")


def _fields(h: Any, obj: Any, names: tuple[str, ...], get: Getter) -> None:
    for name in names:
        data = name.encode() + b"=" + _value(get(obj, name))
        h.update(struct.pack("<Q", len(data)) + data)


def _get(obj: Any, name: str) -> Any:
    return obj[name] if isinstance(obj, Mapping) else getattr(obj, name)


def _optional(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def genesis(run: Any, parent_head: str | None) -> str:
    """The digest a run's chain starts from: its settings and, for a fork, the digest at the
    parent's generation it was forked from (`parent_head`; None for a root run)."""
    h = hashlib.sha256(VERSION + b"\0run\0")
    _fields(h, run, RUN_FIELDS, _get)
    h.update(b"parent=" + (parent_head or "").encode())
    return h.hexdigest()


def generation_digest(prev: str, generation: Any, members: list[Any]) -> str:
    """The digest of one generation row (a mapping or a row object) with its member rows,
    in member order, chained to `prev`."""
    h = hashlib.sha256(VERSION + b"\0generation\0" + prev.encode() + b"\0")
    _fields(h, generation, GENERATION_FIELDS, _get)
    _fields(h, generation, tuple(n for n in OPTIONAL_GENERATION_FIELDS if _optional(generation, n) is not None), _get)
    h.update(struct.pack("<Q", len(members)))
    for m in members:
        _fields(h, m, MEMBER_FIELDS, _get)
    return h.hexdigest()
