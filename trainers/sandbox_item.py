"""Running one item of the sandbox (``trainers/sandbox_child.py``) in caged processes.

Standard library only, never imported by seedledger itself: the host passes this file's
text into the sandbox. Each caged process is a fork of the launcher that joins the item's
cgroups, leads a session of its own, becomes the item uid (as root), enters a fresh,
sized root of its own (``sandbox_ns.py``: new user and mount namespaces, and a PID
namespace where it shares the launcher's uid), gives up every capability, takes resource
limits and the seccomp filter (``sandbox_cage.py``), and only then runs item code. A
scorer's job runs in one such process, which reads the launcher's nonce (fd 4) only after
its handler returned and writes nonce + result to fd 3. The ``python`` job runs in two:
the program alone, and the test with the verdict (``sandbox_grader.py``). The launcher
decides the outcome from what it saw (CPU over the cgroup, exit statuses, the nonce), so
an item's bytes on any fd are data.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import random
import resource
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

if __package__:  # imported as trainers.sandbox_item (tests, docs)
    from .sandbox_cage import ItemCgroup, install_seccomp
    from .sandbox_grader import grade, serve
    from .sandbox_ns import drop_capabilities, enter
    from .sandbox_watch import kill_others, outcome, reap_all, watch
else:  # imported by the launcher inside the cage, from /sandbox
    from sandbox_cage import ItemCgroup, install_seccomp
    from sandbox_grader import grade, serve
    from sandbox_ns import drop_capabilities, enter
    from sandbox_watch import kill_others, outcome, reap_all, watch

RESULT_FD = 3
NONCE_FD = 4
LAUNCHER_UID = os.getuid()
LAUNCHER_PID = os.getpid()


def _argv_int(i: int, default: int) -> int:
    try:
        return int(sys.argv[i])
    except (IndexError, ValueError):
        return default


BASE_UID, TMP_MB, SHM_MB = _argv_int(1, 0), _argv_int(2, 32), _argv_int(3, 16)


def item_uid(program: bool = False) -> int:
    """The uid an item's process runs as: as root the host's choice (the program of a
    ``python`` item one above its grader's), else ours."""
    if LAUNCHER_UID == 0 and BASE_UID > 0:
        return BASE_UID + (1 if program else 0)
    return LAUNCHER_UID


def _become(uid: int) -> None:
    """As root, drop to ``uid``: every capability goes, and the launcher (uid 0) is out
    of reach of signals and ptrace."""
    if os.getuid() != uid:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)


