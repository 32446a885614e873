"""What seedledger writes never destroys what it did not write, and nothing unchecked is
reported as checked (issue 13, items 1 and 2), through the console script on `tiny`.

`export -o` and `rebuild -o` never write over a ledger (any SQLite database, whatever its
name), write atomically and replace an existing file only with `--force`. A seed file
without fingerprints is data nothing can be checked against: `import` refuses it unless
`--allow-unverified`, and `verify` / `rebuild` of such a run fail saying what is missing.
Hostile seed files are made here, from a real export, with a valid checksum.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import zstandard
from test_cli_walkthrough import Cli

from seedledger.ledger.seedfile import DIGEST_SIZE, FORMAT_VERSION, MAGIC, PREFIX, _digest
from tests.support.configs import tiny_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict]:
    """A ledger holding run `r` (2 generations) and its seed file; (ledger, train's --json)."""
    work = tmp_path_factory.mktemp("trained")
    (work / "c.yaml").write_text(tiny_config(sigma=0.05, lr=0.01))
    cli = Cli(work)
    out = cli.json("train", "c.yaml", "--run", "r")
    cli.json("export", "r", "-o", "r.seeds")
    return work / "ledger.db", out


@pytest.fixture
def cli(tmp_path, trained) -> Cli:
    """A fresh working directory with a copy of the trained ledger and its seed file."""
    shutil.copy(trained[0], tmp_path / "ledger.db")
    shutil.copy(trained[0].with_name("r.seeds"), tmp_path / "r.seeds")
    return Cli(tmp_path)


def _no_leftovers(work: Path) -> None:
    assert sorted(p.name for p in work.iterdir() if p.name.startswith(".")) == []


# -- export -o / rebuild -o: never over a ledger, never a silent clobber ----------------------


def test_export_never_writes_over_a_ledger(cli):
    work = cli.workdir
    ledger = work / "ledger.db"
    before = ledger.read_bytes()
    for extra in ([], ["--force"]):
        line = cli.bad("export", "r", "-o", "ledger.db", "--ledger", "ledger.db", *extra)
        assert "SQLite" in line and "ledger" in line, line
        assert ledger.read_bytes() == before
    # any SQLite database, whatever its name, and the WAL beside one
    shutil.copy(ledger, work / "notes.txt")
    assert "SQLite" in cli.bad("export", "r", "-o", "notes.txt", "--force")
    assert (work / "notes.txt").read_bytes() == before
    shutil.copy(ledger, work / "other.db")
    (work / "other.db-wal").write_bytes(b"wal frames")
    assert "SQLite" in cli.bad("export", "r", "-o", "other.db-wal", "--force")
    assert (work / "other.db-wal").read_bytes() == b"wal frames"
    _no_leftovers(work)


def test_export_to_a_directory_is_bad_input(cli):
    (cli.workdir / "out").mkdir()
    for extra in ([], ["--force"]):
        assert "is a directory" in cli.bad("export", "r", "-o", "out", *extra)
    assert list((cli.workdir / "out").iterdir()) == []


def test_export_replaces_an_existing_file_only_with_force(cli):
    from seedledger.ledger.seedfile import read_seedfile
    from seedledger.replay.noise import member_key

    work = cli.workdir
    seeds = work / "r.seeds"
    cli.json("export", "r@1", "-o", "r1.seeds")
    first = (work / "r1.seeds").read_bytes()
    assert "--force" in cli.bad("export", "r@2", "-o", "r1.seeds")
    assert (work / "r1.seeds").read_bytes() == first
    (work / "mine.txt").write_text("keep me")
    assert "--force" in cli.bad("export", "r@2", "-o", "mine.txt")
    assert (work / "mine.txt").read_text() == "keep me"

    out = cli.json("export", "r@2", "-o", "r1.seeds", "--force")
    assert out["generation"] == 2 and out["bytes"] == (work / "r1.seeds").stat().st_size
    assert (work / "r1.seeds").read_bytes() != first
    assert read_seedfile(work / "r1.seeds", key_fn=member_key).generation == 2
    assert read_seedfile(seeds, key_fn=member_key).generation == 2
    _no_leftovers(work)


def test_rebuild_never_replaces_a_ledger(cli):
    work = cli.workdir
    ledger = work / "ledger.db"
    before = ledger.read_bytes()
    line = cli.bad("rebuild", "r", "-o", "ledger.db", "--force")
    assert "not a directory" in line and "ledger" in line
    (work / "models").mkdir()
    shutil.copy(ledger, work / "models" / "old.bin")  # a ledger by another name, inside
    line = cli.bad("rebuild", "r", "-o", "models", "--force")
    assert "SQLite" in line and "old.bin" in line
    assert (work / "models" / "old.bin").read_bytes() == before == ledger.read_bytes()
    _no_leftovers(work)


# -- fingerprints: nothing to check against is never "verified" ------------------------------


def _forge(src: Path, dest: Path, edit) -> Path:
    """`src` with `edit(header, arrays)` applied, re-compressed and re-checksummed: what
    anyone can write, since the checksum guards against damage, not against authors."""
    data = src.read_bytes()
    body = zstandard.ZstdDecompressor().decompress(data[PREFIX.size : -DIGEST_SIZE])
    (hlen,) = struct.unpack_from("<I", body)
    header, arrays = json.loads(body[4 : 4 + hlen]), bytearray(body[4 + hlen :])
    edit(header, arrays)
    hj = json.dumps(header).encode()
    body = struct.pack("<I", len(hj)) + hj + bytes(arrays)
    z = zstandard.ZstdCompressor().compress(body)
    head = PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(z), len(body))
    dest.write_bytes(head + z + _digest(head + z))
    return dest


