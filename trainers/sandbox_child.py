"""The sandbox's launcher: the one program that bwrap starts (``trainers/sandbox.py``).

Standard library only, and never imported by seedledger itself: the host passes this
file's text into the sandbox. It is trusted code of ours that handles hostile data: it
drops to an unprivileged uid (when started as root), makes itself undumpable, then reads
JSON requests on stdin, one a line, and answers one JSON line per item on stdout. Every
item runs in a fresh ``fork`` of this process, so one item cannot change what another
sees; the child gets its resource limits (CPU seconds, address space, processes, file
size, open files) before it touches the item, writes its result on fd 3, and its stdout
and stderr go to a pipe that is read up to a cap. After each item every other process of
the sandbox's uid is killed and ``/tmp`` is emptied.

Item outcomes: ``ok`` (value), ``failed`` (an exception: its type name), ``memory``
(MemoryError), ``timeout`` (the CPU limit), ``output_limit``, ``wall_timeout`` (the
safety net for programs that block without using CPU), ``crashed`` (died without a
result). Jobs: ``python`` (a program and one test), ``math`` (math-verify), ``rg_rows``
and ``rg_score`` (reasoning-gym's generators and its ``score_answer``), ``ping``.
"""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import random
import resource
import selectors
import shutil
import signal
import stat
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

RESULT_FD = 3
MAX_ENTRIES = 20000
_datasets: dict[str, Any] = {}
_entries: OrderedDict[tuple[str, int], Any] = OrderedDict()


def _drop_privileges() -> None:
    """As root (a sandbox started by root has no user namespace), become the uid the host
    chose, so that RLIMIT_NPROC holds (it does not for root) and no capability is left."""
    if os.getuid() == 0 and len(sys.argv) > 1 and int(sys.argv[1]) > 0:
        uid = int(sys.argv[1])
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: children cannot open our /proc/PID/fd
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come to us to be reaped


