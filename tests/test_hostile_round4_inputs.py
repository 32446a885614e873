"""Issue 46 item 5, round 4: inputs provenance could be bypassed or forged. (a) A dataset
named through a symlink, repointed at an edited file, resumed silently (files compared by
resolved path); (b) one SQL UPDATE of the recorded hash and digest passed resume, verify
and the chain check; (c) verify trusted a record's stored digest; (d) deleted `inputs`
events were silent. Now files are named as the config names them and hashed by content,
and every generation row binds the digest of the record it was trained on inside the hash
chain (ledger.sessions, migration 0007). Ledgers are edited with sqlite3, as an attacker
would; a ledger written before the change upgrades with its chain digests unchanged."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml
from test_cli_walkthrough import Cli

import seedledger as sl
from seedledger.engine.runtime.setup.inputs import InputsChanged
from seedledger.ledger.errors import ChainBroken
from seedledger.ledger.provenance import digest

pytestmark = pytest.mark.slow

ROWS = [{"prompt": f"Say {w}", "answer": w} for w in ("one", "two", "three", "four", "five", "six")]
EXTRA = json.dumps({"prompt": "Say seven", "answer": "seven"}) + "\n"


def _project(root: Path, data: str = "data.jsonl") -> Path:
    """A dataset and a one-generation config on `tiny` that names it as `data`."""
    (root / "v1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (root / "c.yaml").write_text(yaml.safe_dump({
        "model": "tiny", "task": {"name": "jsonl", "path": data, "test_size": 2},
        "population": 4, "generations": 1, "batch_size": 2, "max_new_tokens": 4, "seed": 7,
    }))
    return root


def test_a_symlinked_dataset_repointed_at_an_edited_file_is_a_changed_input(tmp_path):
    """(a) The record names the file as the config does (an absolute path is stored as it
    is: here, the link), and hashes what it reads: a link repointed at another file is
    that name with other content."""
    root = _project(tmp_path, str(tmp_path / "data.jsonl"))
    (root / "data.jsonl").symlink_to("v1.jsonl")
    sl.train(root / "c.yaml", run="r", ledger=root / "l.db")
    with sl.open_ledger(root / "l.db") as led:
        (session,) = [e.payload for e in led.events("r", "inputs")]
    assert list(session["files"]) == [str(root / "data.jsonl")]
    (root / "v2.jsonl").write_text((root / "v1.jsonl").read_text() + EXTRA)
    (root / "data.jsonl").unlink()
    (root / "data.jsonl").symlink_to("v2.jsonl")
    with pytest.raises(InputsChanged) as refused:
        sl.resume("r", generations=1, ledger=root / "l.db")
    before = session["files"][str(root / "data.jsonl")]
    after = hashlib.sha256((root / "v2.jsonl").read_bytes()).hexdigest()
    assert f"file {root / 'data.jsonl'}: {before[:12]} -> {after[:12]}" in str(refused.value)
    with sl.open_ledger(root / "l.db") as led:
        assert led.latest_generation("r") == 1  # nothing trained


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """Run `r`, one generation on data.jsonl (a plain file)."""
    root = _project(tmp_path_factory.mktemp("inputs_chain"))
    shutil.copy(root / "v1.jsonl", root / "data.jsonl")
    sl.train(root / "c.yaml", run="r", ledger=root / "l.db")
    return root


def _forged_hash(con: sqlite3.Connection, data: Path) -> None:
    """(b) The dataset's hash in the record and the record's digest both rewritten to match
    an edited file: one UPDATE, as the issue's attacker made."""
    (eid, text), = con.execute("SELECT id, payload FROM events WHERE kind = 'inputs'")
    record = json.loads(text)
    record["files"][str(data)] = hashlib.sha256(data.read_bytes()).hexdigest()
    record["digest"] = digest(record)
    con.execute("UPDATE events SET payload = ? WHERE id = ?", (json.dumps(record), eid))


def _forged_digest_field(con: sqlite3.Connection, data: Path) -> None:
    """(c) Only the stored digest field changed: a reader that trusts it is fooled."""
    con.execute("UPDATE events SET payload = json_set(payload, '$.digest', ?) WHERE kind = 'inputs'", ("0" * 64,))