def _null_generations(*which: int):
    """Null the fingerprints of generations `which` (the final one too when it is listed)."""

    def edit(header: dict, arrays: bytearray) -> None:
        fps = header["generations"]["fingerprint"]
        for g in which:
            fps[g - 1] = None
        header["final_fingerprint"] = fps[-1]
        arrays[-1] ^= 0x01  # and alter a coefficient: nothing left would notice

    return edit


def _null_base(header: dict, arrays: bytearray) -> None:
    header["base"]["fingerprint"] = None


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (_null_generations(1, 2), "generation 1 has no fingerprint"),
        (_null_generations(1), "generation 1 has no fingerprint"),
        (_null_generations(2), "generation 2 has no fingerprint"),  # the final one
        (_null_base, "the base model has no fingerprint"),
    ],
    ids=["all", "first", "final", "base"],
)
def test_import_refuses_a_seed_file_without_fingerprints(cli, edit, why):
    bad = _forge(cli.workdir / "r.seeds", cli.workdir / "bad.seeds", edit)
    runs = [r["name"] for r in cli.json("log")]
    line = cli.bad("import", "bad.seeds", "--run", "x")
    assert why in line and "--allow-unverified" in line, line
    assert [r["name"] for r in cli.json("log")] == runs  # nothing committed

    out = cli.json("import", str(bad), "--run", "x", "--allow-unverified")
    assert out["verified"] is False and out["not_verified"] == why
    assert out["latest_generation"] == 2
    proc = cli.run("verify", "x", "--json", code=1)
    report = json.loads(proc.stdout)
    assert report["ok"] is False and report["not_verified"] == why
    assert report["first_bad_generation"] == (0 if edit is _null_base else int(why.split()[1]))
    assert f"not verified: {why}" in report["error"]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"not verified: {why}" in lines[0], proc.stderr
    events = [e for e in cli.json("log", "x")["events"] if e["kind"] in ("import", "verify")]
    assert events[0]["payload"]["not_verified"] == why and events[1]["payload"]["ok"] is False


def test_rebuild_says_what_it_could_not_verify(cli):
    """The issue's file: every fingerprint null, a coefficient altered. Rebuild refuses it
    from the ledger and from the file (exit 1), and with --allow-unverified writes the
    model but says, in --json too, that it is not verified."""
    work = cli.workdir
    _forge(work / "r.seeds", work / "bad.seeds", _null_generations(1, 2))
    cli.json("import", "bad.seeds", "--run", "x", "--allow-unverified")
    line = cli.bad("rebuild", "x", "-o", "out", code=1)
    assert "x@2 could not be verified: generation 2 has no fingerprint" in line
    assert "--allow-unverified" in line
    line = cli.bad("rebuild", "./bad.seeds", "--base", "tiny", "-o", "out", code=1)
    assert "could not be verified: generation 2 has no fingerprint" in line
    assert not (work / "out").exists()

    out = cli.json("rebuild", "x", "-o", "out", "--allow-unverified")
    assert out["verified"] is False and out["not_verified"] == "generation 2 has no fingerprint"
    human = cli.run("rebuild", "./bad.seeds", "--base", "tiny", "-o", "out", "--allow-unverified").stdout
    assert "NOT VERIFIED: generation 2 has no fingerprint" in human
    assert cli.json("rebuild", "r", "-o", "out")["verified"] is True  # a real run verifies
