"""Seed files: lossless round trip, compact keys, and every corruption -> one-line error."""

from __future__ import annotations

import json
import os
import random
import stat
import struct
import tracemalloc
from dataclasses import replace

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ledger_kit import bits, fill, mix, new_run, record

from seedledger.ledger import Ledger, SeedLedgerError, seedfile
from seedledger.ledger.seedfile import (
    DIGEST_SIZE,
    FORMAT_VERSION,
    MAGIC,
    MAX_POPULATION,
    PREFIX,
    _digest,
    read_seedfile,
)
from seedledger.ledger.seedio import export_seedfile, import_seedfile
from tests.support import ledgerforge


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """root@1..3 -> fork kid@4..5 with odd coefficients; a small file of each kind."""
    d = tmp_path_factory.mktemp("seeds")
    led = Ledger.open(d / "src.db")
    new_run(led, "root", run_key=7)
    fill(led, "root", 1, 3)
    new_run(led, "kid", parent=("root", 2), run_key=(1 << 64) - 3)
    fill(led, "kid", 3, 4, run_key=(1 << 64) - 3)
    odd = [0.0, -0.0, 5e-324, 1.0000000000000002]
    led.commit_generation("kid", record(5, 4, run_key=(1 << 64) - 3, coefficients=odd))
    export_seedfile(led, "kid", None, d / "derived.seeds", key_fn=mix)
    export_seedfile(led, "kid", 4, d / "raw.seeds")
    yield led, d
    led.close()


def _same_steps(a, b):
    assert [(s.run, s.index, s.keys, s.sigma, s.optimizer) for s in a] == [
        (s.run, s.index, s.keys, s.sigma, s.optimizer) for s in b
    ]
    assert [[bits(c) for c in s.coefficients] for s in a] == [
        [bits(c) for c in s.coefficients] for s in b
    ]


def test_round_trip_lossless(source, ledger_url):
    led, d = source
    sf = read_seedfile(d / "derived.seeds", key_fn=mix)
    assert sf.header["keys"] == "index-u16" and sf.header["coefficients"] == "f64"
    _same_steps(sf.steps, led.replay_history("kid"))
    assert sf.final_fingerprint == led.generation("kid", 5).fingerprint
    assert sf.base_fingerprint == "f" * 32 and sf.noise_spec == "v1"
    raw = read_seedfile(d / "raw.seeds")  # no key_fn needed for raw keys
    assert raw.header["keys"] == "raw-u64" and raw.header["coefficients"] == "f32hi20"
    _same_steps(raw.steps, led.replay_history("kid", 4))

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


def _reject(path, data: bytes, key_fn=mix) -> str:
    path.write_bytes(data)
    with pytest.raises(SeedLedgerError) as err:
        read_seedfile(path, key_fn=key_fn)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_truncation_at_every_offset(source, tmp_path):
    _led, d = source
    data = (d / "derived.seeds").read_bytes()
    assert len(data) < 4000
    for cut in range(len(data)):
        _reject(tmp_path / "t.seeds", data[:cut])
    _reject(tmp_path / "t.seeds", data + b"\0")


def test_random_bit_flips(source, tmp_path):
    _led, d = source
    data = (d / "derived.seeds").read_bytes()
    rng = random.Random(3)
    for _ in range(300):
        pos = rng.randrange(len(data))
        flipped = bytearray(data)
        flipped[pos] ^= 1 << rng.randrange(8)
        _reject(tmp_path / "f.seeds", bytes(flipped))


def _forge(body: bytes, *, version=FORMAT_VERSION, rawlen=None, z=None) -> bytes:
    """A file with a valid checksum around any body (what a tamperer could write)."""
    z = zstandard.ZstdCompressor().compress(body) if z is None else z
    head = PREFIX.pack(MAGIC, version, 0, len(z), len(body) if rawlen is None else rawlen)
    return head + z + _digest(head + z)


def _body(path) -> bytes:
    data = path.read_bytes()
    return zstandard.ZstdDecompressor().decompress(data[PREFIX.size : -DIGEST_SIZE])


