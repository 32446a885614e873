"""The numba kernels' (``_cpu_kernels``) arguments that are built in Python: the work items
(which block of which tensor each parallel iteration does) and typed lists of arrays.

A typed list is built by two cached jitted functions: ``numba.typed.List.append`` called
from Python compiles numba's list code afresh in every process (~0.2 s of CPU per element
type, twice before a session's first generation); these load from the on-disk cache.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.typed import List

from ._cpu_kernels import _OPTS, BLOCK


def work_items(sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(tensor index, block start) for every BLOCK of every tensor, in order."""
    counts = [(n + BLOCK - 1) // BLOCK for n in sizes]
    work_t = np.repeat(np.arange(len(sizes), dtype=np.int64), counts)
    work_s = np.concatenate([np.arange(c, dtype=np.int64) * BLOCK for c in counts] or [np.zeros(0, np.int64)])
    return work_t, work_s.astype(np.int64)


def lowrank_work_items(rows: list[int], cols: list[int], block: int) -> tuple[np.ndarray, np.ndarray]:
    """(tensor index, first row) of every work item of ``lowrank_apply_many``, in order."""
    work_t, work_o = [], []
    for t, (r, c) in enumerate(zip(rows, cols, strict=True)):
        if r and c:
            starts = range(0, r, max(1, block // c))
            work_t += [t] * len(starts)
            work_o += starts
    return np.array(work_t, dtype=np.int64), np.array(work_o, dtype=np.int64)


def typed_list(arrays: list[np.ndarray]) -> List:
    """A numba typed list of ``arrays`` (one compiled signature for any number of tensors)."""
    if not arrays:
        return List()
    out = _list_of(arrays[0])
    for a in arrays[1:]:
        _append(out, a)
    return out


@njit(**_OPTS)
def _list_of(first):
    out = List()
    out.append(first)
    return out


@njit(**_OPTS)
def _append(out, item):
    out.append(item)
