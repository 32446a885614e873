"""Issue 46, round 4 review: hostile inputs of the same families as the round's findings,
tried against its fixes. JSON nested hundreds of levels deep in a ledger's event payload
(or a history file's) broke `log`, `show` and `--json` with a RecursionError (exit 1), or
imported and broke them later; a module ledger's `module` event whose shape lists 200,000
sizes made `verify` compute their product for minutes before reading the anchor."""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
from test_cli_walkthrough import Cli

import seedledger as sl
from tests.support import historyforge
from tests.support.configs import TINY

pytestmark = pytest.mark.slow


def deep(depth: int) -> str:
    """A JSON object whose one value nests `depth` lists deep, as text (never parsed here:
    the test's own stack would set where Python's recursion runs out)."""
    return '{"x": ' + "[" * depth + "]" * depth + "}"


@pytest.fixture(scope="module")
def sender(tmp_path_factory) -> Path:
    """Run `r` (2 generations) in l.db, exported as r.seeds with r.seeds.history."""
    tmp = tmp_path_factory.mktemp("review")
    sl.train(TINY, run="r", ledger=tmp / "l.db")
    sl.export("r", tmp / "r.seeds", ledger=tmp / "l.db", with_history=True)
    return tmp


@pytest.mark.parametrize("depth", [900, 5000])
def test_a_ledgers_deeply_nested_payload_is_one_line_for_log_and_show(sender, tmp_path, depth):
    """A ledger (anyone's) whose event payload nests 900 or 5,000 deep: `log RUN --json`
    recursed out (exit 1) at 900, and every reader of the run's events at 5,000. Now the
    payload is refused where it is read, in one line naming the event (exit 2)."""
    shutil.copy(sender / "l.db", tmp_path / "l.db")
    con = sqlite3.connect(tmp_path / "l.db")
    with con:
        eid = con.execute("INSERT INTO events (run_id, at, kind, payload) SELECT id, '2026-11-27 00:00:00', "
                          "'planted', ? FROM runs WHERE name = 'r'", (deep(depth),)).lastrowid
    con.close()
    cli = Cli(tmp_path, "l.db")
    said = f"error: the payload of event {eid} nests deeper than 100 levels (seedledger writes none so deep)"
    for args in (("log", "r"), ("log", "r", "--json"), ("show", "r"), ("show", "r", "--json")):
        assert cli.bad(*args) == said
    assert [run["name"] for run in cli.json("log")] == ["r"]  # the runs list reads no payload


def test_a_history_with_a_deeply_nested_payload_is_refused_at_import(sender, tmp_path):
    """A history file whose event payload nests 500 deep (within what Python parses) was
    imported, its payload then too deep for the ledger's readers; it is a bad event now."""
    shutil.copy(sender / "r.seeds", tmp_path / "r.seeds")

    def edit(d: dict) -> None:
        d["events"].append({"kind": "planted", "at": d["events"][-1]["at"], "payload": "DEEP"})

    historyforge.forge(sender / "r.seeds", sender / "r.seeds.history", tmp_path / "r.seeds.history", edit)
    body = json.dumps(historyforge.doc(tmp_path / "r.seeds.history")).replace('"payload": "DEEP"',
                                                                              f'"payload": {deep(500)}')
    historyforge.write(tmp_path / "r.seeds.history", body.encode(), _digest(tmp_path / "r.seeds"))
    line = Cli(tmp_path, "l.db").bad("import", "r.seeds")
    assert line == "error: history file r.seeds.history: bad planted event (nested deeper than 100 levels)"
    with sl.open_ledger(tmp_path / "l.db") as led:
        assert led.list_runs() == []


def _digest(seeds: Path) -> str:
    from seedledger.ledger.seedfile import read_seedfile
    from seedledger.replay.noise import member_key

    return read_seedfile(seeds, key_fn=member_key).digest


NET = ("import torch\n\ndef net():\n"
       "    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))\n")
FIT = ("import torch\n\nX = torch.linspace(-1, 1, 32).reshape(8, 4)\n\ndef fit(model):\n    with torch.no_grad():\n"
       "        return -float((model(X) ** 2).mean())\n")


