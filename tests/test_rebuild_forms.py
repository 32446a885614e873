"""Rebuild reads where a kind's master lives from its declared form
(`PerturbationKind.master_form`, replay.kinds.forms.MasterForm), as the backends do, and
starts an adapter run from the HF backend's own master store (hf_master.AdapterOnBase), so
the frozen base's fingerprint and the initial adapter are made in one place."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REBUILD = [*sorted((ROOT / "engine" / "rebuild").glob("*.py")), ROOT / "replay" / "rebuild.py"]


def _reads(attr: str) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{node.lineno}" for p in REBUILD
            for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
            if isinstance(node, ast.Attribute) and node.attr == attr]


def test_rebuild_reads_the_master_form_not_a_flag_derived_from_it():
    assert _reads("frozen_base") == []
    assert _reads("master_form")  # the form is what decides


def test_an_adapter_start_is_made_by_the_hf_master_store_alone():
    """engine.rebuild makes no frozen fingerprint or initial adapter of its own."""
    assert _reads("frozen_fingerprint") == [] and _reads("initial_adapter") == []
