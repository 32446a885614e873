"""Issue 46, round 4 (history files): times out of range are one line (item 11), `log`
of huge payloads is quick and cut (item 6), imported events are marked as the sender's
(item 9), a history at the size limit exports again after its import (item 12), a kill
while `export --force` publishes leaves a consistent pair (item 10). One
trained `tiny` ledger, evaluated and exported with its history, is shared by the module;
hostile history files are forged as their author would (tests.support.historyforge)."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
from test_cli_walkthrough import Cli

import seedledger as sl
from tests.support import historyforge
from tests.support.cli import seedledger
from tests.support.configs import TINY

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sender(tmp_path_factory) -> Path:
    """Run `r` (2 generations, r@1 evaluated) exported as r.seeds with r.seeds.history."""
    tmp = tmp_path_factory.mktemp("round4")
    led = tmp / "l.db"
    sl.train(TINY, run="r", ledger=led)
    sl.evaluate("r@1", rows=2, ledger=led)
    sl.export("r", tmp / "r.seeds", ledger=led, with_history=True)
    return tmp


@pytest.mark.parametrize("when", ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00"])
@pytest.mark.parametrize("where", ["event", "commit"])
def test_a_time_outside_utcs_years_is_one_line_and_writes_nothing(sender, tmp_path, when, where):
    """Item 11: a time that parses but leaves years 1..9999 once in UTC (the ledger stores
    UTC) was an OverflowError and exit 1; now the reader refuses it like any bad time."""
    shutil.copy(sender / "r.seeds", tmp_path / "r.seeds")

    def edit(d: dict) -> None:
        if where == "event":
            d["events"][0]["at"] = when
        else:
            d["generations"][1]["committed_at"] = when

    historyforge.forge(sender / "r.seeds", sender / "r.seeds.history", tmp_path / "r.seeds.history", edit)
    line = Cli(tmp_path, "l.db").bad("import", "r.seeds")
    what = "event time" if where == "event" else "commit time of generation 2"
    assert line.endswith(f"r.seeds.history: bad {what} (out of range in UTC)")
    with sl.open_ledger(tmp_path / "l.db") as led:
        assert led.list_runs() == []


def test_log_of_a_tiny_history_with_huge_payloads_is_quick_and_cut(sender, tmp_path):
    """Item 6: a history whose events carry megabytes (14 MB of payload in a ~700 KB file,
    300 events) made `log` run for minutes laying out table cells; now each event's line is
    cut at a bound with a pointer to --json, and the table lists the latest events only."""
    import json
    import time

    from seedledger.engine.cli.audit_lines import CELL, MORE
    from seedledger.engine.cli.audit_render import MAX_ROWS

    shutil.copy(sender / "r.seeds", tmp_path / "r.seeds")
    big = list(range(1_800_000))  # ~14 MB of JSON, compressible within the reader's ratio bound

    def edit(d: dict) -> None:
        at = d["events"][-1]["at"]
        d["events"] += [{"kind": "note", "at": at, "payload": {"i": i}} for i in range(300)]
        d["events"].append({"kind": "planted", "at": at, "payload": {"numbers": big, "text": "x" * 100_000}})

    historyforge.forge(sender / "r.seeds", sender / "r.seeds.history", tmp_path / "r.seeds.history", edit)
    cli = Cli(tmp_path, "l.db")
    cli.run("import", "r.seeds")
    started = time.perf_counter()
    out = cli.run("log", "r").stdout
    assert time.perf_counter() - started < 30  # 775 s before
    assert max(len(line) for line in out.splitlines()) < 2 * CELL
    assert "numbers=[0, 1, 2, 3" in out and MORE.strip() in " ".join(out.split())
    assert "earlier events not shown (--json lists all)" in out
    assert out.count("  note  ") <= MAX_ROWS
    full = json.loads(cli.run("log", "r", "--json").stdout)
    assert full["events"][-1]["payload"]["numbers"] == big and len(full["events"]) > 300


@pytest.mark.parametrize(("point", "with_history", "left"), [
    ("export-staged", True, "old pair"),
    ("export-cleared", True, "old seed file"),
    ("export-seeds", True, "new seed file"),
    ("export-seeds", False, "new seed file"),
])
def test_a_kill_while_export_force_publishes_leaves_a_consistent_pair(sender, tmp_path, point, with_history, left):
    """Item 10: SIGKILL at each point of `export --force` (with and without --with-history)
    over an earlier export with its history. Two files cannot be renamed at once, so the
    stale history goes first: whatever is left imports, with the history written for it."""
    out = tmp_path / "out.seeds"
    sl.export("r@1", out, ledger=sender / "l.db", with_history=True)  # the pair being replaced
    args = ["export", "r", "-o", out, "--force", "--ledger", sender / "l.db", *(["--with-history"] * with_history)]
    killed = seedledger(args, cwd=tmp_path, env=os.environ | {"SEEDLEDGER_FAILPOINT": f"{point}@2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    report = sl.import_seeds(out, "x", ledger=tmp_path / "x.db")  # never "written for another seed file"
    generation, history = {"old pair": (1, True), "old seed file": (1, False), "new seed file": (2, False)}[left]
    assert report["latest_generation"] == generation and ("history" in report) == history
    done = seedledger(args, cwd=tmp_path)  # and the export, run again, completes the new pair
    assert done.returncode == 0, done.stderr
    again = sl.import_seeds(out, "y", ledger=tmp_path / "x.db")
    assert again["latest_generation"] == 2 and again.get("history") == (f"{out}.history" if with_history else None)


def test_an_export_never_pairs_a_seed_file_with_a_history_written_for_another(sender, tmp_path):
    """Item 10: an export without history over no file, beside a history left there, would
    publish a pair that import refuses: refused unless --force, which removes the history."""
    (tmp_path / "o.seeds.history").write_text("an earlier export's")
    line = Cli(sender, "l.db").bad("export", "r", "-o", str(tmp_path / "o.seeds"))
    assert line == f"error: -o {tmp_path / 'o.seeds.history'}: exists; pass --force to replace it"
    assert not (tmp_path / "o.seeds").exists()
    Cli(sender, "l.db").run("export", "r", "-o", str(tmp_path / "o.seeds"), "--force")
    assert not (tmp_path / "o.seeds.history").exists()
    assert sl.import_seeds(tmp_path / "o.seeds", ledger=tmp_path / "x.db")["latest_generation"] == 2


PLANTED = ["verify", "inputs-accepted", "lease-taken-over", "tune-trial", "pbt-score", "module"]
SENT = "2001-02-03T04:05:06+00:00"


def test_imported_events_are_the_senders_never_the_receivers_own(sender, tmp_path):
    """Item 9: events a history brings are marked with the seed file they came with and
    recorded at the importer's time, the sender's beside it; whatever acts on events (tune,
    pbt, a module run's base) never sees them, and `log` says whose they are."""
    import json

    from seedledger.engine.search import tunecheck
    from seedledger.ledger.seedfile import read_seedfile
    from seedledger.replay.noise import member_key

    shutil.copy(sender / "r.seeds", tmp_path / "r.seeds")
    payloads = {"verify": {"generation": 2, "ok": True}, "tune-trial": {"study": "s", "trial": 0},
                "pbt-score": {"pbt": "p", "round": 0}, "module": {"parameters": [["w", [1 << 30], "float32"]]}}

    def plant(d: dict) -> None:
        d["events"] += [
            {"kind": kind, "at": SENT, "payload": payloads.get(kind, {"planted": True})} for kind in PLANTED
        ]

    historyforge.forge(sender / "r.seeds", sender / "r.seeds.history", tmp_path / "r.seeds.history", plant)
    digest = read_seedfile(tmp_path / "r.seeds", key_fn=member_key).digest
    cli = Cli(tmp_path, "l.db")
    cli.run("import", "r.seeds")
    with sl.open_ledger(tmp_path / "l.db") as led:
        assert [e.kind for e in led.events("r")] == ["import"]  # the receiver's own trail
        assert all(not led.events("r", kind) for kind in PLANTED)
        assert tunecheck.trial_event(led, "r") is None
        brought = [e for e in led.events("r", imported=True) if e.kind in PLANTED]
        own_import = led.events("r", "import")[0]
    assert [e.kind for e in brought] == PLANTED
    assert all(e.origin == digest and e.sent_at.isoformat() == SENT and e.at >= own_import.at for e in brought)
    log = json.loads(cli.run("log", "r", "--json").stdout)
    marks = {e["kind"]: e["imported"] for e in log["events"]}
    assert marks["import"] is None and marks["verify"] == {"from": digest, "sent_at": SENT}
    table = " ".join(cli.run("log", "r").stdout.split())
    assert f"[imported from {digest[:12]}…, sent 2001-02-03 04:05:06] generation=2, ok=True" in table


def test_a_history_at_the_size_limit_exports_again_after_its_import(sender, tmp_path):
    """Item 12: the import added its marks (the seed file's digest and source run on every
    generation, its own event) and the history no longer fit its bound on export. What an
    import adds does not travel again (the next import adds its own): the re-exported
    history is the imported one, event for event and generation for generation."""
    from seedledger.ledger import codec
    from seedledger.ledger.historyfile import limit
    from seedledger.ledger.seedfile import read_seedfile
    from seedledger.replay.noise import member_key

    shutil.copy(sender / "r.seeds", tmp_path / "r.seeds")
    sf = read_seedfile(tmp_path / "r.seeds", key_fn=member_key)
    d = historyforge.doc(sender / "r.seeds.history")
    d["events"].append({"kind": "note", "at": SENT, "payload": {"pad": ""}})
    room = limit(sf) - len(codec.dumps(d).encode()) - 16  # 16 bytes below the bound, as the encoder writes it
    d["events"][-1]["payload"]["pad"] = os.urandom(room // 2).hex()  # compresses within the ratio bound
    historyforge.write(tmp_path / "r.seeds.history", codec.dumps(d).encode(), sf.digest)
    sl.import_seeds(tmp_path / "r.seeds", ledger=tmp_path / "l.db")
    again = tmp_path / "again.seeds"
    report = sl.export("r", again, ledger=tmp_path / "l.db", with_history=True)  # refused before: over the bound
    back = historyforge.doc(Path(report["history"]))
    assert back["events"] == d["events"] and back["generations"] == d["generations"]
    assert sl.import_seeds(again, "twice", ledger=tmp_path / "l.db")["history"] == report["history"]
