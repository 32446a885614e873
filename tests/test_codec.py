"""One generation record and its encodings (issue 47 item 6). A generation is a
GenerationRecord; in the ledger it is one row that the hash chain hashes as stored;
outside, it is split between the seed file (what replay needs) and its history file (the
audit), and `import` joins the two halves again (historyfile.join). records.SEED_FILE,
HISTORY_FILE and LEDGER_ONLY say where each field goes. Golden files exported before that
change (tests/data/golden/, made by `golden_lineage` + `export_golden`) still read, and an
export of the same lineage today writes the same bodies."""

from __future__ import annotations

import contextlib
import itertools
import json
import struct
from collections.abc import Iterator
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import zstandard
from test_ledger_kit import mix, record

from seedledger.ledger import Ledger, SeedLedgerError, chain, codec, lease, rows, runs, seedfile
from seedledger.ledger.historyfile import HISTORY, VERSION, GenerationHistory, _checksum, read_history
from seedledger.ledger.records import (
    HISTORY_FILE,
    LEDGER_ONLY,
    SEED_FILE,
    GenerationRecord,
    MemberRecord,
)
from seedledger.ledger.seedfile import DIGEST_SIZE, PREFIX, read_seedfile
from seedledger.ledger.seedio import export_seedfile, import_seedfile
from seedledger.ledger.sessions import digest as inputs_digest

GOLDEN = Path(__file__).parent / "data" / "golden"
FILES = ("kid.seeds", "kid.seeds.history", "raw.seeds", "member.seeds")  # v2 derived keys, its history, v2 raw, v3


