"""Shared fixtures. Models come from the real cache (`$SEEDLEDGER_HOME`), provisioned once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # tests run from a checkout even without `pip install -e`
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The `tiny` alias (~3.3M random parameters, SmolLM2 tokenizer), provisioned once."""
    from engine.models import resolve_model

    return resolve_model("tiny")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The default model, SmolLM2-135M-Instruct in fp32 (a one-time ~30 s provisioning)."""
    import importlib.metadata

    from engine.models import INSTALL_HINT, SMOLLM2_PACKAGE, resolve_model

    try:
        importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{SMOLLM2_PACKAGE} is not installed: {INSTALL_HINT}")
    return resolve_model("smollm2-135m-instruct")
