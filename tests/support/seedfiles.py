"""Seed files shared by tests/test_seedfile.py and tests/test_seedfile_hostile.py: a source
ledger with a fork and odd coefficients, an empty destination, and helpers that forge,
reject and import files."""

from __future__ import annotations

import json
import struct

import pytest
import zstandard
from test_ledger_kit import bits, fill, mix, new_run, record

from seedledger.ledger import Ledger, SeedLedgerError
from seedledger.ledger.seedfile import (
    DIGEST_SIZE,
    FORMAT_VERSION,
    MAGIC,
    PREFIX,
    _digest,
    read_seedfile,
)
from seedledger.ledger.seedio import export_seedfile, import_seedfile


def source_ledger(tmp_path_factory):
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


def empty_ledger(tmp_path_factory):
    """An empty destination ledger."""
    led = Ledger.open(tmp_path_factory.mktemp("dst") / "dst.db")
    yield led
    led.close()


def same_steps(a, b):
    assert [(s.run, s.index, s.keys, s.sigma, s.optimizer) for s in a] == [
        (s.run, s.index, s.keys, s.sigma, s.optimizer) for s in b
    ]
    assert [[bits(c) for c in s.coefficients] for s in a] == [
        [bits(c) for c in s.coefficients] for s in b
    ]


def reject(path, data: bytes, key_fn=mix) -> str:
    path.write_bytes(data)
    with pytest.raises(SeedLedgerError) as err:
        read_seedfile(path, key_fn=key_fn)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def forge(body: bytes, *, version=FORMAT_VERSION, rawlen=None, z=None) -> bytes:
    """A file with a valid checksum around any body (what a tamperer could write)."""
    z = zstandard.ZstdCompressor().compress(body) if z is None else z
    head = PREFIX.pack(MAGIC, version, 0, len(z), len(body) if rawlen is None else rawlen)
    return head + z + _digest(head + z)


def body_of(path) -> bytes:
    data = path.read_bytes()
    return zstandard.ZstdDecompressor().decompress(data[PREFIX.size : -DIGEST_SIZE])


def state(led) -> tuple:
    with led.engine.connect() as conn:
        return tuple(
            conn.exec_driver_sql(f"SELECT count(*) FROM {t}").scalar()
            for t in ("runs", "generations", "members", "events")
        )


def import_or_refuse(led, path) -> None:
    """import_seedfile either succeeds (the run is then deleted again) or raises one-line
    SeedLedgerError having written nothing; any other exception fails the test."""
    before = state(led)
    try:
        info = import_seedfile(led, path, key_fn=mix)
    except SeedLedgerError as exc:
        assert "\n" not in str(exc)
        assert state(led) == before
    else:
        steps = led.replay_history(info.name)  # what the file said, as replay will read it
        assert [s.index for s in steps] == list(range(1, led.latest_generation(info.name) + 1))
        assert all(len(s.keys) == len(s.coefficients) for s in steps)
        led.delete_run(info.name)


def with_header(path, change) -> bytes:
    """`path`'s file with its header JSON passed through `change`, resealed (a tamperer)."""
    body = body_of(path)
    (hlen,) = struct.unpack_from("<I", body)
    h = change(json.loads(body[4 : 4 + hlen]))
    hj = json.dumps(h).encode()
    version = struct.unpack_from("<H", path.read_bytes(), len(MAGIC))[0]
    return forge(struct.pack("<I", len(hj)) + hj + body[4 + hlen :], version=version)
