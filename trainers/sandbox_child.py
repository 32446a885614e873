"""The sandbox's launcher: the one program that bwrap starts (``trainers/sandbox.py``).

Standard library only, and never imported by seedledger itself: the host passes this
file's text (and its siblings ``sandbox_item.py``, ``sandbox_watch.py``, ``sandbox_ns.py``,
``sandbox_cage.py``, ``sandbox_grader.py``, ``sandbox_codec.py``) into the sandbox. It is
trusted code of ours that handles hostile data: it makes itself undumpable, checks that
items can be caged here, then reads JSON requests on stdin, one a line, and answers one
JSON line per item on stdout. Every item runs in fresh forks of this process (``sandbox_item.py``), each in
namespaces of its own with a fresh, sized ``/tmp`` and ``/dev/shm``, so one item cannot
change what another sees, and nothing is left to wipe. Jobs: ``python`` (a program and
one test, graded in a process of its own), ``math`` (math-verify), ``rg_rows`` and
``rg_score`` (reasoning-gym's generators and its ``score_answer``), ``ping``. A
reasoning-gym generator is first built in a cage under the request's limits, and only a
build that stayed within them is made again here (for the children to inherit).

Item outcomes: ``ok`` (value), ``failed`` (an exception: its type name), ``memory``
(MemoryError), ``timeout`` (the CPU limit), ``output_limit``, ``wall_timeout`` (the
safety net for programs that block without using CPU), ``crashed`` (died without a
result), ``malformed`` (result bytes that are not a verdict).
"""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import random
import signal
import sys
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

if __package__:  # imported as trainers.sandbox_child (tests, docs): its siblings are in the package
    from .sandbox_item import item_uid, probe, run_item, run_program
else:  # run as /sandbox/sandbox_child.py in the cage, where -P keeps its directory off the path
    if os.environ.get("COVERAGE_PROCESS_START"):  # set by the host in `make coverage` only (sandbox_coverage.py)
        import coverage

        coverage.process_startup()
    sys.path.insert(0, "/sandbox")
    from sandbox_item import item_uid, probe, run_item, run_program

MAX_ENTRIES = 20000
_datasets: dict[str, Any] = {}
_entries: OrderedDict[tuple[str, int], Any] = OrderedDict()


def _harden() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: children cannot open our /proc/PID/fd
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come to us to be reaped


