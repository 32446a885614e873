"""Per-row, per-member scores (issue 49 item 3's record): every generation keeps the N×B
matrix of its members' scores on its batch rows (ledger.rowscores, migration 0008), each
member's reward is exactly the mean of its scored rows, the blob is inside the hash chain,
`row_scores: false` keeps none, and a ledger written before upgrades with its digests
unchanged, verifies and exports."""

from __future__ import annotations

import math
import sqlite3

import pytest
import zstandard
from test_ledger_kit import new_run, record

import seedledger as sl
from seedledger.ledger import Ledger, migrate, rowscores
from seedledger.ledger.errors import SeedLedgerError
from tests.support.configs import TINY

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two generations of the suite's tiny run (N=4, B=2), and a fork of it that keeps no scores."""
    root = tmp_path_factory.mktemp("scores")
    sl.train(dict(TINY), run="r", ledger=root / "l.db")
    sl.fork("r@1", "off", overrides=["row_scores=false"], generations=1, ledger=root / "l.db")
    return root


def test_every_member_keeps_one_score_per_batch_row_whose_mean_is_its_reward(trained):
    records = sl.history("r", ledger=trained / "l.db")
    assert [r.index for r in records] == [1, 2]
    for rec in records:
        for m in rec.members:
            assert len(m.row_scores) == len(rec.batch_indices) == TINY["batch_size"]
            assert rowscores.member_reward(m.row_scores) == m.reward  # bit for bit, not approximately
    assert len({tuple(m.row_scores) for r in records for m in r.members}) > 1  # rows score differently


def test_row_scores_false_keeps_none_and_the_column_stays_null(trained):
    (mine,) = [r for r in sl.history("off", ledger=trained / "l.db") if r.index == 2]
    assert all(m.row_scores is None for m in mine.members)
    con = sqlite3.connect(trained / "l.db")
    try:
        rows = dict(con.execute("SELECT r.name, g.row_scores IS NULL FROM generations g JOIN runs r ON r.id = g.run_id"
                                " WHERE g.idx = 2"))
    finally:
        con.close()
    assert rows == {"r": 0, "off": 1}


def test_an_edited_score_breaks_the_chain(trained, tmp_path):
    """One member's score rewritten in SQL (a valid blob, the rest untouched) fails
    `verify --quick` at that generation."""
    import shutil

    db = tmp_path / "l.db"
    shutil.copy(trained / "l.db", db)
    rec = sl.history("r@1", ledger=db)[0]
    scores = [list(m.row_scores) for m in rec.members]
    scores[0][0] += 1.0
    con = sqlite3.connect(db)
    con.execute("UPDATE generations SET row_scores = ? "
                "WHERE idx = 1 AND run_id = (SELECT id FROM runs WHERE name = 'r')",
                (rowscores.pack(scores),))
    con.commit()
    con.close()
    report = sl.verify("r", ledger=db, quick=True)
    assert not report["ok"] and report["first_bad_generation"] == 1, report


def test_a_ledger_at_0007_upgrades_with_its_digests_and_verifies_and_exports(trained, tmp_path):
    from tests.support.ledgercopy import copy_rows
    from tests.support.ledgerforge import rechain

    old = tmp_path / "old.db"
    migrate.upgrade(str(old), "0007")
    copy_rows(str(trained / "l.db"), str(old))  # 0007 has no row_scores: the columns it has
    rechain(old)  # the digests seedledger 0007 wrote for these rows

    def digests() -> list[tuple]:
        con = sqlite3.connect(old)
        try:
            return con.execute("SELECT run_id, idx, digest FROM generations ORDER BY id").fetchall()
        finally:
            con.close()

    before = digests()
    report = sl.verify("r", ledger=old)  # opens, backs up and upgrades
    assert migrate.current(str(old)) == migrate.head() == "0008" and report["ok"]
    assert digests() == before  # rows without scores hash as they did
    assert all(m.row_scores is None for r in sl.history("r", ledger=old) for m in r.members)
    assert sl.export("r", tmp_path / "r.seeds", ledger=old)["generation"] == 2


def test_scores_round_trip_exactly_in_the_narrowest_lossless_width():
    ints = [[1.0, 0.0, math.nan], [0.5, 0.25, 1.0]]
    likelihoods = [[-1.2345678901234567, -0.1, math.nan], [-2.0, -0.3, -0.7]]
    for scores, width in ((ints, 4), (likelihoods, 8)):
        blob = rowscores.pack(scores)
        back = rowscores.unpack(blob, 2, 3, "g")
        flat = [v for row in scores for v in row]
        assert [v if v == v else "nan" for v in flat] == [v if v == v else "nan" for row in back for v in row]
        assert len(zstandard.ZstdDecompressor().decompress(blob)) == rowscores.HEADER.size + width * 6


def test_scores_of_another_shape_are_a_damaged_ledger_in_one_line(tmp_path):
    """A record whose members' scores do not match its batch is committed without them;
    a stored blob of another shape than its generation is refused when read."""
    with Ledger.open(str(tmp_path / "l.db")) as led:
        new_run(led, "k")
        rec = record(1, 4)  # a batch of 4 rows
        for m in rec.members:
            m.row_scores = [0.5] * (len(rec.batch_indices) + 1)
        led.commit_generation("k", rec)
        assert all(m.row_scores is None for m in led.generation("k", 1).members)
    con = sqlite3.connect(tmp_path / "l.db")
    con.execute("UPDATE generations SET row_scores = ?", (rowscores.pack([[0.5, 0.5]] * 3),))
    con.commit()
    con.close()
    with Ledger.open(str(tmp_path / "l.db")) as led, pytest.raises(SeedLedgerError) as bad:
        led.generation("k", 1)
    assert "has row scores for 3×2 (expected 4 members" in str(bad.value) and "\n" not in str(bad.value)
