"""Running hostile work (model-written code, library scorers that ``eval`` model answers)
in a bubblewrap sandbox, never in a training process.

One launcher process (``trainers/sandbox_child.py``) per training process, started on first
use and restarted if it dies, runs inside ``bwrap``: new PID, network, IPC, UTS and cgroup
namespaces (no network at all), a new session, killed with its parent; the filesystem is
read-only binds of ``/usr`` and the Python installation only (no home, no ledger, no
work tree), small tmpfs ``/tmp`` and ``/dev/shm`` (sized: files count), a fresh ``/proc``
and a read-only ``/dev``, an empty environment but for a fixed ``PYTHONHASHSEED`` (set
order must not change a reward; under ``make coverage`` alone, a coverage data directory
and the variable that starts coverage.py: ``sandbox_coverage.py``). Started as root it
has no user namespace: the launcher keeps uid 0 with CAP_SETUID, CAP_SETGID and CAP_KILL
only, and items run as a uid of their own (``RLIMIT_NPROC`` holds; they cannot signal or
trace the launcher).

Each item of a request runs in its own caged fork of the launcher (``sandbox_item.py``,
``sandbox_cage.py``) with the ``Limits`` below: CPU summed over all its processes (the
items' cgroups, ``sandbox_cgroup.py``; without them the item may not fork), memory
including its files, no namespaces, mounts, ptrace or signals to the launcher (seccomp).
It is bounded by CPU seconds (deterministic: the same work times out on every run), not
by the clock; the clock is only a safety net for programs that block without using CPU,
and it is reported as its own outcome (``wall_timeout``); an item still using CPU at its
wall limit gets more time (up to 3×), so load never decides its verdict. What an item did comes back
as an ``Outcome``; callers turn outcomes into rewards (0 unless ``ok``), so a reward
never raises. A sandbox that cannot start at all is a broken machine, not a reward: that
raises ``SeedLedgerError`` (no unsandboxed fallback).
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.sandbox_cgroup import SandboxCgroups
from seedledger.trainers.sandbox_coverage import CageCoverage, cage_coverage

INSTALL_HINT = "install the 'bubblewrap' package (apt-get install bubblewrap)"
USERNS_HINT = ("every item gets user, mount and PID namespaces of its own: allow unprivileged user "
               "namespaces (sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 23.10+ "
               "kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile for this Python)")
STATUSES = ("ok", "failed", "memory", "timeout", "output_limit", "wall_timeout", "crashed", "died",
            "malformed")
_CAGE = ("sandbox_child.py", "sandbox_item.py", "sandbox_watch.py", "sandbox_ns.py", "sandbox_cage.py",
         "sandbox_grader.py", "sandbox_codec.py")  # passed into the sandbox
_MAX_LINE = 64 << 20
_START_SECONDS = 60.0
_uids = itertools.count()


@dataclass(frozen=True)
class Limits:
    """Per-item resource limits: over the whole item (its cgroup: CPU of all its processes,
    memory with its files, processes) and in each process (rlimits)."""

    cpu_seconds: int = 2
    memory_mb: int = 512  # each process's address space beyond the launcher's; the item's memory + 64 MiB
    processes: int = 4  # alive at once, threads included (1 without cgroups: no forking)
    file_mb: int = 8  # largest file written
    output_kb: int = 256  # stdout + stderr read before the item is stopped
    wall_seconds: float | None = None  # safety net for sleepers; default 10 × cpu + 20 (a loaded host must not trip it)

    def as_request(self) -> dict[str, Any]:
        out = asdict(self)
        if self.wall_seconds is None:
            out["wall_seconds"] = 10.0 * self.cpu_seconds + 20.0
        return out


@dataclass(frozen=True)
class Outcome:
    """What one item did: ``status`` (one of ``STATUSES``), its value when ``ok``, and an
    error name when it failed (an exception's type, a signal's name)."""

    status: str
    value: Any = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _outcome(msg: dict[str, Any]) -> Outcome:
    """An item's answer as an Outcome: an unknown status or a value of the wrong kind is
    ``malformed``."""
    status, value = msg.get("status"), msg.get("value")
    if status not in STATUSES or not isinstance(value, (int, float, dict, type(None))) or isinstance(value, bool):
        return Outcome("malformed", None, "bad answer")
    return Outcome(str(status), value, str(msg.get("error", ""))[:200])


def bwrap_path() -> str:
    """The ``bwrap`` binary, or a one-line error naming the package to install."""
    path = shutil.which("bwrap")
    if path is None:
        raise SeedLedgerError(f"the sandbox needs bubblewrap, which is missing: {INSTALL_HINT}")
    return path


def _binds() -> list[str]:
    """Read-only binds: /usr (and the /lib, /bin links of a merged /usr) and the Python
    installation this process runs (base prefix and virtual environment)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("lib", "lib64", "lib32", "bin", "sbin"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    seen: list[str] = []
    for prefix in (sys.base_prefix, sys.prefix, str(Path(sys.executable).resolve().parent.parent)):
        for path in dict.fromkeys((str(Path(prefix).resolve()), prefix)):
            if path == "/usr" or path.startswith("/usr/") or path in seen:
                continue
            seen.append(path)
            # bwrap would copy a private parent's mode (/root is 0700): make them passable
            for parent in reversed(Path(path).parents[:-1]):
                args += ["--perms", "0755", "--dir", str(parent)]
            args += ["--ro-bind", str(Path(path).resolve()), path]
    return args


class Sandbox:
    """A launcher process in bwrap, fed one request at a time (thread-safe)."""

    def __init__(self, tmp_mb: int = 32, shm_mb: int = 16, cgroups: bool = True) -> None:
        self.tmp_mb = tmp_mb
        self.shm_mb = shm_mb
        self.use_cgroups = cgroups
        self.cgroups = SandboxCgroups(enabled=False)
        self.coverage: CageCoverage | None = None  # make coverage only (sandbox_coverage.py)
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None
        self._buffer = b""
        self._eof = False
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.starts = 0

    # -- process ---------------------------------------------------------------------
    def _command(self, fds: list[int]) -> list[str]:
        root = os.geteuid() == 0
        if root:  # no user namespace: the launcher switches items to their uid
            isolation = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                         "--unshare-cgroup-try", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                         "--cap-add", "CAP_KILL"]
        else:
            isolation = ["--unshare-all"]
        # an even uid per launcher: items (and a python item's grader) run as it, its program one above
        uid = 1_000_000 + 2 * ((os.getpid() * 32 + next(_uids) % 32) % 1_000_000_000) if root else 0
        env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
               "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1",
               "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               **(self.coverage.env() if self.coverage is not None else {})}
        setenv = [a for k, v in env.items() for a in ("--setenv", k, v)]
        return [
            bwrap_path(), "--die-with-parent", "--new-session", *isolation, *_binds(),
            # each item mounts a /tmp and /dev/shm of its own over these: the launcher's /tmp
            # (libraries' caches at import) is never seen by an item
            "--proc", "/proc", "--dev", "/dev", "--dir", "/dev/shm", "--remount-ro", "/dev",
            "--perms", "0700", "--size", str(self.tmp_mb << 20), "--tmpfs", "/tmp",
            "--dir", "/sandbox", *self.cgroups.binds(),
            *[a for fd, name in zip(fds, _CAGE, strict=True) for a in ("--ro-bind-data", str(fd), f"/sandbox/{name}")],
            *(self.coverage.binds() if self.coverage is not None else []),
            "--remount-ro", "/",  # nothing the launcher imports from can be written
            "--chdir", "/tmp", "--clearenv", *setenv,
            sys.executable, "-s", "-P", "-B", "/sandbox/sandbox_child.py", str(uid), str(self.tmp_mb),
            str(self.shm_mb),
        ]

    def _start(self) -> None:
        self._stop()
        bwrap_path()  # a missing bwrap is said before anything is made
        self.cgroups = SandboxCgroups(enabled=self.use_cgroups)
        self.coverage = cage_coverage()
        pipes = [os.pipe() for _ in _CAGE]
        self._stderr = tempfile.TemporaryFile()
        try:
            self._proc = subprocess.Popen(
                self._command([r for r, _ in pipes]), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=self._stderr, pass_fds=[r for r, _ in pipes], start_new_session=True,
            )
        except OSError as exc:
            for _, w in pipes:
                os.close(w)
            raise SeedLedgerError(f"the sandbox could not start bwrap: {exc.strerror}") from None
        finally:
            for r, _ in pipes:
                os.close(r)
        for (_, write_fd), name in zip(pipes, _CAGE, strict=True):
            try:  # bwrap reads them in order, each to its end
                with os.fdopen(write_fd, "wb") as f:
                    f.write(Path(__file__).with_name(name).read_bytes())
            except BrokenPipeError:
                pass  # bwrap exited at once: its stderr says why (below)
        self._buffer = b""
        self._eof = False
        self.starts += 1
        ready = self._read_line(time.monotonic() + _START_SECONDS)
        if ready is None or not ready.get("ready"):
            if ready is not None and ready.get("ready") is False:
                reason = f"{str(ready.get('error'))[:300]}; {USERNS_HINT}"
            else:
                reason = self._stderr_head() or "no answer from the launcher"
            self._stop()
            raise SeedLedgerError(f"the sandbox (bwrap) failed to start: {reason}")

    def _stderr_head(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        lines = [ln for ln in self._stderr.read(4096).decode("utf-8", "replace").splitlines() if ln.strip()]
        return lines[0].strip() if lines else ""

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if self.coverage is not None:
                self.coverage.finish(proc)
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        self.cgroups.close()
        if self.coverage is not None:
            self.coverage.close()
            self.coverage = None

    def close(self) -> None:
        with self._lock:
            self._stop()

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _read_line(self, deadline: float, cap: int = _MAX_LINE) -> dict[str, Any] | None:
        """The launcher's next JSON line, or None if it died or ``deadline`` passed; a
        line that is not one of its documents is ``{"malformed": ...}``, never a crash."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or len(self._buffer) > cap or not sel.select(left):
                    return None
                data = os.read(fd, 1 << 20)
                if not data:
                    self._eof = True
                    return None
                self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            msg = json.loads(line)  # written by our launcher; items cannot reach its stdout
        except Exception:  # noqa: BLE001 - deep nesting (RecursionError), bad bytes: a verdict
            return {"malformed": "not JSON"}
        return msg if isinstance(msg, dict) else {"malformed": "not a document"}

    def _send(self, request: dict[str, Any]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write((json.dumps(request) + "\n").encode())
        self._proc.stdin.flush()

    # -- requests --------------------------------------------------------------------
    def run(
        self, job: str, items: list[dict[str, Any]], *, limits: Limits = Limits(),
        setup: dict[str, Any] | None = None, item_seconds: float | None = None,
    ) -> list[Outcome]:
        """Run ``job`` on every item, in order, each in its own limited process.

        If the launcher dies on an item (a program killed it), that item is ``died`` and
        the rest run in a fresh launcher; if no answer comes within the item's wall limit
        plus a margin, the item is ``wall_timeout``. Raises SeedLedgerError only when
        the sandbox cannot start or the request itself is refused (a bad setup)."""
        lim = limits.as_request()
        # the launcher gives an item still using CPU up to 3 × its wall limit (see above)
        per_item = item_seconds if item_seconds is not None else 3 * lim["wall_seconds"] + 10.0
        out: list[Outcome] = []
        if not items:
            return out
        with self._lock:
            while len(out) < len(items):
                if not self._alive():
                    self._start()
                rid = next(self._ids)
                rest = items[len(out):]
                self._send({"id": rid, "job": job, "items": rest, "limits": lim, "setup": setup})
                # the first answer of a request may wait for its set-up: imports, and for
                # reasoning-gym the rows a fresh launcher must make again (~0.5 s a puzzle)
                setup_seconds = _START_SECONDS + (4.0 * len(rest) if job.startswith("rg_") else 0.0)
                first = True
                while True:
                    deadline = time.monotonic() + per_item + (setup_seconds if first else 0.0)
                    msg = self._read_line(deadline)
                    first = False
                    if msg is None:
                        status = "died" if self._eof or not self._alive() else "wall_timeout"
                        self._stop()
                        if len(out) < len(items):
                            out.append(Outcome(status))
                        break
                    if "malformed" in msg:  # the stream is out of step: a fresh launcher
                        self._stop()
                        out.append(Outcome("malformed", None, "launcher"))
                        break
                    if msg.get("id") != rid:
                        continue
                    if "refused" in msg:
                        raise SeedLedgerError(f"sandbox {job}: {msg['refused']}")
                    if msg.get("done"):
                        break
                    out.append(_outcome(msg))
        return out

    def ping(self) -> int:
        """Start the sandbox if needed and check it answers; the uid it runs as."""
        with self._lock:
            if not self._alive():
                self._start()
            self._send({"id": 0, "job": "ping"})
            msg = self._read_line(time.monotonic() + _START_SECONDS)
            if msg is None:
                raise SeedLedgerError(f"the sandbox (bwrap) stopped: {self._stderr_head() or 'no answer'}")
            return int(msg["uid"])


_shared: dict[int, Sandbox] = {}


def shared_sandbox() -> Sandbox:
    """This process's sandbox (one per process; a forked child gets its own)."""
    pid = os.getpid()
    if pid not in _shared:
        _shared.clear()
        _shared[pid] = Sandbox()
    return _shared[pid]


def require_sandbox(what: str) -> Sandbox:
    """The shared sandbox, started and answering, or a one-line error for ``what``."""
    try:
        box = shared_sandbox()
        box.ping()
    except SeedLedgerError as exc:
        raise SeedLedgerError(f"{what}: {exc}") from None
    return box


@atexit.register
def _close_all() -> None:
    for box in _shared.values():
        box.close()
