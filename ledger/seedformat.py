"""The seed-file format's constants and parsed form, shared by its writer
(ledger.seedfile) and its reader (ledger.seedread), and the container a seed file and its
history file (ledger.historyfile) both are: one framing, one bounded reader, so a hostile
file of either kind is refused by the same checks. The layout and the limits are
described in ledger.seedfile's docstring."""

from __future__ import annotations

import hashlib
import io
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import zstandard

from seedledger.ledger.checks import Malformed, need
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.records import ReplayStep

MAGIC = b"SLSEEDS\x00"
FORMAT_VERSION = 3  # 3: an optional `member` entry (RUN@G#M); written only when there is one
PLAIN_VERSION = 2  # a file without a member: every segment names its own perturbation
READABLE_VERSIONS = (1, 2, 3)  # 1: one perturbation for the whole file
PREFIX = struct.Struct("<8sHHQQ")
DIGEST_SIZE = 32
MAX_POPULATION = 1 << 16  # members per generation (the paper: 30)
MAX_MEMBERS = 1 << 21  # members in all (e.g. 10,000 generations x 200)
MAX_GENERATIONS = 1 << 20
MAX_HEADER = 16 << 20  # header JSON (~70 bytes per generation)
MAX_MEMBER_BYTES = 1 + 8 + 8  # sign, raw key, f64 coefficient: the widest encoding
MAX_BODY = MAX_HEADER + 4 + MAX_MEMBERS * MAX_MEMBER_BYTES  # ~52 MB
MAX_FILE = MAX_BODY + (1 << 20)  # zstd never expands by more than a little
MAX_RATIO = 1024  # body size / compressed size (zstd reaches ~32,000x on a bomb)
RATIO_FLOOR = 8 << 20  # bodies up to this size may compress as well as they like
I32 = 1 << 31
# longest strings the SQL columns take (ledger.schema) / that a sane header holds
MAX_NAME = 200
MAX_FINGERPRINT = 64
MAX_NOISE_SPEC = 32
MAX_DTYPE_POLICY = 64
LEDGER_BYTES_PER_MEMBER = 70  # what an imported member costs a SQLite ledger, measured
MAX_INPUT_SESSIONS = 1 << 12  # sessions' input records a header may list

# Members an import takes without being asked (~18 MB of SQLite ledger, a few seconds):
# far more than a real run (500 generations x 30 = 15,000), far less than a file can
# declare (2,097,152 members, ~150 MB). `import --max-members N` raises it.
IMPORT_MAX_MEMBERS = 1 << 18


@dataclass(frozen=True)
class SeedMember:
    """Member `index` of generation `generation`, which a version-3 file names on top of
    its lineage (1..generation-1): `RUN@G-1` plus sign·σ·ε(key) in the perturbation kind
    (`noise_spec`, `param_selection`) of the run that recorded generation G (`run`)."""

    generation: int
    index: int
    key: int
    sign: int
    sigma: float
    run: str
    noise_spec: str
    param_selection: str

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "index": self.index, "key": str(self.key),
                "sign": self.sign, "sigma": self.sigma, "run": self.run,
                "noise_spec": self.noise_spec, "param_selection": self.param_selection}

    def step(self) -> ReplayStep:
        """Generation G's step as `replay.rebuild.apply_member` takes it: this member's key,
        σ and perturbation kind (the coefficient and optimizer are the member's to set)."""
        return ReplayStep(self.run, self.generation, [self.key], [0.0], self.sigma, {"name": "sgd"},
                          noise_spec=self.noise_spec, param_selection=self.param_selection)


@dataclass
class SeedFile:
    """A parsed seed file: the header and one ReplayStep per generation (oldest first)."""

    header: dict[str, Any]
    steps: list[ReplayStep]
    signs: list[list[int]]
    fingerprints: list[str | None]
    lrs: list[float]
    schedule_steps: list[int]
    digest: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    member: SeedMember | None = None  # version 3: the file names this member of generation+1

    @property
    def generation(self) -> int:
        """The last generation of the lineage (a member file: the member's parent)."""
        return self.header["generation"]

    @property
    def ref(self) -> str:
        """What the file names: `RUN@G`, or `RUN@G#M` for a member."""
        if self.member is None:
            return f"{self.header['run']}@{self.generation}"
        return f"{self.header['run']}@{self.member.generation}#{self.member.index}"

    @property
    def base_model(self) -> str:
        return self.header["base"]["model"]

    @property
    def base_revision(self) -> str | None:
        return self.header["base"]["revision"]

    @property
    def base_fingerprint(self) -> str | None:
        return self.header["base"]["fingerprint"]

    @property
    def base_provenance(self) -> dict[str, Any] | None:
        """What the base model is (engine.runtime.models.provenance), when the file says."""
        return self.header["base"].get("provenance")

    @property
    def inputs(self) -> list[dict[str, Any]]:
        """The lineage's sessions' input fingerprints (ledger.provenance), oldest first."""
        return self.header.get("inputs") or []

    @property
    def noise_spec(self) -> str:
        return self.header["noise_spec"]

    @property
    def final_fingerprint(self) -> str | None:
        return self.header["final_fingerprint"]


