"""Seed files: lossless round trip, compact keys, old formats, segments, member files, and
an export that refuses what a reader would. (Hostile files: test_seedfile_hostile.py.)"""

from __future__ import annotations

import json
import os
import random
import stat
import struct
from dataclasses import replace

import pytest
from test_ledger_kit import bits, fill, mix, new_run, record

from seedledger.ledger import Ledger, SeedLedgerError, seedfile
from seedledger.ledger.seedfile import (
    FORMAT_VERSION,
    MAGIC,
    read_seedfile,
)
from seedledger.ledger.seedio import export_seedfile, import_seedfile
from tests.support import ledgerforge
from tests.support import seedfiles as forged


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    yield from forged.source_ledger(tmp_path_factory)


@pytest.fixture(scope="module")
def dst(tmp_path_factory):
    yield from forged.empty_ledger(tmp_path_factory)


def test_round_trip_lossless(source, ledger_url):
    led, d = source
    sf = read_seedfile(d / "derived.seeds", key_fn=mix)
    assert sf.header["keys"] == "index-u16" and sf.header["coefficients"] == "f64"
    forged.same_steps(sf.steps, led.replay_history("kid"))
    assert sf.final_fingerprint == led.generation("kid", 5).fingerprint
    assert sf.base_fingerprint == "f" * 32 and sf.noise_spec == "v1"
    raw = read_seedfile(d / "raw.seeds")  # no key_fn needed for raw keys
    assert raw.header["keys"] == "raw-u64" and raw.header["coefficients"] == "f32hi20"
    forged.same_steps(raw.steps, led.replay_history("kid", 4))

    with Ledger.open(ledger_url) as dst:  # imported into SQLite and into PostgreSQL
        info = import_seedfile(dst, d / "derived.seeds", "copy", key_fn=mix)
        assert info.name == "copy" and info.parent is None and info.status == "imported"
        assert info.run_key == (1 << 64) - 3 and info.config == led.get_run("kid").config
        got, want = dst.records("copy"), led.records("kid")
        assert [(r.index, r.fingerprint, r.lr, r.schedule_step) for r in got] == [
            (r.index, r.fingerprint, r.lr, r.schedule_step) for r in want
        ]
        assert [[(m.key, m.sign, bits(m.coefficient)) for m in r.members] for r in got] == [
            [(m.key, m.sign, bits(m.coefficient)) for m in r.members] for r in want
        ]
        assert dst.events("copy", "import")[0].payload["source"] == "kid@5"
        with pytest.raises(SeedLedgerError, match="already exists"):
            import_seedfile(dst, d / "derived.seeds", "copy", key_fn=mix)
        with pytest.raises(SeedLedgerError, match="key_fn"):
            import_seedfile(dst, d / "derived.seeds", "other")
        assert [r.name for r in dst.list_runs()] == ["copy"]


def _as_version_1(header: dict) -> dict:
    """A version-2 header as version 1 wrote it: segments without a param_selection."""
    h = json.loads(json.dumps(header))
    for seg in h["segments"]:
        del seg["param_selection"]
    return h


def test_version_1_files_still_read(source, tmp_path):
    """Version 1 had one perturbation per file: its segments take the file's, and a
    segment naming another noise spec is refused as before."""
    led, d = source
    body = forged.body_of(d / "derived.seeds")
    (hlen,) = struct.unpack_from("<I", body)
    header = json.loads(body[4 : 4 + hlen])
    assert {(s["noise_spec"], s["param_selection"]) for s in header["segments"]} == {("v1", "all")}
    old = _as_version_1(header)
    hj = json.dumps(old).encode()
    p = tmp_path / "v1.seeds"
    p.write_bytes(forged.forge(struct.pack("<I", len(hj)) + hj + body[4 + hlen :], version=1))
    sf = read_seedfile(p, key_fn=mix)
    forged.same_steps(sf.steps, led.replay_history("kid"))
    assert {(s.noise_spec, s.param_selection) for s in sf.steps} == {("v1", "all")}
    old["segments"][-1]["noise_spec"] = "v2"
    hj = json.dumps(old).encode()
    p.write_bytes(forged.forge(struct.pack("<I", len(hj)) + hj + body[4 + hlen :], version=1))
    assert "noise spec differs" in forged.reject(p, p.read_bytes())