def _deleted(con: sqlite3.Connection, data: Path) -> None:
    """(d) The session's record deleted."""
    con.execute("DELETE FROM events WHERE kind = 'inputs'")


@pytest.mark.parametrize(("attack", "says"), [
    (_forged_hash, "was edited outside seedledger (its contents no longer give that digest)"),
    (_forged_digest_field, "was edited outside seedledger (its digest field does not match its contents)"),
    (_deleted, "was deleted outside seedledger"),
])
def test_an_inputs_record_edited_or_deleted_in_sql_breaks_the_chain(trained, tmp_path, attack, says):
    """(b), (c), (d): the row of generation 1 binds its record's digest inside the chain, so
    `verify --quick`, `verify` and `resume` all name generation 1 in one line, exit 1."""
    root = tmp_path
    for name in ("c.yaml", "l.db", "data.jsonl"):
        shutil.copy(trained / name, root / name)
    (root / "data.jsonl").write_text((root / "data.jsonl").read_text() + EXTRA)  # the data the attacker wants
    con = sqlite3.connect(root / "l.db")
    with con:
        attack(con, root / "data.jsonl")
    con.close()
    cli = Cli(root, "l.db")
    line = cli.bad("verify", "r", "--quick", code=1)
    assert line == (f"error: r@1 does not verify: run 'r' generation 1: the inputs record it was trained on {says}; "
                    f"its row names sha256 {line.split('names sha256 ')[1][:12]} in the hash chain")
    assert says in cli.bad("verify", "r", code=1)
    assert says in cli.bad("resume", "r", "-n", "1", code=1)
    with pytest.raises(ChainBroken, match="generation 1"):
        sl.export("r", root / "r.seeds", ledger=root / "l.db")  # never shipped either
    with sl.open_ledger(root / "l.db") as led:
        assert led.latest_generation("r") == 1


def test_verify_reads_digests_from_the_records_not_their_digest_fields(trained, tmp_path):
    """(c) The inputs verdict and `log`'s ranges recompute each record's digest."""
    shutil.copy(trained / "l.db", tmp_path / "l.db")
    with sl.open_ledger(tmp_path / "l.db") as led:
        from seedledger.ledger.provenance import input_ranges

        (record,) = [e.payload for e in led.events("r", "inputs")]
        (span,) = input_ranges(led, "r", 1)
    assert span.digest == digest(record) and span.chained


def test_a_ledger_written_before_keeps_its_digests_verifies_and_binds_from_then_on(trained, tmp_path):
    """A ledger at schema 0006 (rows binding no inputs, digests as that seedledger computed
    them) upgrades to 0007 with every chain digest unchanged and verifies; `verify` says its
    records are outside the chain; generations committed after the upgrade bind theirs."""
    from seedledger.ledger import migrate
    from tests.support.ledgercopy import copy_rows
    from tests.support.ledgerforge import rechain

    old = tmp_path / "old.db"
    migrate.upgrade(str(old), "0006")
    copy_rows(str(trained / "l.db"), str(old))  # 0006 has no inputs_digest: the columns it has
    rechain(old)  # the digests seedledger 0006 wrote for these rows
    for name in ("c.yaml", "data.jsonl"):
        shutil.copy(trained / name, tmp_path / name)

    def digests() -> list[tuple]:
        con = sqlite3.connect(old)
        try:
            return con.execute("SELECT run_id, idx, digest FROM generations ORDER BY id").fetchall()
        finally:
            con.close()

    before = digests()
    report = sl.verify("r", ledger=old)  # opens, backs up and upgrades
    assert migrate.current(str(old)) == migrate.head() and list(tmp_path.glob("old.db.bak-0006-*"))
    assert digests() == before and report["ok"]
    assert report["inputs"]["text"] == "unchanged (outside the hash chain for generations 1..1)"
    sl.resume("r", generations=1, ledger=old)
    with sl.open_ledger(old) as led:
        assert led.bound_inputs("r") == {1: None, 2: digest(led.events("r", "inputs")[-1].payload)}
    assert digests()[:1] == before
    assert sl.verify("r", ledger=old)["inputs"]["text"] == "unchanged (outside the hash chain for generations 1..1)"
