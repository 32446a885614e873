"""History reads along a lineage: latest generation, segments, replay steps, records
(part of `Ledger`). Reads only: writers are ledger.runs and ledger.commits."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from seedledger.ledger import codec, rows
from seedledger.ledger.base import LedgerBase, Segment
from seedledger.ledger.errors import RunNotFound, SeedLedgerError
from seedledger.ledger.records import GenerationRecord, ReplayStep
from seedledger.ledger.schema import Generation, Member


class HistoryMixin(LedgerBase):
    def latest_generation(self, name: str) -> int:
        """Latest generation of the run (0 for none; the fork point for a fresh fork)."""
        with self._read() as conn:
            return self._latest(conn, self._run_row(conn, name))

    def ancestors(self, name: str, g: int | None = None) -> list[Segment]:
        """(run, first_g, last_g) to replay for `name@g` (default latest), oldest first."""
        with self._read() as conn:
            return self._segments(conn, name, g)

    def replay_history(self, name: str, upto: int | None = None) -> list[ReplayStep]:
        """Keys and exact coefficients of generations 1..upto along the lineage, oldest first,
        each with its perturbation: its own run's noise spec and parameter selection, unless
        the generation records one of its own (an imported lineage whose forks changed kind)."""
        steps: list[ReplayStep] = []
        opt_cache: dict[str, dict[str, Any]] = {}
        with self._read() as conn:
            for run, first, last in self._segments(conn, name, upto):
                row = self._run_row(conn, run)  # the perturbation is the segment's run's own
                rid, spec, selection = row.id, row.noise_spec, row.param_selection
                q = (
                    select(
                        Generation.idx,
                        Generation.keys,
                        Generation.coefficients,
                        Generation.sigma,
                        Generation.optimizer,
                        Generation.population,
                        Generation.coefficients_dtype,
                        Generation.noise_spec,
                        Generation.param_selection,
                    )
                    .where(Generation.run_id == rid, Generation.idx.between(first, last))
                    .order_by(Generation.idx)
                )
                expect = first
                for idx, keys, coefs, sigma, opt, pop, dtype, gspec, gsel in conn.execute(q):
                    if idx != expect:
                        raise SeedLedgerError(f"run {run!r} is missing generation {expect}")
                    rows.check_blobs(run, idx, pop, dtype, keys, coefs)  # as rows.generation_record decodes a row
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
                            noise_spec=spec if gspec is None else gspec,
                            param_selection=selection if gsel is None else gsel,
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

    def summaries(self, name: str, upto: int | None = None) -> list[dict[str, Any]]:
        """Per generation along the lineage up to `upto`, oldest first, what `log` shows:
        generation, run, reward statistics, lr, σ, population, fingerprint, timings,
        committed_at. Generation columns only, one query per segment: members are never
        read, so a run of millions of members lists in milliseconds."""
        out: list[dict[str, Any]] = []
        cols = (Generation.idx, Generation.reward_mean, Generation.reward_max, Generation.reward_min,
                Generation.reward_std, Generation.lr, Generation.sigma, Generation.population,
                Generation.fingerprint, Generation.timings, Generation.committed_at)
        with self._read() as conn:
            for run, first, last in self._segments(conn, name, upto):
                q = select(*cols).where(
                    Generation.run_id == self._run_row(conn, run).id, Generation.idx.between(first, last)
                ).order_by(Generation.idx)
                for row in conn.execute(q):
                    out.append({
                        "generation": row.idx, "run": run, "reward_mean": row.reward_mean,
                        "reward_max": row.reward_max, "reward_min": row.reward_min,
                        "reward_std": row.reward_std, "lr": row.lr, "sigma": row.sigma,
                        "population": row.population, "fingerprint": row.fingerprint,
                        "timings": codec.loads(row.timings), "committed_at": rows.utc(row.committed_at),
                    })
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