def test_segments_carry_their_own_perturbation(tmp_path):
    """A lineage whose fork changed kind exports one segment per kind (a generation may
    carry its own kind: an imported lineage), reads back with every step stamped with its
    segment's kind, and imports as one run whose generations keep theirs."""
    low, sel = "lowrank-v1:r=4", "suffix:q_proj"
    with Ledger.open(tmp_path / "src.db") as led:
        new_run(led, "low", run_key=3)
        fill(led, "low", 1, 2)
        led.create_run("full", replace(led.get_run("low").spec(), noise_spec="v1", param_selection="all"),
                       parent=("low", 2))
        with led.engine.begin() as conn:  # `low` is low-rank (created full, to use the kit)
            conn.exec_driver_sql(f"UPDATE runs SET noise_spec='{low}', param_selection='{sel}' WHERE name='low'")
        ledgerforge.rechain(tmp_path / "src.db")  # as if made so: the chain matches the kind
        fill(led, "full", 3, 4)
        export_seedfile(led, "full", None, tmp_path / "f.seeds", key_fn=mix)
        want = [(s.run, s.index, s.noise_spec, s.param_selection) for s in led.replay_history("full")]
    assert want == [("low", 1, low, sel), ("low", 2, low, sel), ("full", 3, "v1", "all"), ("full", 4, "v1", "all")]
    sf = read_seedfile(tmp_path / "f.seeds", key_fn=mix)
    assert sf.header["segments"][0]["param_selection"] == sel and sf.header["noise_spec"] == "v1"
    assert [(s.run, s.index, s.noise_spec, s.param_selection) for s in sf.steps] == want
    with Ledger.open(tmp_path / "dst.db") as dst:
        import_seedfile(dst, tmp_path / "f.seeds", "copy", key_fn=mix)
        got = [(s.index, s.noise_spec, s.param_selection) for s in dst.replay_history("copy")]
        assert got == [w[1:] for w in want]
        assert [(r.noise_spec, r.param_selection) for r in dst.records("copy")] == [(low, sel)] * 2 + [(None, None)] * 2
        export_seedfile(dst, "copy", None, tmp_path / "again.seeds", key_fn=mix)  # and back out
    again = read_seedfile(tmp_path / "again.seeds", key_fn=mix)
    assert [(s.noise_spec, s.param_selection) for s in again.steps] == [w[2:] for w in want]
    assert [(x["first"], x["last"]) for x in again.header["segments"]] == [(1, 2), (3, 4)]


def test_nothing_written_on_bad_file(source, tmp_path, ledger_url):
    _led, d = source
    data = (d / "derived.seeds").read_bytes()
    bad = tmp_path / "bad.seeds"
    bad.write_bytes(data[:-5])
    with Ledger.open(ledger_url) as dst:
        with pytest.raises(SeedLedgerError):
            import_seedfile(dst, bad, key_fn=mix)
        assert dst.list_runs() == [] and dst.events() == []


def test_export_refuses_what_read_would_refuse(source, tmp_path, monkeypatch):
    led, _d = source
    monkeypatch.setattr(seedfile, "MAX_POPULATION", 3)
    with pytest.raises(SeedLedgerError, match="population of 4, more than 3"):
        export_seedfile(led, "kid", None, tmp_path / "x.seeds", key_fn=mix)
    assert list(tmp_path.iterdir()) == []


def test_export_fsyncs_the_file_then_its_directory(source, tmp_path, monkeypatch):
    """os.replace is atomic, but the new name is only durable once the directory is synced."""
    led, _d = source
    events: list[tuple] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"), is_dir))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    dest = tmp_path / "x.seeds"
    export_seedfile(led, "kid", None, dest, key_fn=mix)
    at = events.index(("replace", str(dest)))
    assert any(e[0] == "fsync" and not e[2] for e in events[:at])  # the data first
    assert ("fsync", str(tmp_path), True) in events[at + 1 :]  # then the directory entry
    assert read_seedfile(dest, key_fn=mix).generation == 5


