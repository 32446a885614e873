"""The hash chain in the ledger (part of `Ledger`): the digest a new generation links to,
and `check_chain`, which recomputes a lineage's chain without replaying any weights.
The encoding is ledger.chain."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select

from seedledger.ledger import chain, sessions
from seedledger.ledger.base import LedgerBase
from seedledger.ledger.errors import ChainBroken
from seedledger.ledger.schema import Generation, Member, Run


def _start(row: Any) -> int:
    """A run's first own generation."""
    return (row.parent_generation or 0) + 1 if row.parent_id is not None else 1


class IntegrityMixin(LedgerBase):
    def _run_by_id(self, conn: Connection, run_id: int) -> Any:
        return conn.execute(select(Run).where(Run.id == run_id)).one()

    def _genesis(self, conn: Connection, row: Any) -> str:
        parent_head = None
        if row.parent_id is not None:
            parent_head = self._head(conn, self._run_by_id(conn, row.parent_id), row.parent_generation)
        return chain.genesis(row, parent_head)

    def _head(self, conn: Connection, row: Any, g: int) -> str:
        """The stored digest at generation g of `row`'s lineage (g = 0: the root's genesis)."""
        while g < _start(row) and row.parent_id is not None:
            row = self._run_by_id(conn, row.parent_id)
        if g == 0:
            return self._genesis(conn, row)
        return self._stored_digest(conn, row.id, g) or ""

    @staticmethod
    def _stored_digest(conn: Connection, run_id: int, g: int) -> str | None:
        return conn.execute(
            select(Generation.digest).where(Generation.run_id == run_id, Generation.idx == g)
        ).scalar()

    def _prev_digest(self, conn: Connection, run: Any, index: int) -> str:
        """What generation `index` of `run` links to: the run's genesis for its first own
        generation, else the stored digest of the generation before it."""
        if index == _start(run):
            return self._genesis(conn, run)
        return self._stored_digest(conn, run.id, index - 1) or ""

    def _rows(self, conn: Connection, row: Any, first: int, last: int) -> list[tuple[Any, list[Any]]]:
        """The generation rows first..last of run `row`, each with its member rows (in order)."""
        in_range = (Generation.run_id == row.id, Generation.idx.between(first, last))
        gens = conn.execute(select(Generation).where(*in_range).order_by(Generation.idx)).all()
        if [g.idx for g in gens] != list(range(first, last + 1)):
            missing = min(set(range(first, last + 1)) - {g.idx for g in gens})
            raise ChainBroken(f"run {row.name!r} is missing generation {missing}", missing)
        members: dict[int, list[Any]] = {}
        mq = (
            select(Member)
            .join(Generation, Generation.id == Member.generation_id)
            .where(*in_range)
            .order_by(Member.generation_id, Member.idx)
        )
        for m in conn.execute(mq):
            members.setdefault(m.generation_id, []).append(m)
        return [(g, members.get(g.id, [])) for g in gens]

    def inputs_sessions(self, name: str, upto: int | None = None) -> list[sessions.Session]:
        """(from_generation, run, record) of every session recorded along `name`'s lineage
        whose generations reach `upto` at most (None: all), oldest first (ledger.sessions)."""
        with self._read() as conn:
            return sessions.sessions(conn, self._run_row(conn, name), upto)

    def check_inputs(self, name: str, upto: int | None = None) -> None:
        """The inputs half of `check_chain`, alone: ChainBroken naming the first generation
        up to `upto` whose row names an inputs record that was edited or deleted."""
        with self._read() as conn:
            row = self._run_row(conn, name)
            last = self._latest(conn, row) if upto is None else upto
            if last > 0:
                sessions.check_inputs(conn, row, last)

    def bound_inputs(self, name: str, upto: int | None = None) -> dict[int, str | None]:
        """Generation -> the inputs digest its row binds in the chain (None: none, or a row
        committed before migration 0007), for 1..upto along the lineage."""
        out: dict[int, str | None] = {}
        with self._read() as conn:
            for run, first, last in self._segments(conn, name, upto):
                q = select(Generation.idx, Generation.inputs_digest).where(
                    Generation.run_id == self._run_row(conn, run).id, Generation.idx.between(first, last))
                out.update((g, d) for g, d in conn.execute(q))
        return out

    def chain_links(self, name: str, upto: int | None = None) -> list[dict[str, Any]]:
        """Per generation along `name@upto`'s lineage, oldest first, what its row's digest
        covers beyond its record (ledger.historychain): the digest, the one it links to,
        the inputs digest it binds, the row-scores blob, and whether a member kept samples."""
        out: list[dict[str, Any]] = []
        with self._read() as conn:
            for run, first, last in self._segments(conn, name, upto):
                row = self._run_row(conn, run)
                in_range = (Generation.run_id == row.id, Generation.idx.between(first, last))
                sampled = (select(Member.generation_id).join(Generation, Generation.id == Member.generation_id)
                           .where(*in_range, Member.samples.is_not(None)).distinct())
                kept = set(conn.execute(sampled).scalars())
                link = self._prev_digest(conn, row, first)
                q = select(Generation.id, Generation.digest, Generation.inputs_digest, Generation.row_scores)
                for gid, digest, inputs, scores in conn.execute(q.where(*in_range).order_by(Generation.idx)):
                    out.append({"digest": digest, "link": link, "inputs_digest": inputs, "row_scores": scores,
                                "samples": gid in kept})
                    link = digest or ""
        return out

    def check_chain(self, name: str, upto: int | None = None) -> tuple[str, int]:
        """Recompute the chain of `name@upto` (default latest) along its lineage from the
        rows as stored; returns (digest of the last generation, generations checked).
        Raises ChainBroken naming the first generation whose row (or run settings, for a
        run's first generation) no longer matches, or whose inputs record is not the one
        its row names (ledger.sessions.check_inputs)."""
        with self._read() as conn:
            segments = {run: (first, last) for run, first, last in self._segments(conn, name, upto)}
            lineage = [self._run_row(conn, name)]
            while lineage[-1].parent_id is not None:
                lineage.append(self._run_by_id(conn, lineage[-1].parent_id))
            root_genesis = chain.genesis(lineage[-1], None)
            digests: dict[int, str] = {}  # recomputed, along the lineage
            head = ""
            for row in reversed(lineage):
                if row.name not in segments:
                    continue
                first, last = segments[row.name]
                pg = row.parent_generation
                if row.parent_id is None:
                    link = root_genesis
                else:
                    link = chain.genesis(row, digests[pg] if pg else root_genesis)
                for g, members in self._rows(conn, row, first, last):
                    got = chain.generation_digest(link if g.idx == first else digests[g.idx - 1], g, members)
                    if g.digest != got:
                        raise ChainBroken(_broken(row.name, g.idx, g.digest, g.idx == _start(row)), g.idx)
                    digests[g.idx] = head = got
            if digests:  # each row's inputs record, as the row names it
                sessions.check_inputs(conn, lineage[0], max(digests))
            return head, len(digests)


def _broken(run: str, g: int, stored: str | None, first: bool) -> str:
    if stored is None:
        return f"run {run!r} generation {g} has no digest: its history cannot be checked"
    where = " (or the run's settings)" if first else ""
    return (
        f"run {run!r} generation {g} was changed outside seedledger: its row{where} no longer "
        "matches its digest in the hash chain"
    )
