"""A damaged ledger is reported, never papered over; create_run refuses what SQL can't hold."""

from __future__ import annotations

import sqlite3

import pytest
from test_ledger_kit import fill, new_run

from seedledger.ledger import Ledger, SeedLedgerError


@pytest.fixture
def path(tmp_path):
    p = tmp_path / "l.db"
    with Ledger.open(p) as led:
        new_run(led, "a")
        fill(led, "a", 1, 3)
    return p


def _sql(path, *statements) -> None:
    con = sqlite3.connect(path)
    for s in statements:
        con.execute(s)
    con.commit()
    con.close()


GEN2 = "(SELECT id FROM generations WHERE idx = 2)"


@pytest.mark.parametrize(
    "damage",
    [
        f"DELETE FROM members WHERE generation_id = {GEN2}",  # all member rows gone
        f"DELETE FROM members WHERE generation_id = {GEN2} AND idx = 1",  # one gone
        f"INSERT INTO members (generation_id, idx, key, sign, coefficient, components) "
        f"VALUES ({GEN2}, 4, 1, 1, 0.0, '{{}}')",  # one more than the population
        "UPDATE generations SET population = 5 WHERE idx = 2",  # disagrees with its rows
    ],
)
def test_member_rows_inconsistent_with_population(path, damage):
    _sql(path, damage)
    with Ledger.open(path) as led:
        for read in (lambda: led.generation("a", 2), lambda: led.records("a")):
            with pytest.raises(SeedLedgerError, match="run 'a' generation 2") as err:
                read()
            assert "\n" not in str(err.value)
        assert led.generation("a", 1).population == 4  # the sound ones still read


def test_truncated_blob_is_reported(path):
    _sql(path, "UPDATE generations SET coefficients = substr(coefficients, 1, 24) WHERE idx = 3")
    with Ledger.open(path) as led:
        for read in (lambda: led.replay_history("a"), lambda: led.generation("a", 3)):
            with pytest.raises(SeedLedgerError, match="run 'a' generation 3"):
                read()


@pytest.mark.parametrize("seed", [1 << 63, -(1 << 63) - 1, 2**70, True, 1.5, "3"])
def test_create_run_refuses_seed_outside_int64(tmp_path, seed):
    with Ledger.open(tmp_path / "l.db") as led:
        with pytest.raises(SeedLedgerError, match="seed"):
            led.create_run("r", base_model="tiny", noise_spec="v1", run_key=1, seed=seed)
        assert led.list_runs() == [] and led.events() == []
        for ok in (-(1 << 63), (1 << 63) - 1, None):
            name = f"r{ok}"
            assert (
                led.create_run(name, base_model="t", noise_spec="v1", run_key=1, seed=ok).seed == ok
            )