def _digest(data: bytes | memoryview) -> bytes:
    return hashlib.blake2b(data, digest_size=DIGEST_SIZE).digest()


def _ratio_ok(rawlen: int, zlen: int) -> bool:
    return rawlen <= max(RATIO_FLOOR, MAX_RATIO * zlen)


Seal = Callable[[bytes | memoryview], bytes]  # the 32-byte digest over everything before it
T = TypeVar("T")
# what a malformed body may raise while parsed: one line, never a traceback
MALFORMED = (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError, struct.error,
             zstandard.ZstdError, MemoryError)


@dataclass(frozen=True)
class Container:
    """A kind of file in the shared container (magic, version, flags, compressed and body
    lengths, zstd body, digest): its name in messages, the versions it reads (the last is
    the newest), the smallest body, the largest file, what a failed seal suggests."""

    what: str
    magic: bytes
    versions: tuple[int, ...]
    min_body: int
    max_file: int
    mismatch: str = ""

    def frame(self, version: int, body: bytes, level: int, seal: Seal) -> bytes:
        z = zstandard.ZstdCompressor(level=level, write_content_size=True).compress(body)
        blob = PREFIX.pack(self.magic, version, 0, len(z), len(body)) + z
        return blob + seal(blob)

    def unframe(self, data: bytes, max_body: int, seal: Seal, bounds: str = "") -> tuple[int, bytes]:
        """(version, body): every size checked from the prefix before decompressing, and
        the decompressor never produces more than the declared body."""
        need(len(data) >= PREFIX.size + DIGEST_SIZE, f"too short to be a {self.what}")
        magic, version, flags, zlen, rawlen = PREFIX.unpack_from(data)
        need(magic == self.magic, f"not a seedledger {self.what} (bad magic)")
        newest = self.versions[-1]
        need(version <= newest, f"format {version} is newer than this seedledger reads ({newest})")
        need(version in self.versions and flags == 0, f"unknown format {version}/{flags}")
        need(zlen == len(data) - PREFIX.size - DIGEST_SIZE, "truncated or has trailing bytes")
        need(self.min_body <= rawlen <= max_body, f"declared body size {rawlen:,} is out of bounds{bounds}")
        need(_ratio_ok(rawlen, zlen), f"declared body size {rawlen:,} is out of bounds for {zlen:,} compressed bytes")
        need(seal(memoryview(data)[:-DIGEST_SIZE]) == data[-DIGEST_SIZE:], f"checksum mismatch{self.mismatch}")
        z = memoryview(data)[PREFIX.size : -DIGEST_SIZE]
        need(zstandard.frame_content_size(z) in (-1, rawlen), "body length differs from the declared one")
        body = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(z)).read(rawlen + 1)  # never past rawlen
        need(len(body) == rawlen, "body length differs from the declared one")
        return version, body

    def read(self, path: str | os.PathLike[str], parse: Callable[[bytes], T]) -> T:
        """`parse` of the file at `path`, any defect one line (SeedLedgerError) naming it."""
        p = Path(path)
        try:
            size = p.stat().st_size
            need(size <= self.max_file, f"{size:,} bytes is larger than any {self.what} ({self.max_file:,})")
            return parse(p.read_bytes())
        except (Malformed, SeedLedgerError) as exc:
            raise SeedLedgerError(f"{self.what} {p}: {exc}") from None
        except OSError as exc:
            raise SeedLedgerError(f"cannot read {self.what} {p}: {exc.strerror}") from None
        except MALFORMED as exc:
            msg = " ".join(str(exc).split())[:200]
            raise SeedLedgerError(f"{self.what} {p} is malformed: {type(exc).__name__}: {msg}") from None


SEEDS = Container("seed file", MAGIC, READABLE_VERSIONS, 4, MAX_FILE)