def _send(obj: dict[str, Any]) -> None:
    data = (json.dumps(obj) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def _limits(lim: dict[str, Any]) -> None:
    cpu = int(lim["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    with open("/proc/self/statm") as f:
        vsz = int(f.read().split()[0]) * resource.getpagesize()
    memory = vsz + (int(lim["memory_mb"]) << 20)
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    procs = int(lim["processes"]) + 1  # the launcher shares the uid
    resource.setrlimit(resource.RLIMIT_NPROC, (procs, procs))
    size = int(lim["file_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


def _child(handler: Callable[[dict], Any], item: dict, lim: dict, result_w: int, out_w: int) -> None:
    """In the forked child: redirect, limit, run, report on fd 3, exit. Never returns."""
    code = 0
    me = os.getpid()
    try:
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        os.dup2(result_w, RESULT_FD)
        os.closerange(RESULT_FD + 1, 65536)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.makedirs("/tmp/work", exist_ok=True)
        os.chdir("/tmp/work")
        random.seed(0)
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed(0)
        _limits(lim)
        try:
            value = handler(item)
            data = value if lim.get("raw") else json.dumps({"status": "ok", "value": value}).encode()
        except MemoryError:
            data = json.dumps({"status": "memory", "error": "MemoryError"}).encode()
        except BaseException as exc:  # noqa: BLE001 - hostile code may raise anything
            data = json.dumps({"status": "failed", "error": type(exc).__name__}).encode()
        if os.getpid() != me:  # a process the item forked reached our code: it reports nothing
            os._exit(0)
        view = memoryview(data)
        while view:
            view = view[os.write(RESULT_FD, view):]
    except BaseException:  # noqa: BLE001 - report as a crash (no result)
        code = 1
    os._exit(code)


def _kill_others() -> None:
    """Kill every process of our uid in the sandbox but ourselves (stray grandchildren)."""
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass


def _reap_all() -> None:
    """Kill and reap every remaining process (we are their subreaper), so the next item
    starts with none alive: a process not yet reaped still counts against RLIMIT_NPROC."""
    while True:
        _kill_others()
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _wipe_tmp() -> None:
    def unlock(func: Any, path: str, exc: Any) -> None:
        try:
            os.chmod(os.path.dirname(path) or "/tmp", stat.S_IRWXU)
            os.chmod(path, stat.S_IRWXU)
            func(path)
        except OSError:
            pass

    for name in os.listdir("/tmp"):
        path = os.path.join("/tmp", name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, onerror=unlock)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass


def run_item(handler: Callable[[dict], Any], item: dict, lim: dict) -> tuple[dict[str, Any], bytes]:
    """Run one item in a limited child; its outcome and (for raw jobs) its result bytes."""
    result_r, result_w = os.pipe()
    out_r, out_w = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.close(result_r)
        os.close(out_r)
        _child(handler, item, lim, result_w, out_w)
    os.close(result_w)
    os.close(out_w)
    result_cap = int(lim.get("result_bytes", 1 << 20))
    output_cap = int(lim["output_kb"]) << 10
    deadline = time.monotonic() + float(lim["wall_seconds"])
    pidfd = os.pidfd_open(pid)
    sel = selectors.DefaultSelector()
    for fd in (result_r, out_r, pidfd):
        sel.register(fd, selectors.EVENT_READ)
    pipes = {result_r, out_r}
    result = bytearray()
    output = 0
    override: str | None = None
    until = deadline  # then, once the child is gone, a short drain of the pipes

    def stop(reason: str) -> None:
        nonlocal override
        if override is None:
            override = reason
            os.kill(pid, signal.SIGKILL)

    while pipes or pidfd in sel.get_map():
        now = time.monotonic()
        if now >= until:
            if pidfd not in sel.get_map():
                break  # drained long enough
            stop("wall_timeout")
        for key, _ in sel.select(max(0.0, until - now)):
            fd = key.fd
            if fd == pidfd:
                sel.unregister(pidfd)
                _kill_others()  # grandchildren would hold the pipes open
                until = time.monotonic() + 1.0
                continue
            data = os.read(fd, 65536)
            if not data:
                sel.unregister(fd)
                pipes.discard(fd)
            elif fd == result_r:
                result += data
                if len(result) > result_cap:
                    stop("output_limit")
            else:
                output += len(data)
                if output > output_cap:
                    stop("output_limit")
    sel.close()
    for fd in (result_r, out_r, pidfd):
        os.close(fd)
    _, status, usage = os.wait4(pid, 0)
    _reap_all()
    _wipe_tmp()
    cpu = usage.ru_utime + usage.ru_stime
    if override is not None:
        return {"status": override}, b""
    if lim.get("raw") is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and result:
        return {"status": "ok"}, bytes(result)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and result:
        try:
            outcome = json.loads(result.decode())
        except (ValueError, RecursionError):  # any bytes from the item are a verdict, never a crash
            return {"status": "crashed", "error": "bad result"}, b""
        if isinstance(outcome, dict) and outcome.get("status") in ("ok", "failed", "memory"):
            return outcome, b""
        return {"status": "crashed", "error": "bad result"}, b""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= float(lim["cpu_seconds"]) - 0.05):
            return {"status": "timeout"}, b""
        return {"status": "crashed", "error": signal.Signals(sig).name}, b""
    return {"status": "crashed", "error": f"exit {os.WEXITSTATUS(status)}"}, b""


# ---- jobs: each handler runs in the child --------------------------------------------------

def _python(item: dict) -> float:
    namespace: dict[str, Any] = {"__name__": "__sandbox__"}
    exec(compile(item["program"], "<program>", "exec"), namespace)  # noqa: S102 - sandboxed
    exec(compile(item["test"], "<test>", "exec"), namespace)  # noqa: S102 - sandboxed
    return 1.0


def _math(item: dict) -> float:
    from math_verify import parse, verify

    gold = parse(item["gold"], parsing_timeout=None)
    pred = parse(item["answer"], parsing_timeout=None)
    return 1.0 if gold and pred and verify(gold, pred, timeout_seconds=None) else 0.0


def _dataset(setup: dict) -> Any:
    key = json.dumps(setup, sort_keys=True)
    if key not in _datasets:
        import reasoning_gym

        random.seed(0)
        _datasets[key] = reasoning_gym.create_dataset(
            setup["name"], seed=setup["seed"], size=setup["size"], **setup["options"]
        )
    return _datasets[key]


def _generate(setup: dict, indices: list[int], lim: dict) -> str | None:
    """Make the entries at ``indices`` in a child (a generator may keep state between
    calls; the launcher's copy never runs one) and cache them; an error text or None."""
    key = json.dumps(setup, sort_keys=True)
    todo = [i for i in dict.fromkeys(indices) if (key, i) not in _entries]
    if not todo:
        return None
    ds = _dataset(setup)
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


def _prepare(rid: int, job: str, setup: dict, items: list, lim: dict) -> Callable[[dict], Any] | None:
    """The job's per-item handler, after its imports and set-up in this process (so every
    child inherits them); None when the job was answered here (``rg_rows``)."""
    if job == "python":
        return _python
    if job == "math":
        import math_verify  # noqa: F401 - imported once here, inherited by every child

        return _math
    if job not in ("rg_rows", "rg_score"):
        raise ValueError(f"unknown job {job!r}")
    _dataset(setup)
    key = json.dumps(setup, sort_keys=True)
    indices = [it["index"] for it in items]
    error = _generate(setup, indices, lim)
    if error is not None:
        raise RuntimeError(error)
    if job == "rg_score":
        return _rg_score
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
        _send({"id": rid, "done": True, "uid": os.getuid()})
        return
    try:
        handler = _prepare(rid, job, setup, items, lim)
    except Exception as exc:  # noqa: BLE001 - a bad setup or a missing library: refuse, one line
        text = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
        _send({"id": rid, "refused": text})
        return
    if handler is None:
        return
    if job == "rg_score":
        key = json.dumps(setup, sort_keys=True)
        items = [{**it, "key": key} for it in items]
    for i, item in enumerate(items):
        outcome, _ = run_item(handler, item, lim)
        _send({"id": rid, "i": i, **outcome})
    _send({"id": rid, "done": True})


def main() -> None:
    _drop_privileges()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    _send({"ready": True, "uid": os.getuid()})
    for line in sys.stdin:
        if line.strip():
            _handle(json.loads(line))


if __name__ == "__main__":
    main()