def _limits(lim: dict[str, Any], forking: bool, ours: int) -> None:
    cpu = int(lim["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    with open("/proc/self/statm") as f:
        vsz = int(f.read().split()[0]) * resource.getpagesize()
    memory = vsz + (int(lim["memory_mb"]) << 20)
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    # counted in the item's own user namespace: its processes and ``ours`` (the reaper and
    # the process that waits outside); without cgroups no forking, so that one process's
    # RLIMIT_CPU bounds the item
    procs = (int(lim["processes"]) if forking else 1) + ours
    resource.setrlimit(resource.RLIMIT_NPROC, (procs, procs))
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
    size = int(lim["file_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


def _place(fds: dict[int, int]) -> None:
    """Give this process exactly the fds ``fds`` names (target: source), nothing else."""
    high = {target: fcntl.fcntl(source, fcntl.F_DUPFD, 256) for target, source in fds.items()}
    for target, fd in high.items():
        os.dup2(fd, target)
    os.closerange(max(fds) + 1, 1 << 16)


def _enter(uid: int, cgroup: ItemCgroup, reaper: bool) -> bool:
    """In a fork of the launcher: join the item's cgroups and namespaces; whether the
    item is in a PID namespace of its own (it shares the launcher's uid)."""
    os.setsid()  # a group of its own: kill(0) reaches the item alone
    cgroup.join()
    _become(uid)
    pidns = uid == LAUNCHER_UID  # only the PID namespace keeps it from naming the launcher
    enter(TMP_MB, SHM_MB, pidns, reaper)
    return pidns


def _confine(fds: dict[int, int], lim: dict[str, Any], cgroup: ItemCgroup, pidns: bool) -> None:
    """The rest of the cage, last before item code: no capabilities, only ``fds``, the
    item's limits and the seccomp filter."""
    drop_capabilities()
    _place({0: os.open("/dev/null", os.O_RDONLY), **fds})
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.makedirs("/tmp/work", exist_ok=True)
    os.chdir("/tmp/work")
    random.seed(0)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(0)
    _limits(lim, cgroup.active, 2 if pidns else 0)
    install_seccomp(None if pidns else LAUNCHER_PID)


def _spawn(run: Callable[[bool], None], uid: int, lim: dict[str, Any], cgroup: ItemCgroup,
           fds: dict[int, int] | None = None) -> int:
    """Fork a process into the item's namespaces that runs ``run(pidns)`` and exits (1
    when anything raised); confined with ``fds`` first, or (None) as pid 1 that confines
    itself and the program it forks."""
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            pidns = _enter(uid, cgroup, reaper=fds is not None)
            if fds is not None:
                _confine(fds, lim, cgroup, pidns)
            run(pidns)
        except BaseException:  # noqa: BLE001 - a crash: no result
            code = 1
        os._exit(code)
    return pid


def _write_result(me: int, data: bytes) -> None:
    """Nonce + ``data`` to fd 3, by the process that ran the handler alone."""
    if os.getpid() != me:  # a process the item forked reached our code: it reports nothing
        os._exit(0)
    view = memoryview(os.read(NONCE_FD, 64) + data)
    while view:
        view = view[os.write(RESULT_FD, view):]


def _scorer(handler: Callable[[dict], Any], item: dict, lim: dict) -> Callable[[bool], None]:
    def run(_: bool) -> None:
        me = os.getpid()
        dumps = json.dumps  # the item's code may replace the module's names
        try:
            value = handler(item)
            data = b"+" + value if lim.get("raw") else dumps({"status": "ok", "value": value}).encode()
        except MemoryError:
            data = dumps({"status": "memory", "error": "MemoryError"}).encode()
        except BaseException as exc:  # noqa: BLE001 - hostile code may raise anything
            data = dumps({"status": "failed", "error": type(exc).__name__}).encode()
        _write_result(me, data)

    return run


_cgroups: list[ItemCgroup] = []


def _item_cgroup(lim: dict[str, Any], parts: int) -> ItemCgroup:
    """The items' cgroups, made once per launcher (items run one at a time, each after
    every process of the one before is dead and reaped; counters are read against a
    baseline taken at each item's start), limited for this item."""
    if not _cgroups:
        _cgroups.append(ItemCgroup(f"items-{os.getpid()}"))
    cgroup = _cgroups[0]
    ours = 2 if item_uid() == LAUNCHER_UID else parts - 1  # the waiter and pid 1, or the grader
    cgroup.limit((int(lim["memory_mb"]) + 64) << 20, int(lim["processes"]) + ours)
    cgroup.begin()
    return cgroup


def _pipes(n: int) -> list[tuple[int, int]]:
    return [os.pipe() for _ in range(n)]


def run_item(handler: Callable[[dict], Any], item: dict, lim: dict) -> tuple[dict[str, Any], bytes]:
    """One item of a scorer's job in one caged process; its outcome and (raw jobs) bytes."""
    cgroup = _item_cgroup(lim, 1)
    nonce = os.urandom(16).hex().encode()
    (result_r, result_w), (out_r, out_w), (nonce_r, nonce_w) = _pipes(3)
    os.write(nonce_w, nonce)
    os.close(nonce_w)
    pid = _spawn(_scorer(handler, item, lim), item_uid(), lim, cgroup,
                 {1: out_w, 2: out_w, RESULT_FD: result_w, NONCE_FD: nonce_r})
    for fd in (result_w, out_w, nonce_r):
        os.close(fd)
    seen = watch([pid], result_r, out_r, lim, cgroup, len(nonce))
    return outcome(seen, pid, lim, nonce)


def run_program(item: dict, lim: dict) -> dict[str, Any]:
    """One ``python`` item: the program in one caged process, its test and verdict in
    another (``sandbox_grader.py``). As root they are two of the launcher's children with
    uids of their own; otherwise the grader is pid 1 of the program's PID namespace."""
    cgroup = _item_cgroup(lim, 2)
    nonce = os.urandom(16).hex().encode()
    (result_r, result_w), (out_r, out_w), (nonce_r, nonce_w), (up_r, up_w), (down_r, down_w) = _pipes(5)
    os.write(nonce_w, nonce)
    os.close(nonce_w)
    program_fds = {1: out_w, 2: out_w, 3: up_w, 4: down_r}
    grader_fds = {1: out_w, 2: out_w, RESULT_FD: result_w, NONCE_FD: nonce_r, 5: up_r, 6: down_w}

    def program(_: bool) -> None:
        serve(item["program"], 4, 3)

    def grader(pidns: bool) -> None:
        child = 0
        if pidns:  # pid 1: the program is its child, confined apart; the kernel shields us
            ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # undumpable (the program too): no reading our memory
            child = os.fork()
            if child == 0:
                try:
                    _confine(program_fds, lim, cgroup, pidns)
                    program(pidns)
                finally:
                    os._exit(0)
            _confine(grader_fds, lim, cgroup, pidns)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # the program may hang up first
        me = os.getpid()
        verdict = grade(item["test"], 5, 6)
        if child and verdict["status"] == "lost":
            verdict["wait"] = _program_status(child)
        _write_result(me, json.dumps(verdict).encode())

    if item_uid() == LAUNCHER_UID:
        pids = [_spawn(grader, item_uid(), lim, cgroup)]
    else:
        pids = [_spawn(grader, item_uid(), lim, cgroup, grader_fds),
                _spawn(program, item_uid(program=True), lim, cgroup, program_fds)]
    for fd in (result_w, out_w, nonce_r, up_r, up_w, down_r, down_w):
        os.close(fd)
    seen = watch(pids, result_r, out_r, lim, cgroup, len(nonce))
    got, _ = outcome(seen, pids[0], lim, nonce)
    if got["status"] == "lost":  # the program died under the test: its status says why
        if len(pids) == 1:
            seen.statuses[-1] = int(got.get("wait", 0))  # as its parent, the grader saw it
        got, _ = outcome(seen, pids[1] if len(pids) > 1 else -1, lim, nonce, result=b"")
    return got


def _program_status(pid: int) -> int:
    """The wait status of the grader's child, the program, which hung up: given a second
    to end on its own (its CPU limit, a crash), then killed."""
    for _ in range(100):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


def probe() -> str | None:
    """Whether items can be caged here (user namespaces inside the sandbox): None, or why not."""
    error_r, error_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            _become(item_uid())
            enter(1, 1, item_uid() == LAUNCHER_UID)
            drop_capabilities()
            os._exit(0)
        except BaseException as exc:  # noqa: BLE001 - said by the launcher, one line
            text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            os.write(error_w, text.encode()[:300])
            os._exit(1)
    os.close(error_w)
    text = os.read(error_r, 400).decode(errors="replace")
    os.close(error_r)
    _, status = os.waitpid(pid, 0)
    kill_others()
    reap_all()
    return None if os.waitstatus_to_exitcode(status) == 0 else (text or f"status {status}")
