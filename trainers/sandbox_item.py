"""Running one item of the sandbox (``trainers/sandbox_child.py``) in a caged child.

Standard library only, never imported by seedledger itself: the host passes this file's
text into the sandbox. The child joins the item's cgroups, leads a session of its own,
becomes the item uid (as root), takes resource limits and the seccomp filter
(``sandbox_cage.py``), runs the job's handler, and only then reads the launcher's nonce
(fd 4) and writes nonce + result to fd 3. The launcher decides the verdict from what it saw
(CPU over the cgroup, exit status, the nonce), so an item's bytes on any fd are data.
"""

from __future__ import annotations

import json
import os
import random
import resource
import selectors
import shutil
import signal
import stat
import sys
import time
from collections.abc import Callable
from typing import Any

if __package__:  # imported as trainers.sandbox_item (tests, docs)
    from .sandbox_cage import ItemCgroup, install_seccomp
else:  # imported by the launcher inside the cage, from /sandbox
    from sandbox_cage import ItemCgroup, install_seccomp

RESULT_FD = 3
NONCE_FD = 4
CHECK_SECONDS = 0.02  # how often the item's CPU is read (cgroups)
MAX_DEPTH = 64  # nesting of a result document
LAUNCHER_UID = os.getuid()
LAUNCHER_PID = os.getpid()


def item_uid() -> int:
    """The uid items run as: the host's choice as root (no user namespace), else ours."""
    if os.getuid() == 0 and len(sys.argv) > 1 and int(sys.argv[1]) > 0:
        return int(sys.argv[1])
    return os.getuid()


def _becomeitem_uid() -> None:
    """As root, drop to the item uid: every capability goes, RLIMIT_NPROC holds, and the
    launcher (uid 0) is out of reach of signals and ptrace."""
    uid = item_uid()
    if os.getuid() != uid:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)


