"""The process around the vLLM backend's in-process engine: environment defaults for a
small shared CPU, where vLLM's log goes (stderr; errors only unless `seedledger --verbose`),
and a guard that lets its start-up scan of modules survive llvmlite (numba's).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any


def cpu_env() -> None:
    """Defaults that suit a small shared CPU box; anything already set is respected."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default takes 4
    os.environ.setdefault("OMP_NUM_THREADS", str(len(cores)))  # else vLLM drops torch to 1


VERBOSE = "SEEDLEDGER_VERBOSE"  # `seedledger --verbose` sets it: vLLM's INFO/WARNING lines shown
_ours: dict[str, str] = {}  # the values quiet_env set (a later call may change them; the user's stay)


def quiet_env() -> bool:
    """vLLM logs to stdout at INFO by default (~400 lines a run, and stdout is where
    `--json` writes its one document): send its log to stderr, errors only unless
    verbose. Settings the user made are kept. Returns whether verbose."""
    verbose = os.environ.get(VERBOSE, "") not in ("", "0")
    wanted = {"VLLM_LOGGING_STREAM": "ext://sys.stderr", "VLLM_LOGGING_LEVEL": "INFO" if verbose else "ERROR"}
    for name, value in wanted.items():
        if os.environ.get(name, _ours.get(name)) == _ours.get(name):
            os.environ[name] = _ours[name] = value
    return verbose


@contextlib.contextmanager
def quiet_start(verbose: bool) -> Iterator[None]:
    """While vLLM imports and starts its engine, unless verbose: no Python warnings (its
    dependencies' deprecation notes), and its logger at ERROR before vLLM configures it
    (it logs at import, e.g. that Triton has no CPU backend, through Python's last resort)."""
    import logging
    import warnings

    with warnings.catch_warnings():
        if not verbose:
            warnings.simplefilter("ignore")
            logging.getLogger("vllm").setLevel(os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"))
        yield


def route_logs() -> None:
    """vLLM configures its logger once a process, when its first engine starts, on the
    stream and level of that moment: a later engine in the same process (a notebook, the
    test suite) points vLLM's own handler at this command's stderr and level."""
    import logging

    level = os.environ["VLLM_LOGGING_LEVEL"]
    logger = logging.getLogger("vllm")
    logger.setLevel(level)
    for handler in logger.handlers:
        if handler.get_name() == "vllm" and isinstance(handler, logging.StreamHandler):  # vLLM's own
            handler.setLevel(level)
            if os.environ["VLLM_LOGGING_STREAM"] == "ext://sys.stderr":
                with handler.lock:  # not setStream: it flushes the old stream, which may be closed
                    handler.stream = sys.stderr


def guard_llvmlite_dunders() -> None:
    """Make llvmlite's lazy C-library wrapper refuse dunder lookups.

    vLLM's CPU worker, at start, scans every module namespace for Triton kernels to
    override and reads `vars(obj)` of anything with a `__dict__`. llvmlite's
    `ffi.lib` (loaded once numba has compiled anything, as replay's kernels do) answers
    *every* attribute, `__dict__` included, with a C-function wrapper, so the scan dies
    with "'_lib_fn_wrapper' object has no attribute 'get'". A C library exports no dunder
    symbols, so refusing them changes nothing else.
    """
    ffi = sys.modules.get("llvmlite.binding.ffi")
    wrapper_cls = type(getattr(ffi, "lib", None)) if ffi is not None else None
    if wrapper_cls is None or getattr(wrapper_cls, "_seedledger_guarded", False):
        return
    lookup = wrapper_cls.__getattr__

    def __getattr__(self: Any, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return lookup(self, name)

    wrapper_cls.__getattr__ = __getattr__
    wrapper_cls._seedledger_guarded = True
