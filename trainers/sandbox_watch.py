"""Watching an item's caged processes and reading its verdict (``trainers/sandbox_item.py``).

Standard library only, never imported by seedledger itself: the host passes this file's
text into the sandbox. ``watch`` reads the item's result and output until the process
that reports has ended, stopping the item at its CPU (over its cgroup, or its processes'
``/proc`` times), output or wall limit, then kills and reaps everything left; ``outcome``
turns what it saw into the item's verdict, never the item's say.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import time
from dataclasses import dataclass, field
from typing import Any

CHECK_SECONDS = 0.02  # how often the item's CPU is read (cgroups)
MAX_DEPTH = 64  # nesting of a result document
LAUNCHER_PID = os.getpid()
STATUSES = ("ok", "failed", "memory", "malformed", "lost")  # what a result document may say


@dataclass
class Seen:
    """What the launcher saw of one item."""

    override: str | None = None
    result: bytes = b""
    cpu: float = 0.0
    memory_hit: bool = False
    statuses: dict[int, int] = field(default_factory=dict)


def kill_others() -> None:
    """Kill every process in the sandbox we may signal but ourselves (items, strays)."""
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass


def reap_all() -> None:
    """Kill and reap every remaining process (we are their subreaper), so the next item
    starts with none alive: a process not yet reaped still counts against its limits."""
    while True:
        kill_others()
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _tree_cpu() -> float | None:
    """CPU of every process in the sandbox but the launcher and bwrap's pid 1 (so the
    item's: items run one at a time), reaped children included: the accounting without
    cgroups, whatever namespace or session the item's processes are in."""
    total = 0
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for name in names:
        if not name.isdigit() or int(name) in (1, LAUNCHER_PID):
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
        except (OSError, ValueError, IndexError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def watch(pids: list[int], result_r: int, out_r: int, lim: dict, cgroup: Any, nonce_len: int) -> Seen:  # noqa: C901
    """Read the item until ``pids[0]`` (the process that reports) has ended.

    CPU is read over the item's cgroup every CHECK_SECONDS and the item is stopped at
    ``cpu_seconds``. The wall limit stops only an item that is not using CPU: at the
    deadline one still progressing (a loaded host starves it) gets more time, up to 3 ×
    the wall limit, so its CPU limit, not the load, decides."""
    seen = Seen()
    cpu_limit = float(lim["cpu_seconds"])
    result_cap = int(lim.get("result_bytes", 1 << 20)) + nonce_len
    output_cap = int(lim["output_kb"]) << 10
    wall = float(lim["wall_seconds"])
    start = time.monotonic()
    pidfd = os.pidfd_open(pids[0])
    sel = selectors.DefaultSelector()
    for fd in (result_r, out_r, pidfd):
        sel.register(fd, selectors.EVENT_READ)
    pipes = {result_r, out_r}
    result = bytearray()
    output = 0
    until = start + wall  # then, once the reporting process is gone, a short drain of the pipes
    cpu_seen, window = 0.0, start

    def cpu_now() -> float | None:
        return cgroup.cpu_seconds() if cgroup.active else _tree_cpu()

    def stop(reason: str) -> None:
        if seen.override is None:
            seen.override = reason
            kill_others()

    while pipes or pidfd in sel.get_map():
        now = time.monotonic()
        alive = pidfd in sel.get_map()
        if alive and cgroup.active and seen.override is None and (cgroup.cpu_seconds() or 0.0) >= cpu_limit:
            stop("timeout")
        if now >= until:
            if not alive:
                break  # drained long enough
            used = cpu_now()
            progressing = used is not None and used - cpu_seen >= 0.02 * (now - window)
            if progressing and now < start + 3 * wall and seen.override is None:
                cpu_seen, window, until = used, now, now + 2.0  # computing: its CPU limit decides
            else:
                stop("wall_timeout")
        step = max(0.0, until - now)
        if alive and cgroup.active:
            step = min(step, CHECK_SECONDS)
        for key, _ in sel.select(step):
            fd = key.fd
            if fd == pidfd:
                sel.unregister(pidfd)
                kill_others()  # the item's other processes, and strays holding the pipes
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
    kill_others()
    usage = 0.0
    for pid in pids:
        _, seen.statuses[pid], ru = os.wait4(pid, 0)
        usage += ru.ru_utime + ru.ru_stime
    reap_all()
    used = cgroup.cpu_seconds()
    seen.cpu = used if used is not None else usage
    seen.memory_hit = cgroup.hit_memory()
    seen.result = bytes(result)
    return seen


def _depth(obj: Any, left: int = MAX_DEPTH) -> bool:
    """Whether ``obj`` nests at most ``left`` deep (a parsed document stays small)."""
    if left < 0:
        return False
    if isinstance(obj, dict):
        return all(_depth(v, left - 1) for v in obj.values())
    if isinstance(obj, list):
        return all(_depth(v, left - 1) for v in obj)
    return True


def verdict(data: bytes, nonce: bytes) -> dict[str, Any]:
    """The item's outcome from its result bytes: anything but the nonce and one of our
    documents (a value a number) is ``malformed``, never an exception."""
    if not data.startswith(nonce):
        return {"status": "malformed", "error": "no nonce"}
    try:
        got = json.loads(data[len(nonce):].decode())
    except Exception:  # noqa: BLE001 - any bytes are a verdict (deep nesting: RecursionError)
        return {"status": "malformed", "error": "bad result"}
    if not isinstance(got, dict) or not _depth(got) or got.get("status") not in STATUSES:
        return {"status": "malformed", "error": "bad result"}
    value = got.get("value")
    if got["status"] == "ok" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return {"status": "malformed", "error": "bad value"}
    out = {"status": got["status"], "value": value, "error": str(got.get("error", ""))[:200]}
    if got["status"] == "lost" and type(got.get("wait")) is int:  # the program's wait status, from its grader
        out["wait"] = got["wait"]
    return out


def outcome(seen: Seen, pid: int, lim: dict, nonce: bytes, result: bytes | None = None) -> tuple[dict[str, Any], bytes]:
    """The verdict of a finished item from process ``pid``'s status and the result bytes
    (``seen.result`` unless given); for raw jobs, the bytes after the nonce."""
    status = seen.statuses[pid]
    result = seen.result if result is None else result
    if seen.override is not None:
        return {"status": seen.override}, b""
    exited = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    if seen.cpu >= float(lim["cpu_seconds"]) - 0.05 and not exited:
        return {"status": "timeout"}, b""
    if lim.get("raw") is not None and exited and result.startswith(nonce + b"+"):
        return {"status": "ok"}, result[len(nonce) + 1:]  # raw bytes; a failure is a document
    if exited and result:
        return verdict(result, nonce), b""
    if seen.memory_hit:
        return {"status": "memory", "error": "cgroup"}, b""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU:
            return {"status": "timeout"}, b""
        return {"status": "crashed", "error": signal.Signals(sig).name}, b""
    return {"status": "crashed", "error": f"exit {os.WEXITSTATUS(status)}"}, b""
