"""Seed files: lossless round trip, compact keys, and every corruption -> one-line error."""

from __future__ import annotations

import json
import random
import struct

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ledger_kit import bits, fill, mix, new_run, record

from ledger import Ledger, SeedLedgerError
from ledger.seedfile import (
    DIGEST_SIZE,
    FORMAT_VERSION,
    MAGIC,
    PREFIX,
    _digest,
    export_seedfile,
    import_seedfile,
    read_seedfile,
)


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


def test_round_trip_lossless(source, tmp_path):
    led, d = source
    sf = read_seedfile(d / "derived.seeds", key_fn=mix)
    assert sf.header["keys"] == "index-u16" and sf.header["coefficients"] == "f64"
    _same_steps(sf.steps, led.replay_history("kid"))
    assert sf.final_fingerprint == led.generation("kid", 5).fingerprint
    assert sf.base_fingerprint == "f" * 32 and sf.noise_spec == "v1"
    raw = read_seedfile(d / "raw.seeds")  # no key_fn needed for raw keys
    assert raw.header["keys"] == "raw-u64" and raw.header["coefficients"] == "f32hi20"
    _same_steps(raw.steps, led.replay_history("kid", 4))

    with Ledger.open(tmp_path / "dst.db") as dst:
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
    huge["generations"]["population"] = [1 << 20] * 5
    assert "array sizes" in _reject(p, with_header(huge))
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


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    field=st.sampled_from(
        [
            "run",
            "generation",
            "base",
            "noise_spec",
            "config",
            "seed",
            "run_key",
            "segments",
            "generations",
            "keys",
            "coefficients",
            "final_fingerprint",
            "format",
            "software",
        ]
    ),
    sub=st.sampled_from(
        ["population", "sigma", "lr", "schedule_step", "optimizers", "optimizer_of", "fingerprint"]
    ),
    value=json_values,
    nested=st.booleans(),
    tail=st.binary(max_size=64),
)
def test_hypothesis_headers(source, tmp_path, field, sub, value, nested, tail):
    """A valid file with one header field replaced (or a random body): reads or refuses cleanly."""
    _led, d = source
    body = _body(d / "derived.seeds")
    (hlen,) = struct.unpack_from("<I", body)
    header = json.loads(body[4 : 4 + hlen])
    if nested:
        header["generations"][sub] = value
    else:
        header[field] = value
    hj = json.dumps(header).encode()
    p = tmp_path / "h.seeds"
    for candidate in (
        struct.pack("<I", len(hj)) + hj + body[4 + hlen :],
        struct.pack("<I", len(hj)) + hj + tail,
    ):
        p.write_bytes(_forge(candidate))
        try:
            read_seedfile(p, key_fn=mix)
        except SeedLedgerError as exc:
            assert "\n" not in str(exc)


def test_nothing_written_on_bad_file(source, tmp_path):
    _led, d = source
    data = (d / "derived.seeds").read_bytes()
    bad = tmp_path / "bad.seeds"
    bad.write_bytes(data[:-5])
    with Ledger.open(tmp_path / "dst.db") as dst:
        with pytest.raises(SeedLedgerError):
            import_seedfile(dst, bad, key_fn=mix)
        assert dst.list_runs() == [] and dst.events() == []


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
