"""History files (issue 33 item 4): `export --with-history` writes the lineage's rewards,
batches, events and evaluations beside the seed file, `import` restores them through the
ledger's own writing path, so `log`, `show`, `plot` and `verify` read on the receiving side
as on the sender's; a hostile history (truncated, amplified, inconsistent with its seed
file) is refused in one line. One trained `tiny` ledger (a run, a fork, evaluations) is
shared by the module; the console script where the CLI is the contract."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import zstandard
from test_cli_walkthrough import Cli

import seedledger as sl
from seedledger.ledger.historyfile import (
    DIGEST_SIZE,
    MAGIC,
    PREFIX,
    VERSION,
    _checksum,
    read_history,
)
from seedledger.ledger.seedfile import read_seedfile
from seedledger.replay.noise import member_key
from tests.support.configs import TINY

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sender(tmp_path_factory) -> Path:
    """A ledger with run `r` (2 generations, evaluated at 1 and 2) and its fork `kid` at
    r@1 (1 generation, evaluated), exported as r.seeds and kid.seeds with their histories."""
    tmp = tmp_path_factory.mktemp("history")
    led = tmp / "l.db"
    sl.train(TINY, run="r", ledger=led)
    sl.fork("r@1", "kid", generations=1, ledger=led)
    for ref in ("r@1", "r@2", "kid@2"):
        sl.evaluate(ref, rows=2, ledger=led)
    cli = Cli(tmp, "l.db")
    out = cli.run("export", "r", "-o", "r.seeds", "--with-history").stdout
    assert out.startswith("wrote r.seeds (") and " and r.seeds.history (" in out
    sl.export("kid", tmp / "kid.seeds", ledger=led, with_history=True)
    return tmp


def _normalized(log: dict) -> dict:
    """`log --json` without what the import itself makes: the run's status and creation
    time, its own event, and the marks on the events it brought (imported now, at the
    sender's time beside: `sent_at` stands for `at`); generations keep the sender's times."""
    log = json.loads(json.dumps(log))
    del log["run"]["status"], log["run"]["created_at"]
    log["events"] = [e for e in log["events"] if e["kind"] != "import"]
    for e in log["events"]:
        sent = e.pop("imported")
        if sent is not None:
            e["at"] = sent["sent_at"]
    return log


def test_a_seed_file_with_history_round_trips_log_show_plot_and_verify(sender):
    cli, there = Cli(sender, "l.db"), Cli(sender, "other.db")
    out = there.run("import", "r.seeds").stdout  # the companion beside it is found
    assert out.strip() == "imported r@2 with its history from r.seeds.history"
    mine, theirs = cli.json("log", "r"), there.json("log", "r")
    assert _normalized(theirs) == _normalized(mine)
    assert [e["kind"] for e in theirs["events"]][0] == "import" and theirs["run"]["status"] == "imported"
    assert any(e["kind"] == "evaluation" for e in theirs["events"])
    assert theirs["generations"][0]["reward_mean"] is not None and theirs["generations"][1]["held_out"] is not None

    from seedledger.engine.cli import audit, plot

    with sl.open_ledger(sender / "l.db") as a, sl.open_ledger(sender / "other.db") as b:
        sent, got = audit.show_generation(a, "r@1"), audit.show_generation(b, "r@1")
        drawn = plot.plot_run(b, "r", sender / "r.png")
    for key in ("batch_indices", "members", "reward", "timings", "seconds", "inputs", "fingerprint", "hyperparameters"):
        assert got[key] == sent[key], key
    assert {k: v for k, v in got["extra"].items() if k not in ("imported_from", "source_run")} == sent["extra"]
    assert [{**e, "at": e["imported"]["sent_at"], "imported": None} for e in got["evaluations"]] == sent["evaluations"]
    assert got["committed_at"] == sent["committed_at"]
    assert drawn and (sender / "r.png").stat().st_size > 1000
    kept = read_history(sender / "r.seeds.history", read_seedfile(sender / "r.seeds", key_fn=member_key))
    assert kept.generations[0].committed_at == sent["committed_at"]  # the file keeps the sender's times

    assert sl.verify("r", ledger=sender / "other.db", quick=True)["ok"]  # the rows' hash chain
    report = sl.verify("r", ledger=sender / "other.db")  # and the weights, replayed
    assert report["ok"] and report["inputs"]["text"] == "unchanged"


def test_a_fork_travels_as_one_run_with_its_lineages_events(sender):
    from seedledger.engine.cli import audit

    sl.import_seeds(sender / "kid.seeds", "k", ledger=sender / "fork.db", history=sender / "kid.seeds.history")
    with sl.open_ledger(sender / "l.db") as a, sl.open_ledger(sender / "fork.db") as b:
        sent, log = audit.run_log(a, "kid"), audit.run_log(b, "k")
    assert [g["reward_mean"] for g in log["generations"]] == [g["reward_mean"] for g in sent["generations"]]
    # the lineage is one run now: it holds r@1's evaluation beside kid@2's
    assert [g["held_out"] for g in sent["generations"]][1:] == [g["held_out"] for g in log["generations"]][1:]
    assert None not in [g["held_out"] for g in log["generations"]]
    evaluated = sorted(e["payload"]["generation"] for e in log["events"] if e["kind"] == "evaluation")
    assert evaluated == [1, 2]  # r@1's (the parent's, on the lineage) and kid@2's; not r@2's
    assert [e["payload"]["session"] for e in log["events"] if e["kind"] == "inputs"] == ["train", "fork"]
    assert sl.verify("k", ledger=sender / "fork.db")["ok"]


def test_without_a_companion_import_is_as_before_and_a_member_has_no_history(sender, tmp_path):
    shutil.copy(sender / "r.seeds", tmp_path / "r.seeds")
    report = sl.import_seeds(tmp_path / "r.seeds", "bare", ledger=tmp_path / "l.db")
    assert report == {"run": "bare", "latest_generation": 2, "verified": True}
    with sl.open_ledger(tmp_path / "l.db") as led:
        assert led.generation("bare", 1).reward_stats()["mean"] is None
    with pytest.raises(sl.SeedLedgerError, match="no history to carry"):
        sl.export("r@2#0", tmp_path / "m.seeds", ledger=sender / "l.db", with_history=True)
    assert not (tmp_path / "m.seeds").exists() and not (tmp_path / "m.seeds.history").exists()
    (tmp_path / "x.seeds.history").write_text("mine")  # an existing companion is replaced only with --force
    with pytest.raises(sl.SeedLedgerError, match="--force"):
        sl.export("r", tmp_path / "x.seeds", ledger=sender / "l.db", with_history=True)
    assert not (tmp_path / "x.seeds").exists() and (tmp_path / "x.seeds.history").read_text() == "mine"
    report = sl.export("r", tmp_path / "x.seeds", ledger=sender / "l.db", with_history=True, force=True)
    assert report["history"] == str(tmp_path / "x.seeds.history") and report["history_bytes"] > 100
    sl.export("kid", tmp_path / "x.seeds", ledger=sender / "l.db", force=True)  # replaced without one:
    assert not (tmp_path / "x.seeds.history").exists()  # the old history goes with the file it described
    assert "history" not in sl.import_seeds(tmp_path / "x.seeds", "kid", ledger=tmp_path / "k.db")


# -- hostile history files ----------------------------------------------------------------


def _doc(history: Path) -> dict:
    data = history.read_bytes()
    return json.loads(zstandard.ZstdDecompressor().decompress(data[PREFIX.size : -DIGEST_SIZE]))


def _write(dest: Path, body: bytes, seed_digest: str, *, rawlen: int | None = None, sized: bool = True) -> Path:
    """A history file of `body`, checksummed for the seed file of `seed_digest` (what anyone
    can write: the checksum guards against damage and mispairing, not against its author)."""
    z = zstandard.ZstdCompressor(write_content_size=sized).compress(body)
    blob = PREFIX.pack(MAGIC, VERSION, 0, len(z), len(body) if rawlen is None else rawlen) + z
    dest.write_bytes(blob + _checksum(bytes.fromhex(seed_digest), blob))
    return dest


def _refused(history: Path, seeds: Path) -> str:
    sf = read_seedfile(seeds, key_fn=member_key)
    with pytest.raises(sl.SeedLedgerError) as refused:
        read_history(history, sf)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"history file {history}")
    return message


def test_hostile_history_files_are_refused_in_one_line(sender, tmp_path):
    seeds, good = sender / "r.seeds", sender / "r.seeds.history"
    digest = read_seedfile(seeds, key_fn=member_key).digest
    data = good.read_bytes()
    bad = tmp_path / "bad.history"

    def raw(blob: bytes) -> str:
        bad.write_bytes(blob)
        return _refused(bad, seeds)

    def forged(edit) -> str:
        doc = _doc(good)
        edit(doc)
        return _refused(_write(bad, json.dumps(doc).encode(), digest), seeds)

    # damaged, truncated or for another seed file
    assert "truncated" in raw(data[:-7])
    assert "too short" in raw(data[:20])
    assert "bad magic" in raw(b"X" + data[1:])
    assert "checksum mismatch" in raw(data[:-1] + bytes([data[-1] ^ 1]))
    assert "written for another seed file" in _refused(good, sender / "kid.seeds")
    again = tmp_path / "again.seeds"  # the same run exported again: another file, another digest
    sl.export("r", again, ledger=sender / "l.db")
    assert "written for another seed file" in _refused(good, again)
    assert "written for another seed file" in forged(lambda d: d.update(seed_file="0" * 64))

    # amplified: sizes are checked from the prefix and the frame, before decompressing
    huge = json.dumps(_doc(good)).encode() + b" " * (32 << 20)  # valid JSON, 33 MB from ~1 KB
    assert "out of bounds for a seed file of 2 generations" in _refused(_write(bad, huge, digest), seeds)
    assert "out of bounds" in _refused(_write(bad, json.dumps(_doc(good)).encode(), digest, rawlen=1 << 40), seeds)
    small = json.dumps(_doc(good)).encode()
    assert "body length differs" in _refused(_write(bad, small + b" " * (4 << 20), digest, rawlen=len(small)), seeds)
    assert "body length differs" in _refused(
        _write(bad, small + b" " * (4 << 20), digest, rawlen=len(small), sized=False), seeds)
    prefix = PREFIX.unpack_from(data)
    assert "newer than this seedledger" in raw(PREFIX.pack(MAGIC, VERSION + 1, *prefix[2:]) + data[PREFIX.size:])

    # inconsistent with the seed file's keys
    assert "a history of run 'other'" in forged(lambda d: d.update(run="other"))
    assert "a history of 3 generations, the seed file holds 2" in forged(lambda d: d.update(generation=3))
    assert "generations must list the seed file's 2" in forged(lambda d: d["generations"].pop())
    assert "generation 1 must list 4 rewards" in forged(lambda d: d["generations"][0]["rewards"].pop())
    assert "generation index (expected 1)" in forged(lambda d: d["generations"][0].update(index=2))

    def other_session(d):
        next(e for e in d["events"] if e["kind"] == "inputs")["payload"]["digest"] = "0" * 64
    assert "sessions' inputs differ" in forged(other_session)
    assert "sessions' inputs differ" in forged(
        lambda d: d.update(events=[e for e in d["events"] if e["kind"] != "inputs"]))

    # every field type- and range-checked
    assert "bad reward of generation 1" in forged(lambda d: d["generations"][0]["rewards"].__setitem__(0, "1"))
    assert "bad reward of generation 1" in forged(lambda d: d["generations"][0]["rewards"].__setitem__(0, True))
    assert "(infinite)" in forged(lambda d: d["generations"][0]["rewards"].__setitem__(0, float("inf")))
    assert "bad batch row" in forged(lambda d: d["generations"][1]["batch_indices"].append(-1))
    assert "bad timing" in forged(lambda d: d["generations"][0]["timings"].update(wall="1s"))
    assert "bad extra of generation 2" in forged(lambda d: d["generations"][1].update(extra=[]))
    assert "bad commit time" in forged(lambda d: d["generations"][0].update(committed_at="yesterday"))
    assert "bad generation 1" in forged(lambda d: d["generations"][0].update(samples=[]))
    assert "bad event kind" in forged(lambda d: d["events"][0].update(kind=""))
    assert "bad event" in forged(lambda d: d["events"][0].update(kind="x" * 65))
    assert "bad header" in forged(lambda d: d.update(format="pickle"))
    deep = json.dumps(_doc(good)).replace('"extra": {', '"extra": {"x": ' + "[" * 100000 + "]" * 100000 + ",", 1)
    assert "malformed: RecursionError" in _refused(_write(bad, deep.encode(), digest), seeds)
    assert "malformed: UnicodeDecodeError" in _refused(_write(bad, b"\xff" * 64, digest), seeds)


def test_the_cli_refuses_a_hostile_companion_in_one_line_and_writes_nothing(sender, tmp_path):
    shutil.copy(sender / "r.seeds", tmp_path / "r.seeds")
    doc = _doc(sender / "r.seeds.history")
    doc["generations"][0]["components"].pop()
    digest = read_seedfile(tmp_path / "r.seeds", key_fn=member_key).digest
    _write(tmp_path / "r.seeds.history", json.dumps(doc).encode(), digest)
    line = Cli(tmp_path, "l.db").bad("import", "r.seeds")
    assert "r.seeds.history: bad components of generation 1" in line
    with sl.open_ledger(tmp_path / "l.db") as led:
        assert led.list_runs() == []
    with pytest.raises(sl.SeedLedgerError, match="cannot read history file"):
        sl.import_seeds(tmp_path / "r.seeds", ledger=tmp_path / "l.db", history=tmp_path / "none.history")