def test_header_fields_and_limits(source, tmp_path):
    _led, d = source
    p = tmp_path / "x.seeds"
    data = (d / "derived.seeds").read_bytes()
    assert "bad magic" in _reject(p, b"PK\x03\x04" + data[4:])
    assert "newer than this seedledger" in _reject(
        p, _forge(_body(d / "derived.seeds"), version=99)
    )
    assert "checksum" in _reject(p, data[:-1] + bytes([data[-1] ^ 1]))
    assert "out of bounds" in _reject(p, _forge(b"abcd", rawlen=1 << 62))
    # a zstd bomb that lies about its size: reading stops at the declared length
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (8 << 20))
    assert "differs" in _reject(p, _forge(b"", rawlen=100, z=bomb))
    body = _body(d / "derived.seeds")
    (hlen,) = struct.unpack_from("<I", body)
    header = json.loads(body[4 : 4 + hlen])
    arrays = body[4 + hlen :]

    def with_header(h, tail=arrays):
        hj = json.dumps(h).encode()
        return _forge(struct.pack("<I", len(hj)) + hj + tail)

    huge = json.loads(json.dumps(header))
    huge["generations"]["population"] = [MAX_POPULATION + 1] * 5
    assert "bad population (at most 65536)" in _reject(p, with_header(huge))
    huge["generations"]["population"] = [MAX_POPULATION] * 5
    assert "array sizes" in _reject(p, with_header(huge))
    many_members = _bomb_header(header, 40, MAX_POPULATION)  # 2.6M > MAX_MEMBERS
    assert "more than 2097152" in _reject(p, with_header(many_members, b""))
    many = dict(header, generation=10**12)
    assert "bad generation" in _reject(p, with_header(many))
    assert "header length" in _reject(p, _forge(struct.pack("<I", 1 << 31) + b"{}"))
    assert "array sizes" in _reject(p, with_header(header, arrays[:-1]))
    assert "bad header" in _reject(p, with_header([1, 2]))
    bad_idx = bytearray(arrays)
    m = sum(header["generations"]["population"])
    bad_idx[m] = 200  # first key index (low byte plane) far beyond the population
    assert "index out of range" in _reject(p, with_header(header, bytes(bad_idx)))
    p.write_bytes(with_header(header))
    assert read_seedfile(p, key_fn=mix).generation == 5  # the forgery kit itself is sound


def _bomb_header(header: dict, gens: int, population: int) -> dict:
    """The valid header grown to `gens` generations of `population` members each."""
    h = json.loads(json.dumps(header))
    seg = dict(h["segments"][-1], first=1, last=gens)
    h.update(generation=gens, segments=[seg], final_fingerprint=None)
    h["keys"] = "index-u16" if population <= 1 << 16 else "index-u32"
    h["coefficients"] = "f32hi20"
    g = h["generations"]
    g.update(
        population=[population] * gens,
        sigma=[1e-3] * gens,
        lr=[5e-4] * gens,
        schedule_step=list(range(gens)),
        optimizer_of=[0] * gens,
        fingerprint=[None] * gens,
    )
    return h


def _stream_forge(header: dict) -> bytes:
    """A checksummed file with real, consistent arrays (signs +1, key index 0, zero
    coefficients) for every declared member, compressed as a stream: the body, hundreds
    of MB for a bomb, is never held in memory here."""
    hj = json.dumps(header).encode()
    m = sum(header["generations"]["population"])
    kw = 2 if header["keys"] == "index-u16" else 4
    comp = zstandard.ZstdCompressor(level=1).compressobj()
    out = [comp.compress(struct.pack("<I", len(hj)) + hj)]
    rawlen = 4 + len(hj)
    mb = 1 << 20
    for byte, total in ((b"\x01", m), (b"\x00", m * kw), (b"\x00", m * 3)):
        while total:
            n = min(mb, total)
            out.append(comp.compress(byte * n))
            rawlen += n
            total -= n
    out.append(comp.flush())
    z = b"".join(out)
    head = PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(z), rawlen)
    return head + z + _digest(head + z)


