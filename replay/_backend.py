"""Chooses between the numba CPU kernels and the torch reference.

``SEEDLEDGER_REPLAY_IMPL=reference`` forces the reference everywhere (tests compare the
two; it is also the escape hatch if numba is missing or broken on a platform).
"""

from __future__ import annotations

import os
from functools import cache


@cache
def fast_cpu() -> bool:
    if os.environ.get("SEEDLEDGER_REPLAY_IMPL", "fast") == "reference":
        return False
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True