def _limits(lim: dict[str, Any], forking: bool) -> None:
    cpu = int(lim["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    with open("/proc/self/statm") as f:
        vsz = int(f.read().split()[0]) * resource.getpagesize()
    memory = vsz + (int(lim["memory_mb"]) << 20)
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    # the item uid's processes: the item's alone as root (plus the launcher's otherwise);
    # without cgroups no forking, so that one process's RLIMIT_CPU bounds the item
    shared = 0 if item_uid() != LAUNCHER_UID else 1
    procs = (int(lim["processes"]) if forking else 1) + shared
    resource.setrlimit(resource.RLIMIT_NPROC, (procs, procs))
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
    size = int(lim["file_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


def _child(handler: Callable[[dict], Any], item: dict, lim: dict, fds: tuple[int, int, int],
           cgroup: ItemCgroup) -> None:
    """In the forked child: cage, redirect, limit, run, report on fd 3, exit. Never returns."""
    code = 0
    me = os.getpid()
    result_w, out_w, nonce_r = fds
    try:
        os.setsid()  # a group of its own: kill(0) reaches the item alone
        cgroup.join()
        _becomeitem_uid()
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        os.dup2(result_w, RESULT_FD)
        os.dup2(nonce_r, NONCE_FD)
        os.closerange(NONCE_FD + 1, 65536)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.makedirs("/tmp/work", exist_ok=True)
        os.chdir("/tmp/work")
        random.seed(0)
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed(0)
        _limits(lim, cgroup.active)
        install_seccomp(LAUNCHER_PID)
        write, read = os.write, os.read  # the item's code may replace the module's names
        try:
            value = handler(item)
            data = value if lim.get("raw") else json.dumps({"status": "ok", "value": value}).encode()
        except MemoryError:
            data = json.dumps({"status": "memory", "error": "MemoryError"}).encode()
        except BaseException as exc:  # noqa: BLE001 - hostile code may raise anything
            data = json.dumps({"status": "failed", "error": type(exc).__name__}).encode()
        if os.getpid() != me:  # a process the item forked reached our code: it reports nothing
            os._exit(0)
        view = memoryview(read(NONCE_FD, 64) + data)
        while view:
            view = view[write(RESULT_FD, view):]
    except BaseException:  # noqa: BLE001 - report as a crash (no result)
        code = 1
    os._exit(code)


def _kill_others() -> None:
    """Kill every process in the sandbox we may signal but ourselves (items, strays)."""
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


def _wipe(root: str) -> None:
    def unlock(func: Any, path: str, exc: Any) -> None:
        try:
            os.chmod(os.path.dirname(path) or root, stat.S_IRWXU)
            os.chmod(path, stat.S_IRWXU)
            func(path)
        except OSError:
            pass

    for name in os.listdir(root):
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, onerror=unlock)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass


def _wipe_tmp() -> None:
    """Empty /tmp and /dev/shm, as the item uid (owner of what items wrote there)."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            _becomeitem_uid()
            for root in ("/tmp", "/dev/shm"):
                if os.path.isdir(root):
                    _wipe(root)
        except BaseException:  # noqa: BLE001
            code = 1
        os._exit(code)
    os.waitpid(pid, 0)


def _proc_cpu(pid: int) -> float | None:
    """One process's CPU seconds from /proc (the accounting without cgroups)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


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
        outcome = json.loads(data[len(nonce):].decode())
    except Exception:  # noqa: BLE001 - any bytes are a verdict (deep nesting: RecursionError)
        return {"status": "malformed", "error": "bad result"}
    if not isinstance(outcome, dict) or not _depth(outcome) or outcome.get("status") not in ("ok", "failed", "memory"):
        return {"status": "malformed", "error": "bad result"}
    value = outcome.get("value")
    if outcome["status"] == "ok" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return {"status": "malformed", "error": "bad value"}
    return {"status": outcome["status"], "value": value, "error": str(outcome.get("error", ""))[:200]}


_cgroups: list[ItemCgroup] = []


def _item_cgroup() -> ItemCgroup:
    """The items' cgroups, made once per launcher: items run one at a time, each after
    every process of the one before is dead and reaped, so one set serves them all
    (counters are read against a baseline taken at each item's start)."""
    if not _cgroups:
        _cgroups.append(ItemCgroup(f"items-{os.getpid()}"))
    return _cgroups[0]


def run_item(handler: Callable[[dict], Any], item: dict, lim: dict) -> tuple[dict[str, Any], bytes]:
    """Run one item in a caged child; its outcome and (for raw jobs) its result bytes.

    CPU is read over the item's cgroup (all its processes) every CHECK_SECONDS and the
    item is stopped at ``cpu_seconds``. The wall limit stops only an item that is not
    using CPU: at the deadline one still progressing (a loaded host starves it) gets more
    time, up to 3 × the wall limit, so its CPU limit, not the load, decides."""
    cgroup = _item_cgroup()
    memory = (int(lim["memory_mb"]) + 64) << 20
    cgroup.limit(memory, int(lim["processes"]))
    cgroup.begin()
    nonce = os.urandom(16).hex().encode()
    result_r, result_w = os.pipe()
    out_r, out_w = os.pipe()
    nonce_r, nonce_w = os.pipe()
    os.write(nonce_w, nonce)
    os.close(nonce_w)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.close(result_r)
        os.close(out_r)
        _child(handler, item, lim, (result_w, out_w, nonce_r), cgroup)
    for fd in (result_w, out_w, nonce_r):
        os.close(fd)
    cpu_limit = float(lim["cpu_seconds"])
    result_cap = int(lim.get("result_bytes", 1 << 20)) + len(nonce)
    output_cap = int(lim["output_kb"]) << 10
    wall = float(lim["wall_seconds"])
    start = time.monotonic()
    pidfd = os.pidfd_open(pid)
    sel = selectors.DefaultSelector()
    for fd in (result_r, out_r, pidfd):
        sel.register(fd, selectors.EVENT_READ)
    pipes = {result_r, out_r}
    result = bytearray()
    output = 0
    override: str | None = None
    until = start + wall  # then, once the child is gone, a short drain of the pipes
    cpu_seen, window = 0.0, start

    def cpu_now() -> float | None:
        return cgroup.cpu_seconds() if cgroup.active else _proc_cpu(pid)

    def stop(reason: str) -> None:
        nonlocal override
        if override is None:
            override = reason
            os.kill(pid, signal.SIGKILL)
            _kill_others()

    while pipes or pidfd in sel.get_map():
        now = time.monotonic()
        alive = pidfd in sel.get_map()
        if alive and cgroup.active and override is None and (cgroup.cpu_seconds() or 0.0) >= cpu_limit:
            stop("timeout")
        if now >= until:
            if not alive:
                break  # drained long enough
            used = cpu_now()
            progressing = used is not None and used - cpu_seen >= 0.02 * (now - window)
            if progressing and now < start + 3 * wall and override is None:
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
    used = cgroup.cpu_seconds()
    cpu = used if used is not None else usage.ru_utime + usage.ru_stime
    memory_hit = cgroup.hit_memory()
    _wipe_tmp()
    return _outcome(status, cpu, cpu_limit, override, memory_hit, bytes(result), nonce, lim)


def _outcome(status: int, cpu: float, cpu_limit: float, override: str | None, memory_hit: bool,
             result: bytes, nonce: bytes, lim: dict) -> tuple[dict[str, Any], bytes]:
    """The verdict of a finished item, from what the launcher saw (never the item's say)."""
    if override is not None:
        return {"status": override}, b""
    exited = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    if cpu >= cpu_limit - 0.05 and not exited:
        return {"status": "timeout"}, b""
    if lim.get("raw") is not None and exited and result:
        if not result.startswith(nonce):
            return {"status": "malformed", "error": "no nonce"}, b""
        return {"status": "ok"}, result[len(nonce):]
    if exited and result:
        return verdict(result, nonce), b""
    if memory_hit:
        return {"status": "memory", "error": "cgroup"}, b""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU:
            return {"status": "timeout"}, b""
        return {"status": "crashed", "error": signal.Signals(sig).name}, b""
    return {"status": "crashed", "error": f"exit {os.WEXITSTATUS(status)}"}, b""
