"""Tests that need bubblewrap: they skip, with the reason printed, where it cannot exist,
and fail loudly in CI (``CI`` set), where ``make test`` installs it."""

from __future__ import annotations

import os
import shutil

import pytest


def need_bwrap() -> None:
    """Skip (or, in CI, fail) when the ``bwrap`` binary is missing."""
    if shutil.which("bwrap") is not None:
        return
    reason = "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI runs `make test`, which installs it)")
    pytest.skip(reason)
