"""Hostile history files made in the tests: a history's checksum ties it to its seed file
and guards against damage, not against its author, so a forged history is a JSON document
edited at will and checksummed again for the seed file it travels with."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import zstandard

from seedledger.ledger.historyfile import DIGEST_SIZE, MAGIC, PREFIX, VERSION, _checksum
from seedledger.ledger.seedfile import read_seedfile
from seedledger.replay.noise import member_key


def doc(history: Path) -> dict:
    """The JSON document inside a history file."""
    data = history.read_bytes()
    return json.loads(zstandard.ZstdDecompressor().decompress(data[PREFIX.size : -DIGEST_SIZE]))


def write(dest: Path, body: bytes, seed_digest: str) -> Path:
    """A history file of `body`, checksummed for the seed file of `seed_digest`."""
    z = zstandard.ZstdCompressor(write_content_size=True).compress(body)
    blob = PREFIX.pack(MAGIC, VERSION, 0, len(z), len(body)) + z
    dest.write_bytes(blob + _checksum(bytes.fromhex(seed_digest), blob))
    return dest


def forge(seeds: Path, history: Path, dest: Path, edit: Callable[[dict], None]) -> Path:
    """`history` (of seed file `seeds`) with `edit` applied to its document, written to `dest`."""
    d = doc(history)
    edit(d)
    return write(dest, json.dumps(d).encode(), read_seedfile(seeds, key_fn=member_key).digest)