def test_a_module_events_long_shape_does_not_stall_verify(tmp_path):
    """The generation-0 anchor of a module run is bounded by the shapes its `module` event
    claims (the ledger's word) and by the file. A shape of 200,000 sizes of 2**62 (4 MB of
    JSON) made `math.prod` run for minutes, growing with the square of the length; a shape
    that is not one (more than 8 sizes, a size past 2**40) now leaves the file's own bound."""
    (tmp_path / "net.py").write_text(NET)
    (tmp_path / "fit.py").write_text(FIT)
    sl.evolve(f"module:{tmp_path / 'net.py'}:net", f"fitness:{tmp_path / 'fit.py'}:fit", population=4,
              sigma=0.0625, lr=0.125, generations=1, ledger=tmp_path / "l.db", run="a")
    con = sqlite3.connect(tmp_path / "l.db")
    with con:
        (text,) = con.execute("SELECT payload FROM events WHERE kind = 'module'").fetchone()
        payload = json.loads(text)
        payload["parameters"][0][1] = [1 << 62] * 200_000
        con.execute("UPDATE events SET payload = ? WHERE kind = 'module'", (json.dumps(payload),))
    con.close()
    started = time.monotonic()
    report = Cli(tmp_path, "l.db").json("verify", "a")
    assert report["ok"] and time.monotonic() - started < 60  # minutes before, whatever the load


def test_an_edited_inputs_record_is_named_at_the_lineages_first_generation(sender, tmp_path):
    """check_inputs reports the first generation whose row names an edited record, but it
    walked the rows ordered by their bound digest: with a fork's own rows listed before
    its parent's and the same inputs (the same digest), a record edited along the lineage
    was named at the fork's generation, not at the parent's first."""
    shutil.copy(sender / "l.db", tmp_path / "l.db")
    sl.fork("r@1", "f", generations=1, ledger=tmp_path / "l.db")
    con = sqlite3.connect(tmp_path / "l.db")
    with con:
        records = con.execute("SELECT id, payload FROM events WHERE kind = 'inputs'").fetchall()
        assert len(records) == 2 and len({json.loads(p)["digest"] for _, p in records}) == 1
        for eid, text in records:  # both sessions' records edited: every row of f's lineage fails
            payload = json.loads(text)
            payload["libraries"] = {**payload["libraries"], "transformers": "0.0.0"}
            con.execute("UPDATE events SET payload = ? WHERE id = ?", (json.dumps(payload), eid))
    con.close()
    line = Cli(tmp_path, "l.db").bad("verify", "f", "--quick", code=1)
    assert "run 'r' generation 1: the inputs record it was trained on was edited outside seedledger" in line


def test_an_inputs_record_dated_past_the_runs_latest_generation_is_refused(sender, tmp_path):
    """A record is in force for the generations after its `from_generation`, so one planted
    in a shared ledger from a generation the run has not reached (here 3, at r@2) was bound
    by the receiver's own next rows: resume trained, r@4's row named the planted record
    (transformers 9.9.9) in the chain, and the next resume was refused as a change. No
    session writes such a record (it records where it starts): verify and resume refuse it."""
    shutil.copy(sender / "l.db", tmp_path / "l.db")
    con = sqlite3.connect(tmp_path / "l.db")
    with con:
        (text,) = con.execute("SELECT payload FROM events WHERE kind = 'inputs'").fetchone()
        planted = json.loads(text) | {"from_generation": 3}
        planted["libraries"] = {**planted["libraries"], "transformers": "9.9.9"}
        con.execute("INSERT INTO events (run_id, at, kind, payload) SELECT id, '2026-11-27 00:00:00', 'inputs', ? "
                    "FROM runs WHERE name = 'r'", (json.dumps(planted),))
    con.close()
    said = ("run 'r': an inputs record from generation 3, which the run has not reached (its latest is 2), was "
            "written outside seedledger")
    cli = Cli(tmp_path, "l.db")
    assert cli.bad("verify", "r", "--quick", code=1) == f"error: r@2 does not verify: {said}"
    assert cli.bad("resume", "r", "-n", "2", code=1) == f"error: {said}"
    with sl.open_ledger(tmp_path / "l.db") as led:
        assert led.latest_generation("r") == 2  # nothing trained