@pytest.mark.parametrize(
    ("gens", "population", "needle"),
    [
        (40, 1 << 20, "declared body size"),  # the review's file: 320 MB in ~15 KB
        (32, 1 << 16, "compressed bytes"),  # 12.6 MB, within MAX_BODY: the ratio bound
    ],
)
def test_decompression_bomb_refused_before_any_list(source, tmp_path, gens, population, needle):
    """A correctly checksummed file declaring millions of members (consistent arrays, so
    the old limits accepted it after 15 s and 4.3 GB) is refused from its sizes alone."""
    _led, d = source
    body = _body(d / "derived.seeds")
    (hlen,) = struct.unpack_from("<I", body)
    data = _stream_forge(_bomb_header(json.loads(body[4 : 4 + hlen]), gens, population))
    assert len(data) < 64_000
    p = tmp_path / "bomb.seeds"
    tracemalloc.start()
    try:
        msg = _reject(p, data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert needle in msg and "out of bounds" in msg
    assert peak < 4 << 20, peak  # no per-member Python lists, no full decompression
    with Ledger.open(tmp_path / "dst.db") as dst:
        with pytest.raises(SeedLedgerError):
            import_seedfile(dst, p, key_fn=mix)
        assert dst.list_runs() == []


def test_largest_legal_population_reads(source, tmp_path):
    """The limits leave real runs alone: one generation of 65,536 members reads back."""
    _led, d = source
    body = _body(d / "derived.seeds")
    (hlen,) = struct.unpack_from("<I", body)
    h = _bomb_header(json.loads(body[4 : 4 + hlen]), 1, MAX_POPULATION)
    p = tmp_path / "wide.seeds"
    p.write_bytes(_stream_forge(h))
    sf = read_seedfile(p, key_fn=mix)
    rk = int(h["segments"][0]["run_key"])
    assert len(sf.steps[0].keys) == MAX_POPULATION and set(sf.steps[0].keys) == {mix(rk, 1, 0)}
    assert set(sf.signs[0]) == {1} and set(sf.steps[0].coefficients) == {0.0}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
# values that parse as JSON but that SQL columns cannot hold (or that lie about types)
edge_values = st.sampled_from(
    [2**63, 2**70, -(2**63) - 1, 2**31, True, False, 1e300, "", "\x00", "\ud800", "a" * 300,
     "v2", "18446744073709551616", "\u0661", 0, -1, 1.5]
)  # fmt: skip
PLACES = {
    "top": [
        "run", "generation", "base", "noise_spec", "dtype_policy", "param_selection", "config",
        "seed", "run_key", "segments", "generations", "keys", "coefficients",
        "final_fingerprint", "format", "software",
    ],
    "generations": [
        "population", "sigma", "lr", "schedule_step", "optimizers", "optimizer_of",
        "fingerprint",
    ],
    "base": ["model", "revision", "fingerprint"],
    "segment": ["run", "first", "last", "run_key", "noise_spec", "param_selection"],
}  # fmt: skip


@pytest.fixture(scope="module")
def dst(tmp_path_factory):
    led = Ledger.open(tmp_path_factory.mktemp("dst") / "dst.db")
    yield led
    led.close()


def _state(led) -> tuple:
    with led.engine.connect() as conn:
        return tuple(
            conn.exec_driver_sql(f"SELECT count(*) FROM {t}").scalar()
            for t in ("runs", "generations", "members", "events")
        )


def _import_or_refuse(led, path) -> None:
    """import_seedfile either succeeds (the run is then deleted again) or raises one-line
    SeedLedgerError having written nothing; any other exception fails the test."""
    before = _state(led)
    try:
        info = import_seedfile(led, path, key_fn=mix)
    except SeedLedgerError as exc:
        assert "\n" not in str(exc)
        assert _state(led) == before
    else:
        steps = led.replay_history(info.name)  # what the file said, as replay will read it
        assert [s.index for s in steps] == list(range(1, led.latest_generation(info.name) + 1))
        assert all(len(s.keys) == len(s.coefficients) for s in steps)
        led.delete_run(info.name)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    where=st.sampled_from(sorted(PLACES)),
    pick=st.integers(0, 100),
    value=json_values | edge_values,
    tail=st.binary(max_size=64),
)
def test_hypothesis_headers(source, dst, tmp_path, where, pick, value, tail):
    """A valid file with one header field replaced (or a random body), imported into a real
    SQLite ledger: it imports, or it is refused with one line and nothing written."""
    _led, d = source
    body = _body(d / "derived.seeds")
    (hlen,) = struct.unpack_from("<I", body)
    header = json.loads(body[4 : 4 + hlen])
    name = PLACES[where][pick % len(PLACES[where])]
    target = {
        "top": header,
        "generations": header["generations"],
        "base": header["base"],
        "segment": header["segments"][-1],
    }[where]
    target[name] = value
    hj = json.dumps(header).encode()
    p = tmp_path / "h.seeds"
    for candidate in (
        struct.pack("<I", len(hj)) + hj + body[4 + hlen :],
        struct.pack("<I", len(hj)) + hj + tail,
    ):
        p.write_bytes(_forge(candidate))
        _import_or_refuse(dst, p)


