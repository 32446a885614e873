"""The documentation site builds offline with warnings as errors (`mkdocs build
--strict`): a broken link or anchor, a page left out of the nav, an API reference to a
name that no longer exists fails here. The CLI reference is rendered from the commands, the
configuration reference from the config's schema."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_docs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
         "-d", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    cli = (tmp_path / "site" / "cli" / "index.html").read_text()
    for command in ("train", "resume", "fork", "rebuild", "export", "import", "verify", "db upgrade"):
        assert f"seedledger {command}" in cli, command
    assert "--generations" in cli and "--ledger" in cli  # the options, from the commands' own help
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("open_ledger", "train", "history_frame", "rebuild_model", "rebuild_to", "import_seeds"):
        assert name in api, name
    assert "Write RUN@G with its whole lineage as a seed file" in api  # docstrings, not hand-written
    reference = (tmp_path / "site" / "config-reference" / "index.html").read_text()
    for key in ("population", "optimizer.beta1", "schedule.lr.warmup", "ga.sharing.radius", "train (kind: lora).essa"):
        assert f"<code>{key}</code>" in reference, key  # rendered from the schema (test_config_reference)


def test_broken_reference_fails_the_build(tmp_path):
    """--strict really is strict: a page linking to a missing page fails the build."""
    pytest.importorskip("mkdocs")
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# x\n\nSee [nowhere](missing.md).\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: t\nnav:\n  - index.md\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp_path / "mkdocs.yml"),
         "-d", str(tmp_path / "site")],
        cwd=tmp_path, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode != 0 and "missing.md" in proc.stderr
