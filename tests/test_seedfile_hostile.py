"""Seed files from a hostile sender: truncations, bit flips, forged headers, decompression
bombs and values the ledger cannot hold are each refused in one line, writing nothing."""

from __future__ import annotations

import json
import random
import struct
import tracemalloc

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ledger_kit import mix

from seedledger.ledger import Ledger, SeedLedgerError
from seedledger.ledger.seedfile import (
    FORMAT_VERSION,
    MAGIC,
    MAX_POPULATION,
    PREFIX,
    _digest,
    read_seedfile,
)
from seedledger.ledger.seedio import import_seedfile
from tests.support import seedfiles as forged


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    yield from forged.source_ledger(tmp_path_factory)


@pytest.fixture(scope="module")
def dst(tmp_path_factory):
    yield from forged.empty_ledger(tmp_path_factory)


def test_truncation_at_every_offset(source, tmp_path):
    _led, d = source
    data = (d / "derived.seeds").read_bytes()
    assert len(data) < 4000
    for cut in range(len(data)):
        forged.reject(tmp_path / "t.seeds", data[:cut])
    forged.reject(tmp_path / "t.seeds", data + b"\0")


def test_random_bit_flips(source, tmp_path):
    _led, d = source
    data = (d / "derived.seeds").read_bytes()
    rng = random.Random(3)
    for _ in range(300):
        pos = rng.randrange(len(data))
        flipped = bytearray(data)
        flipped[pos] ^= 1 << rng.randrange(8)
        forged.reject(tmp_path / "f.seeds", bytes(flipped))


def test_header_fields_and_limits(source, tmp_path):
    _led, d = source
    p = tmp_path / "x.seeds"
    data = (d / "derived.seeds").read_bytes()
    assert "bad magic" in forged.reject(p, b"PK\x03\x04" + data[4:])
    assert "newer than this seedledger" in forged.reject(
        p, forged.forge(forged.body_of(d / "derived.seeds"), version=99)
    )
    assert "checksum" in forged.reject(p, data[:-1] + bytes([data[-1] ^ 1]))
    assert "out of bounds" in forged.reject(p, forged.forge(b"abcd", rawlen=1 << 62))
    # a zstd bomb that lies about its size: reading stops at the declared length
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (8 << 20))
    assert "differs" in forged.reject(p, forged.forge(b"", rawlen=100, z=bomb))
    body = forged.body_of(d / "derived.seeds")
    (hlen,) = struct.unpack_from("<I", body)
    header = json.loads(body[4 : 4 + hlen])
    arrays = body[4 + hlen :]

    def with_header(h, tail=arrays):
        hj = json.dumps(h).encode()
        return forged.forge(struct.pack("<I", len(hj)) + hj + tail)

    huge = json.loads(json.dumps(header))
    huge["generations"]["population"] = [MAX_POPULATION + 1] * 5
    assert "bad population (at most 65536)" in forged.reject(p, with_header(huge))
    huge["generations"]["population"] = [MAX_POPULATION] * 5
    assert "array sizes" in forged.reject(p, with_header(huge))
    many_members = _bomb_header(header, 40, MAX_POPULATION)  # 2.6M > MAX_MEMBERS
    assert "more than 2097152" in forged.reject(p, with_header(many_members, b""))
    many = dict(header, generation=10**12)
    assert "bad generation" in forged.reject(p, with_header(many))
    assert "header length" in forged.reject(p, forged.forge(struct.pack("<I", 1 << 31) + b"{}"))
    assert "array sizes" in forged.reject(p, with_header(header, arrays[:-1]))
    assert "bad header" in forged.reject(p, with_header([1, 2]))
    bad_idx = bytearray(arrays)
    m = sum(header["generations"]["population"])
    bad_idx[m] = 200  # first key index (low byte plane) far beyond the population
    assert "index out of range" in forged.reject(p, with_header(header, bytes(bad_idx)))
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
    body = forged.body_of(d / "derived.seeds")
    (hlen,) = struct.unpack_from("<I", body)
    data = _stream_forge(_bomb_header(json.loads(body[4 : 4 + hlen]), gens, population))
    assert len(data) < 64_000
    p = tmp_path / "bomb.seeds"
    tracemalloc.start()
    try:
        msg = forged.reject(p, data)
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
    body = forged.body_of(d / "derived.seeds")
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
    body = forged.body_of(d / "derived.seeds")
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
        p.write_bytes(forged.forge(candidate))
        forged.import_or_refuse(dst, p)


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
    body = forged.body_of(d / "derived.seeds")
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
    p.write_bytes(forged.forge(struct.pack("<I", len(hj)) + hj + body[4 + hlen :]))
    assert needle in forged.reject(p, p.read_bytes())
    with Ledger.open(tmp_path / "dst.db") as led:
        with pytest.raises(SeedLedgerError, match=needle):
            import_seedfile(led, p, key_fn=mix)
        assert led.list_runs() == [] and led.events() == []