def _send(obj: dict[str, Any]) -> None:
    data = (json.dumps(obj) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


# ---- jobs: each handler runs in the child --------------------------------------------------

def _math(item: dict) -> float:
    from math_verify import parse, verify

    gold = parse(item["gold"], parsing_timeout=None)
    pred = parse(item["answer"], parsing_timeout=None)
    return 1.0 if gold and pred and verify(gold, pred, timeout_seconds=None) else 0.0


def _create(setup: dict) -> Any:
    import reasoning_gym

    random.seed(0)
    return reasoning_gym.create_dataset(setup["name"], seed=setup["seed"], size=setup["size"], **setup["options"])


class Refused(Exception):
    """A request refused with this text as it stands (no exception name before it)."""


def _build(setup: dict) -> bytes:
    """In the cage: build the generator; b"ok", or the library's own one-line error."""
    try:
        _create(setup)
    except MemoryError:
        raise  # the limit, said as such by the launcher
    except Exception as exc:  # noqa: BLE001 - a bad name or option: said to the user
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return b"E" + text.splitlines()[0][:300].encode()
    return b"ok"


BUILD_MEMORY_MB, BUILD_CPU_SECONDS = 1024, 60  # the most a generator may take to build here


def _dataset(setup: dict, lim: dict) -> Any:
    """The generator for ``setup``, built here only after a caged build succeeded within
    the task's memory and BUILD_CPU_SECONDS, and never above BUILD_MEMORY_MB: its options
    come from a config that may be a stranger's, whose limits (up to 16 GiB, 600 CPU-s)
    are its word too, and this process has no limits."""
    key = json.dumps(setup, sort_keys=True)
    if key not in _datasets:
        import reasoning_gym  # noqa: F401 - the library (no options) here, inherited by the build
        build_lim = {**lim, "raw": True, "memory_mb": min(int(lim["memory_mb"]), BUILD_MEMORY_MB),
                     "cpu_seconds": BUILD_CPU_SECONDS, "wall_seconds": 4 * BUILD_CPU_SECONDS}
        outcome, data = run_item(lambda _: _build(setup), {}, build_lim)
        if outcome["status"] != "ok":
            raise Refused(f"building {setup['name']} within the task's limits ({build_lim['memory_mb']} MiB, "
                          f"{build_lim['cpu_seconds']} CPU-s): {outcome['status']} {outcome.get('error', '')}".strip())
        if data != b"ok":
            raise Refused(data[1:].decode(errors="replace"))
        _datasets[key] = _create(setup)
    return _datasets[key]


def _generate(setup: dict, indices: list[int], lim: dict) -> str | None:
    """Make the entries at ``indices`` in a child (a generator may keep state between
    calls; the launcher's copy never runs one) and cache them; an error text or None."""
    key = json.dumps(setup, sort_keys=True)
    todo = [i for i in dict.fromkeys(indices) if (key, i) not in _entries]
    if not todo:
        return None
    ds = _dataset(setup, lim)
    rows_lim = {**lim, "raw": True, "result_bytes": 256 << 20,
                "cpu_seconds": max(int(lim["cpu_seconds"]), 60 + 2 * len(todo)),
                "wall_seconds": 4 * (60 + 2 * len(todo))}
    outcome, data = run_item(lambda _: pickle.dumps([ds[i] for i in todo]), {}, rows_lim)
    if outcome["status"] != "ok":
        return f"generating {setup['name']} rows: {outcome['status']} {outcome.get('error', '')}".strip()
    # inside the sandbox, from our own child that ran only the generator (no model text)
    for i, entry in zip(todo, pickle.loads(data), strict=True):  # noqa: S301
        _entries[(key, i)] = entry
    while len(_entries) > MAX_ENTRIES:
        _entries.popitem(last=False)
    return None


def _rg_score(item: dict) -> float:
    ds = _datasets[item["key"]]
    value = ds.score_answer(item["answer"], _entries[(item["key"], item["index"])])
    return float(value)


def _prepare(rid: int, job: str, setup: dict, items: list, lim: dict) -> Callable[[dict], dict] | None:
    """The job's runner (one item to its outcome), after its imports and set-up in this
    process (so every child inherits them); None when the job was answered here (``rg_rows``)."""
    if job == "python":
        return lambda item: run_program(item, lim)
    if job == "math":
        import math_verify  # noqa: F401 - imported once here, inherited by every child

        return lambda item: run_item(_math, item, lim)[0]
    if job not in ("rg_rows", "rg_score"):
        raise ValueError(f"unknown job {job!r}")
    _dataset(setup, lim)
    key = json.dumps(setup, sort_keys=True)
    indices = [it["index"] for it in items]
    error = _generate(setup, indices, lim)
    if error is not None:
        raise RuntimeError(error)
    if job == "rg_score":
        return lambda item: run_item(_rg_score, item, lim)[0]
    for i, index in enumerate(indices):
        entry = _entries[(key, index)]
        _send({"id": rid, "i": i, "status": "ok",
               "value": {"question": str(entry["question"]), "answer": str(entry["answer"])}})
    _send({"id": rid, "done": True})
    return None


def _handle(request: dict) -> None:
    rid = request["id"]
    job = request["job"]
    lim = request.get("limits", {})
    items = request.get("items", [])
    setup = request.get("setup") or {}
    if job == "ping":
        _send({"id": rid, "done": True, "uid": item_uid()})
        return
    try:
        runner = _prepare(rid, job, setup, items, lim)
    except Exception as exc:  # noqa: BLE001 - a bad setup or a missing library: refuse, one line
        if isinstance(exc, Refused):
            text = str(exc)
        else:
            text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        text = text.splitlines()[0] if text else type(exc).__name__
        _send({"id": rid, "refused": text})
        return
    if runner is None:
        return
    if job == "rg_score":
        key = json.dumps(setup, sort_keys=True)
        items = [{**it, "key": key} for it in items]
    for i, item in enumerate(items):
        _send({"id": rid, "i": i, **runner(item)})
    _send({"id": rid, "done": True})


def main() -> None:
    _harden()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    problem = probe()
    if problem is not None:
        _send({"ready": False, "error": f"items cannot be caged here: {problem}"})
        return
    _send({"ready": True, "uid": item_uid()})
    for line in sys.stdin:
        if line.strip():
            _handle(json.loads(line))


if __name__ == "__main__":
    main()