@pytest.mark.parametrize(
    ("where", "name", "value", "needle"),
    [
        ("top", "seed", 2**70, "bad seed"),  # was a raw OverflowError from the DB write
        ("top", "seed", True, "bad seed"),
        ("top", "generation", True, "bad generation"),
        ("top", "run_key", "\u0661", "bad run key"),  # an Arabic-Indic digit
        ("top", "noise_spec", "v" * 40, "bad noise_spec"),
        ("top", "run", "\ud800", "bad run name"),
        ("top", "final_fingerprint", "0" * 32, "final fingerprint differs"),
        ("segment", "noise_spec", "v" * 40, "bad segment noise_spec"),
        ("segment", "param_selection", None, "bad segment param_selection"),
        ("base", "fingerprint", "f" * 65, "bad base fingerprint"),
        ("generations", "sigma", [float("nan")] * 5, "bad sigma"),
        ("generations", "lr", [1e400] * 5, "bad lr"),
        ("generations", "lr", [True] * 5, "bad lr"),
        ("generations", "schedule_step", [2**40] * 5, "bad schedule step"),
        ("generations", "population", [True] * 5, "bad population"),
        ("generations", "fingerprint", ["\x00"] * 5, "bad fingerprint"),
    ],
)
def test_header_values_the_ledger_cannot_hold(source, tmp_path, where, name, value, needle):
    _led, d = source
    body = _body(d / "derived.seeds")
    (hlen,) = struct.unpack_from("<I", body)
    header = json.loads(body[4 : 4 + hlen])
    {
        "top": header,
        "generations": header["generations"],
        "base": header["base"],
        "segment": header["segments"][-1],
    }[where][name] = value
    hj = json.dumps(header).encode()
    p = tmp_path / "v.seeds"
    p.write_bytes(_forge(struct.pack("<I", len(hj)) + hj + body[4 + hlen :]))
    assert needle in _reject(p, p.read_bytes())
    with Ledger.open(tmp_path / "dst.db") as led:
        with pytest.raises(SeedLedgerError, match=needle):
            import_seedfile(led, p, key_fn=mix)
        assert led.list_runs() == [] and led.events() == []


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
    body = _body(d / "derived.seeds")
    (hlen,) = struct.unpack_from("<I", body)
    header = json.loads(body[4 : 4 + hlen])
    assert {(s["noise_spec"], s["param_selection"]) for s in header["segments"]} == {("v1", "all")}
    old = _as_version_1(header)
    hj = json.dumps(old).encode()
    p = tmp_path / "v1.seeds"
    p.write_bytes(_forge(struct.pack("<I", len(hj)) + hj + body[4 + hlen :], version=1))
    sf = read_seedfile(p, key_fn=mix)
    _same_steps(sf.steps, led.replay_history("kid"))
    assert {(s.noise_spec, s.param_selection) for s in sf.steps} == {("v1", "all")}
    old["segments"][-1]["noise_spec"] = "v2"
    hj = json.dumps(old).encode()
    p.write_bytes(_forge(struct.pack("<I", len(hj)) + hj + body[4 + hlen :], version=1))
    assert "noise spec differs" in _reject(p, p.read_bytes())


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
    _same_steps(read_seedfile(tmp_path / "p.seeds", key_fn=mix).steps, led.replay_history("p2"))
    led.close()


def _with_header(path, change) -> bytes:
    """`path`'s file with its header JSON passed through `change`, resealed (a tamperer)."""
    body = _body(path)
    (hlen,) = struct.unpack_from("<I", body)
    h = change(json.loads(body[4 : 4 + hlen]))
    hj = json.dumps(h).encode()
    version = struct.unpack_from("<H", path.read_bytes(), len(MAGIC))[0]
    return _forge(struct.pack("<I", len(hj)) + hj + body[4 + hlen :], version=version)


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
    _same_steps(sf.steps, led.replay_history("kid", upto=2))
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
    assert needle in _reject(tmp_path / "bad.seeds", _with_header(tmp_path / "m.seeds", change))


def test_member_entry_needs_format_3_and_import_refuses_it(source, dst, tmp_path):
    led, _d = source
    export_seedfile(led, "kid", 4, tmp_path / "m.seeds", key_fn=mix, member=2)
    body = _body(tmp_path / "m.seeds")
    assert "needs format 3" in _reject(tmp_path / "v2.seeds", _forge(body, version=2))
    before = _state(dst)
    with pytest.raises(SeedLedgerError, match=r"names one member \(kid@4#2\), not a run's history") as err:
        import_seedfile(dst, tmp_path / "m.seeds", key_fn=mix)
    assert "\n" not in str(err.value) and _state(dst) == before
