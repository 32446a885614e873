"""Chooses between the numba CPU kernels, the Triton kernels and the torch reference.

``SEEDLEDGER_REPLAY_IMPL``:
  ``fast`` (default): numba on CPU tensors, Triton on CUDA tensors, each when it imports,
      else the torch reference;
  ``reference``: the torch reference everywhere (the oracle the tests compare against; also
      the escape hatch if numba or Triton is missing or broken on a platform);
  ``triton``: Triton for every tensor, CPU ones included. CPU tensors only work with
      ``TRITON_INTERPRET=1`` (Triton's interpreter): that is how the tests check the
      kernels bit for bit on a machine without a GPU.
"""

from __future__ import annotations

import os
from functools import cache


def impl() -> str:
    return os.environ.get("SEEDLEDGER_REPLAY_IMPL", "fast")


@cache
def fast_cpu() -> bool:
    if impl() in ("reference", "triton"):
        return False
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


@cache
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # ImportError, or a broken install failing at import
        return False
    return True


@cache
def use_triton(device_type: str) -> bool:
    """Triton for a tensor on this device type? (Read once, like `fast_cpu`: it is asked
    per tensor on the update's path.)"""
    mode = impl()
    if mode == "reference" or not triton_available():
        return False
    return mode == "triton" or device_type == "cuda"