def test_paper_scale_size(tmp_path):
    """500 generations x N=30: well under the 100 KB goal when keys are stored as indices."""
    led = Ledger.open(tmp_path / "big.db")
    rng = random.Random(0)
    recs = [record(g, 30, run_key=11, rng=rng) for g in range(1, 501)]
    led.import_run("p2", recs, base_model="tiny", noise_spec="v1", run_key=11)
    export_seedfile(led, "p2", None, tmp_path / "p.seeds", key_fn=mix)
    assert (tmp_path / "p.seeds").stat().st_size < 50_000
    forged.same_steps(read_seedfile(tmp_path / "p.seeds", key_fn=mix).steps, led.replay_history("p2"))
    led.close()


def test_member_files_name_one_member(source, tmp_path):
    """`RUN@G#M` exports the lineage to G-1 plus a `member` entry (format 3; a run's file
    stays format 2): the fork's first own generation, whose parent lies in its root, and a
    generation-1 member, whose lineage is empty."""
    led, d = source
    export_seedfile(led, "kid", 3, tmp_path / "m.seeds", key_fn=mix, member=1)
    sf = read_seedfile(tmp_path / "m.seeds", key_fn=mix)
    m = led.generation("kid", 3).members[1]
    want = seedfile.SeedMember(3, 1, m.key, m.sign, led.generation("kid", 3).sigma, "kid", "v1", "all")
    assert sf.member == want and sf.ref == "kid@3#1" and sf.generation == 2
    forged.same_steps(sf.steps, led.replay_history("kid", upto=2))
    assert sf.final_fingerprint == led.generation("root", 2).fingerprint
    version = lambda p: struct.unpack_from("<H", p.read_bytes(), len(MAGIC))[0]  # noqa: E731
    assert version(tmp_path / "m.seeds") == FORMAT_VERSION == 3
    assert version(d / "derived.seeds") == seedfile.PLAIN_VERSION == 2  # older readers take it
    assert read_seedfile(d / "derived.seeds", key_fn=mix).member is None
    export_seedfile(led, "root", 1, tmp_path / "first.seeds", key_fn=mix, member=0)
    first = read_seedfile(tmp_path / "first.seeds", key_fn=mix)
    assert first.steps == [] and first.member.generation == 1 and first.final_fingerprint is None
    with pytest.raises(SeedLedgerError, match="members 0..3, not 4"):
        export_seedfile(led, "kid", 3, tmp_path / "x.seeds", key_fn=mix, member=4)
    with pytest.raises(SeedLedgerError, match="no members"):
        export_seedfile(led, "kid", 0, tmp_path / "x.seeds", key_fn=mix, member=0)


@pytest.mark.parametrize("change, needle", [
    (lambda h: h["member"].update(generation=5) or h, "member generation"),
    (lambda h: h["member"].update(sign=2) or h, "member sign"),
    (lambda h: h["member"].update(key="-1") or h, "member key"),
    (lambda h: h["member"].update(sigma=float("inf")) or h, "member sigma"),
    (lambda h: h["member"].update(extra=1) or h, "unknown or missing"),
    (lambda h: h["member"].pop("run") and h, "unknown or missing"),
    (lambda h: h | {"member": [1]}, "bad member"),
])
def test_bad_member_entries_are_one_line(source, tmp_path, change, needle):
    led, _d = source
    export_seedfile(led, "kid", 4, tmp_path / "m.seeds", key_fn=mix, member=2)
    assert needle in forged.reject(tmp_path / "bad.seeds", forged.with_header(tmp_path / "m.seeds", change))


def test_member_entry_needs_format_3_and_import_refuses_it(source, dst, tmp_path):
    led, _d = source
    export_seedfile(led, "kid", 4, tmp_path / "m.seeds", key_fn=mix, member=2)
    body = forged.body_of(tmp_path / "m.seeds")
    assert "needs format 3" in forged.reject(tmp_path / "v2.seeds", forged.forge(body, version=2))
    before = forged.state(dst)
    with pytest.raises(SeedLedgerError, match=r"names one member \(kid@4#2\), not a run's history") as err:
        import_seedfile(dst, tmp_path / "m.seeds", key_fn=mix)
    assert "\n" not in str(err.value) and forged.state(dst) == before