@contextlib.contextmanager
def fixed_clocks() -> Iterator[None]:
    """Every time the ledger and the exporter read, from a fixed start (a microsecond per read)."""
    tick = itertools.count()

    def now() -> datetime:
        return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(microseconds=next(tick))

    class Fixed(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
            return datetime(2026, 1, 1, tzinfo=UTC)

    saved = rows.now, runs.now, lease.now, seedfile.datetime
    rows.now = runs.now = lease.now = now  # type: ignore[assignment]
    seedfile.datetime = Fixed  # type: ignore[misc]
    try:
        yield
    finally:
        rows.now, runs.now, lease.now, seedfile.datetime = saved  # type: ignore[misc]


def golden_lineage(path: Path) -> Ledger:
    """root@1..4 (v1, all) -> fork kid@5..6 at root@4 (lowrank-r2, attn), N=6: a NaN reward
    at root@2, raw f64 coefficients at root@3, row scores and samples at kid@6; two events."""
    led = Ledger.open(path)
    spec = dict(base_model="tiny", base_revision="r1", base_fingerprint="f" * 32, dtype_policy="fp32-master",
                config={"population": 6, "sigma": 1e-3}, seed=0, software={"python": "3.12"}, host="golden")
    led.create_run("root", noise_spec="v1", param_selection="all", run_key=7, **spec)
    for g in range(1, 5):
        r = record(g, 6, coefficients=[0.0, -0.0, 5e-324, 1.0000000000000002, 0.1, -0.3] if g == 3 else None)
        if g == 2:
            r.members[1].reward = float("nan")
        led.commit_generation("root", r)
    led.log_event("root", "evaluation", {"generation": 4, "score": 0.5})
    led.create_run("kid", noise_spec="lowrank-r2", param_selection="attn", run_key=(1 << 64) - 3,
                   parent=("root", 4), **spec)
    led.commit_generation("kid", record(5, 6, run_key=(1 << 64) - 3))
    last = record(6, 6, run_key=(1 << 64) - 3, samples=True)
    for m in last.members:
        m.row_scores = [0.25, 0.5, 1.0, 0.0]
    led.commit_generation("kid", last)
    led.log_event("kid", "resume", {"from_generation": 5})
    return led


def export_golden(led: Ledger, out: Path) -> None:
    """The golden files of `golden_lineage`, written to `out`."""
    export_seedfile(led, "kid", None, out / "kid.seeds", key_fn=mix, history=out / "kid.seeds.history")
    export_seedfile(led, "root", 3, out / "raw.seeds")
    export_seedfile(led, "kid", 6, out / "member.seeds", key_fn=mix, member=1)


def _digests(led: Ledger, upto: int) -> list[tuple[str, str]]:
    """(digest, the digest it links to) of kid@1..upto's lineage, as the sender stores them."""
    return [(e["digest"], e["link"]) for e in led.chain_links("kid", upto)]


def _body(data: bytes) -> bytes:
    return zstandard.ZstdDecompressor().decompress(data[PREFIX.size : -DIGEST_SIZE])


def _exact(value: Any) -> str:
    """A value compared bit for bit: repr keeps -0.0, NaN and the last bit of a float."""
    return repr(value)


def _half(r: GenerationRecord, names: tuple[str, ...]) -> dict[str, str]:
    """The fields `names` of record `r` (members' as "members.X"), exactly."""
    out = {}
    for n in names:
        if n.startswith("members."):
            out[n] = _exact([getattr(m, n.removeprefix("members.")) for m in r.members])
        else:
            out[n] = _exact(getattr(r, n))
    return out


@pytest.fixture
def lineage(tmp_path: Path) -> Iterator[tuple[Ledger, Path]]:
    with fixed_clocks():
        led = golden_lineage(tmp_path / "src.db")
        export_golden(led, tmp_path)
    yield led, tmp_path
    led.close()


def test_every_field_of_a_generation_has_one_place():
    """A field added to either record must be given to the seed file, the history file or
    the ledger alone, or export would leave it behind unnoticed."""
    record_fields = {f.name for f in fields(GenerationRecord)} - {"members"}
    member_fields = {f"members.{f.name}" for f in fields(MemberRecord)}
    places = [*SEED_FILE, *HISTORY_FILE, *LEDGER_ONLY]
    assert len(places) == len(set(places)) and set(places) == record_fields | member_fields
    history = {f.name for f in fields(GenerationHistory)}  # the history file's half, plus the index
    assert history == {"index", "rewards", "components", *(n for n in HISTORY_FILE if "." not in n)}


def test_the_chain_hashes_the_row_as_the_ledger_stores_it():
    """The row (ledger.rows) is the one encoding inside the ledger: the chain's fields are
    its columns (inputs_digest: set at commit), so the digest covers every stored column."""
    r = record(1, 4, samples=True)
    for m in r.members:
        m.row_scores = [1.0, 0.0, 0.5, 0.25]
    grow, members = rows.generation_row(1, r), rows.member_rows(1, r)
    hashed = set(chain.GENERATION_FIELDS) | set(chain.OPTIONAL_GENERATION_FIELDS)
    assert hashed == set(grow) - {"run_id"} | {"inputs_digest"}
    assert all(set(m) - {"generation_id"} == set(chain.MEMBER_FIELDS) for m in members)


def test_export_then_import_gives_each_half_back_exactly(lineage, tmp_path):
    """Seed file + history file -> the source's records: every SEED_FILE and HISTORY_FILE
    field bit for bit (the kind as replay applies it), LEDGER_ONLY left behind."""
    led, d = lineage
    with Ledger.open(tmp_path / "dst.db") as dst:
        import_seedfile(dst, d / "kid.seeds", "imp", key_fn=mix)
        sent, got = led.records("kid"), dst.records("imp")
        assert dst.check_chain("imp")[1] == 6
        kinds = lambda ledger, run: [(s.index, s.noise_spec, s.param_selection) for s in ledger.replay_history(run)]  # noqa: E731
        assert kinds(dst, "imp") == kinds(led, "kid")
        kind = ("noise_spec", "param_selection")
        for a, b in zip(sent, got, strict=True):
            b.extra = {k: v for k, v in b.extra.items() if k not in ("imported_from", "source_run")}
            same = tuple(n for n in (*SEED_FILE, *HISTORY_FILE) if n not in kind)
            assert _half(a, same) == _half(b, same)
            assert all(m.samples is None and m.row_scores is None for m in b.members)
        assert any(m.samples for m in led.generation("kid", 6).members)  # there was something to leave behind


@pytest.mark.parametrize("name", FILES)
def test_golden_files_read_and_an_export_today_writes_the_same_body(lineage, name):
    """Files written before the record codec was unified: read today, they give the
    source's replay data bit for bit; exported today, the same bodies (the zstd frame may
    differ across zstd versions, the format does not)."""
    led, d = lineage
    golden = (GOLDEN / name).read_bytes()
    if name.endswith(".history"):  # it names its seed file by digest, which covers the zstd frame
        old, new = (read_seedfile(p / "kid.seeds", key_fn=mix).digest for p in (GOLDEN, d))
        today = json.loads(_body((d / name).read_bytes()))
        assert today.pop("chain")[:5] == [{"digest": D, "link": L, "inputs_digest": None, "row_scores": None}
                                          for D, L in _digests(led, 5)]  # kid@6 kept samples: null
        assert codec.dumps(today).encode().replace(new.encode(), old.encode()) == _body(golden)  # format 1 + chain
        sf = read_seedfile(GOLDEN / "kid.seeds", key_fn=mix)
        v1 = read_history(GOLDEN / name, sf)
        assert v1.digest == golden[-DIGEST_SIZE:].hex() and (v1.chain, v1.checked, v1.head) == (None, 0, None)
        return
    assert _body((d / name).read_bytes()) == _body(golden)
    old, new = read_seedfile(GOLDEN / name, key_fn=mix), read_seedfile(d / name, key_fn=mix)
    assert old.digest == golden[-DIGEST_SIZE:].hex() and old.member == new.member
    bits = lambda sf: [(s.run, s.index, s.keys, s.sigma, s.noise_spec, s.param_selection,  # noqa: E731
                        struct.pack(f"<{len(s.coefficients)}d", *s.coefficients)) for s in sf.steps]
    assert bits(old) == bits(new)
    assert (old.signs, old.fingerprints, old.lrs, old.schedule_steps) == (
        new.signs, new.fingerprints, new.lrs, new.schedule_steps)


def test_a_history_is_checked_against_its_senders_chain(lineage, tmp_path):
    """Format 2: each generation the sender trained hashes, joined from the two files, to
    its row's digest in the sender's chain (the inputs digest and row scores it binds
    travel beside it); the last is what `verify --quick` prints. One kept samples: not
    carried. An edited generation, or one that does not link to the one before it, is
    refused; a re-exported import carries none (its rows bind the import's marks)."""
    led, d = lineage
    inputs = {"from_generation": 6, "session": "resume", "files": {"a.jsonl": "0" * 64}, "tokenizer": {},
              "chat_template": None, "libraries": {"torch": "2"}, "sandbox": {}}
    led.log_event("kid", "inputs", inputs | {"digest": inputs_digest(inputs)})
    seven = record(7, 6, run_key=(1 << 64) - 3)
    for m in seven.members:
        m.row_scores = [0.5, 1.0, 0.0, 0.25]
    led.commit_generation("kid", seven)
    export_seedfile(led, "kid", None, tmp_path / "7.seeds", key_fn=mix, history=tmp_path / "7.seeds.history")
    sf = read_seedfile(tmp_path / "7.seeds", key_fn=mix)
    h = read_history(tmp_path / "7.seeds.history", sf)
    head = led.check_chain("kid", 7)[0]
    assert (h.checked, h.head) == (6, head) and h.chain is not None and h.chain[5] is None
    assert h.chain[6].inputs_digest is not None and h.chain[6].row_scores is not None
    with Ledger.open(tmp_path / "dst.db") as dst:
        import_seedfile(dst, tmp_path / "7.seeds", "imp", key_fn=mix)
        event = next(e for e in dst.events("imp") if e.kind == "import")
        assert event.payload["history"]["chain"] == {"checked": 6, "digest": head}
        export_seedfile(dst, "imp", None, tmp_path / "again.seeds", key_fn=mix, history=tmp_path / "again.history")
        again = read_history(tmp_path / "again.history", read_seedfile(tmp_path / "again.seeds", key_fn=mix))
        assert again.chain == [None] * 7 and (again.checked, again.head) == (0, None)

    def refused(edit) -> str:
        """The history with `edit` applied to its document, sealed again for its seed file."""
        doc = json.loads(_body((tmp_path / "7.seeds.history").read_bytes()))
        edit(doc)
        seal = lambda blob: _checksum(bytes.fromhex(sf.digest), blob)  # noqa: E731
        (tmp_path / "f.history").write_bytes(HISTORY.frame(VERSION, json.dumps(doc).encode(), 3, seal))
        with pytest.raises(SeedLedgerError) as err:
            read_history(tmp_path / "f.history", sf)
        return str(err.value)

    assert "generation 2 is not the row its sender's chain hashed" in refused(
        lambda doc: doc["generations"][1]["rewards"].__setitem__(0, 0.125))
    assert "generation 7 is not the row" in refused(lambda doc: doc["chain"][6].update(row_scores=None))
    assert "generation 3 does not link to generation 2" in refused(lambda doc: doc["chain"][2].update(link="0" * 64))
    assert "bad digest of generation 1" in refused(lambda doc: doc["chain"][0].update(digest="X"))
