"""Conversions between records (ledger.records) and table rows (ledger.schema)."""

from __future__ import annotations

import math
import socket
import sys
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any

from seedledger.ledger import codec, rowscores
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.records import AnchorInfo, GenerationRecord, MemberRecord, RunInfo, RunSpec
from seedledger.ledger.schema import COEFFICIENTS_DTYPE, Anchor, Generation, Member, Run


def utc(value: datetime) -> datetime:
    """SQLite returns naive datetimes; everything the ledger stores is UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def now() -> datetime:
    return datetime.now(UTC)


def run_columns(spec: RunSpec) -> dict[str, Any]:
    """Column values of a new run row (the runs table's own columns, from RunSpec's fields)."""
    cols = {f.name: getattr(spec, f.name) for f in fields(RunSpec)}
    return cols | {
        "config": codec.dumps(spec.config or {}),
        "run_key": codec.key_to_sql(spec.run_key),
        "software": codec.dumps(spec.software if spec.software is not None else {"python": sys.version.split()[0]}),
        "host": spec.host if spec.host is not None else socket.gethostname(),
    }


def run_info(run: Run, parent_name: str | None) -> RunInfo:
    spec = {f.name: getattr(run, f.name) for f in fields(RunSpec)}
    spec |= {
        "config": codec.loads(run.config),
        "run_key": codec.key_from_sql(run.run_key),
        "software": codec.loads(run.software),
    }
    return RunInfo(
        id=run.id,
        name=run.name,
        created_at=utc(run.created_at),
        status=run.status,
        parent=(parent_name, run.parent_generation) if parent_name is not None else None,
        **spec,
    )


def _check_record(rec: GenerationRecord) -> None:
    if not isinstance(rec.index, int) or rec.index < 1:
        raise SeedLedgerError(f"generation index must be a positive integer, got {rec.index!r}")
    for pos, m in enumerate(rec.members):
        if m.index != pos:
            raise SeedLedgerError(
                f"generation {rec.index}: members must be in order 0..N-1 (member {pos} has "
                f"index {m.index})"
            )
        if m.sign not in (-1, 0, 1):  # 0: the unperturbed master (a GA's elite)
            raise SeedLedgerError(f"generation {rec.index}: member {pos} sign must be -1, 0 or 1")
    if rec.population != len(rec.members):
        raise SeedLedgerError(
            f"generation {rec.index}: population {rec.population} but {len(rec.members)} members"
        )


def wall_seconds(timings: dict[str, float]) -> float | None:
    """A generation's wall time: `wall` as the loop records it; for older records the sum of
    the phases, leaving out `load_member` (per-member time inside evaluation)."""
    if not timings:
        return None
    if "wall" in timings:
        return timings["wall"]
    return math.fsum(v for k, v in timings.items() if k not in ("load_member", "previous_commit"))


def generation_row(run_id: int, rec: GenerationRecord, committed_at: datetime | None = None) -> dict[str, Any]:
    """Column values of the generation row (exact arrays packed as LE blobs); committed now
    unless `committed_at` says when (an import keeping the sender's times)."""
    _check_record(rec)
    stats = rec.reward_stats()
    wall = wall_seconds(rec.timings)
    ms = rec.members
    return {
        "run_id": run_id,
        "idx": rec.index,
        "lr": rec.lr,
        "sigma": rec.sigma,
        "population": rec.population,
        "optimizer": codec.dumps(rec.optimizer),
        "schedule_step": rec.schedule_step,
        "batch_indices": codec.dumps(list(rec.batch_indices)),
        "keys": codec.pack_u64([m.key for m in ms]),
        "coefficients": codec.pack_f64([m.coefficient for m in ms]),
        "coefficients_dtype": COEFFICIENTS_DTYPE,
        "rewards": codec.pack_f64([m.reward for m in ms]),
        "reward_mean": stats["mean"],
        "reward_std": stats["std"],
        "reward_min": stats["min"],
        "reward_max": stats["max"],
        "fingerprint": rec.fingerprint,
        "timings": codec.dumps(rec.timings),
        "wall_time": wall,
        "extra": codec.dumps(rec.extra),
        "committed_at": utc(committed_at) if committed_at else now(),
        "noise_spec": rec.noise_spec,
        "param_selection": rec.param_selection,
        "row_scores": rowscores.pack(_row_scores(rec)),
    }


def _row_scores(rec: GenerationRecord) -> list[list[float]] | None:
    """The generation's score matrix when every member has one row score per batch row."""
    scores = [m.row_scores for m in rec.members]
    if not scores or any(s is None or len(s) != len(rec.batch_indices) for s in scores):
        return None
    return scores  # type: ignore[return-value]


def member_rows(generation_id: int, rec: GenerationRecord) -> list[dict[str, Any]]:
    return [
        {
            "generation_id": generation_id,
            "idx": m.index,
            "key": codec.key_to_sql(m.key),
            "sign": m.sign,
            "reward": codec.sql_float(m.reward),
            "coefficient": codec.sql_float(m.coefficient),
            "components": codec.dumps(m.components),
            "samples": codec.zjson(m.samples),
        }
        for m in rec.members
    ]


def check_blobs(run: str, idx: int, population: int, dtype: str, *blobs: bytes) -> None:
    """A generation row's exact arrays must be 8 bytes x population each, in an encoding
    this version reads; anything else is a damaged ledger, not data to guess at."""
    if dtype != COEFFICIENTS_DTYPE:
        raise SeedLedgerError(
            f"run {run!r} generation {idx} stores coefficients as {dtype!r}; this seedledger "
            f"reads only {COEFFICIENTS_DTYPE!r} (upgrade seedledger)"
        )
    if any(len(b) != 8 * population for b in blobs):
        raise SeedLedgerError(
            f"ledger is damaged: run {run!r} generation {idx} has arrays of "
            f"{'/'.join(str(len(b) // 8) for b in blobs)} values for population {population}"
        )


def generation_record(run: str, g: Generation, members: list[Member]) -> GenerationRecord:
    """The record of one generation row and its member rows (all `population` of them, in
    order: a missing or extra member row is corruption and raises SeedLedgerError)."""
    check_blobs(run, g.idx, g.population, g.coefficients_dtype, g.keys, g.coefficients, g.rewards)
    if len(members) != g.population or any(m.idx != i for i, m in enumerate(members)):
        raise SeedLedgerError(
            f"ledger is damaged: run {run!r} generation {g.idx} has population {g.population} "
            f"but member rows {sorted(m.idx for m in members)[:8]}"
            f"{'...' if len(members) > 8 else ''}"
        )
    keys = codec.unpack_u64(g.keys)
    coefs = codec.unpack_f64(g.coefficients)
    rewards = codec.unpack_f64(g.rewards)
    batch = codec.loads(g.batch_indices)
    blob = getattr(g, "row_scores", None)
    scores = rowscores.unpack(blob, g.population, len(batch), f"run {run!r} generation {g.idx}") if blob else None
    out = [
        MemberRecord(
            index=i,
            key=k,
            sign=m.sign,
            reward=r,
            coefficient=c,
            components=codec.loads(m.components),
            samples=codec.unzjson(getattr(m, "samples", None)),
            row_scores=scores[i] if scores else None,
        )
        for i, (k, c, r, m) in enumerate(zip(keys, coefs, rewards, members, strict=True))
    ]
    return GenerationRecord(
        index=g.idx,
        lr=g.lr,
        sigma=g.sigma,
        population=g.population,
        optimizer=codec.loads(g.optimizer),
        schedule_step=g.schedule_step,
        batch_indices=batch,
        members=out,
        fingerprint=g.fingerprint,
        timings=codec.loads(g.timings),
        extra=codec.loads(g.extra),
        committed_at=utc(g.committed_at),
        noise_spec=g.noise_spec,
        param_selection=g.param_selection,
    )


def anchor_info(run: str, a: Anchor) -> AnchorInfo:
    return AnchorInfo(
        run=run,
        generation=a.generation,
        path=a.path,
        sha256=a.sha256,
        fingerprint=a.fingerprint,
        size=a.size,
        created_at=utc(a.created_at),
    )
