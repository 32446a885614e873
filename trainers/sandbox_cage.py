"""The cage around one sandbox item, applied by the launcher (``trainers/sandbox_child.py``).

Standard library only, never imported by seedledger itself: the host passes this file's
text into the sandbox next to the launcher. Two parts, each bounding an item as a whole
rather than process by process:

- ``ItemCgroup``: the cgroups items run in, one item at a time (v1 cpuacct/memory/pids,
  or v2 ``cpu.stat``/``memory.max``/``pids.max``) under the directories the host bound at
  ``/sandbox/cg``.
  CPU is summed over every process the item ever had (dead ones too), memory counts files
  written to tmpfs, so the verdict depends on the program alone. Without cgroups (an
  ordinary user, no delegation) the item may not fork, so one process's ``RLIMIT_CPU``
  and ``RLIMIT_AS`` bound it.
- ``install_seccomp``: no namespaces, mounts, ptrace, signals to the launcher or limits on
  another process, whatever uid the item runs as, and no system call newer than those we
  vetted (io_uring and whatever comes next answer ENOSYS, as on an older kernel). x86-64;
  elsewhere the uid switch or the PID namespace (``sandbox_ns.py``) guards the launcher.
"""

from __future__ import annotations

import ctypes
import platform
import struct
from pathlib import Path

CG_ROOT = Path("/sandbox/cg")

# --- seccomp ---------------------------------------------------------------------------
_X86_64 = 0xC000003E
_DENY_ALWAYS = {  # x86-64 numbers: namespaces, mounts, tracing, other processes' memory
    "ptrace": 101, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
    "unshare": 272, "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
    "fspick": 433, "pidfd_open": 434, "pidfd_send_signal": 424, "mount_setattr": 442,
    "bpf": 321, "userfaultfd": 323, "perf_event_open": 298, "keyctl": 250,
    "add_key": 248, "request_key": 249,
    "shmget": 29, "semget": 64, "msgget": 68, "mq_open": 240,  # IPC that outlives the item
}
_CLONE, _CLONE3 = 56, 435
_SIGNALS = (62, 200, 234, 129, 297)  # kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo: target first
_PRLIMIT = 302  # prlimit64: pid 0 (this process, what setrlimit sends) only
_NEWEST_VETTED = 423  # every later number is new: allowed only when listed here
_NEW_ALLOWED = (436, 437, 439, 441, 449, 451, 452, 453, 454, 455, 456, 462)
# close_range, openat2, faccessat2, epoll_pwait2, futex_waitv, cachestat, fchmodat2,
# map_shadow_stack, futex_wake/wait/requeue, mseal: what glibc and CPython call
_NS_FLAGS = 0x7E020080  # CLONE_NEW{NS,CGROUP,UTS,IPC,USER,PID,NET,TIME}
_EPERM, _ENOSYS = 1, 38


def _program(launcher_pid: int | None) -> list[tuple[int, object, object, int]]:
    """Classic BPF with symbolic jump targets: (code, true label, false label, k).
    ``launcher_pid`` None: the launcher is in no namespace the item can name."""
    ld, jeq, jset, jge, ret = 0x20, 0x15, 0x45, 0x35, 0x06
    prog: list[tuple[int, object, object, int]] = [
        (ld, 0, 0, 4), (jeq, 0, "deny", _X86_64),  # another ABI: refuse everything
        (ld, 0, 0, 0), (jge, "deny", 0, 0x40000000),  # x32 numbers
    ]
    prog += [(jeq, "deny", 0, nr) for nr in sorted(_DENY_ALWAYS.values())]
    prog += [(jeq, "enosys", 0, _CLONE3), (jeq, "clone", 0, _CLONE), (jeq, "prlimit", 0, _PRLIMIT)]
    prog += [(jeq, "signal", 0, nr) for nr in _SIGNALS]
    prog += [(jge, 0, "allow", _NEWEST_VETTED + 1)]
    prog += [(jeq, "allow", 0, nr) for nr in _NEW_ALLOWED]
    prog += [
        (ret, 0, 0, 0x00050000 | _ENOSYS),
        "clone", (ld, 0, 0, 16), (jset, "deny", 0, _NS_FLAGS), (ret, 0, 0, 0x7FFF0000),
        "prlimit", (ld, 0, 0, 16), (jeq, "allow", "deny", 0),
        # own group (0) is fine (the item leads its own session); -1, any group, pid 1
        # and the launcher are not
        "signal", (ld, 0, 0, 16), (jeq, "allow", 0, 0), (jset, "deny", 0, 0x80000000),
        (jeq, "deny", 0, 1),
    ]
    if launcher_pid is not None:
        prog += [(jeq, "deny", 0, launcher_pid)]
    prog += [
        "allow", (ret, 0, 0, 0x7FFF0000),
        "deny", (ret, 0, 0, 0x00050000 | _EPERM),
        "enosys", (ret, 0, 0, 0x00050000 | _ENOSYS),
    ]
    return prog  # type: ignore[return-value]


def _assemble(prog: list) -> bytes:
    labels: dict[str, int] = {}
    code: list[tuple[int, object, object, int]] = []
    for entry in prog:
        if isinstance(entry, str):
            labels[entry] = len(code)
        else:
            code.append(entry)
    out = b""
    for i, (op, jt, jf, k) in enumerate(code):
        rel = [0 if t == 0 else labels[str(t)] - i - 1 for t in (jt, jf)]
        out += struct.pack("<HBBI", op, rel[0], rel[1], k & 0xFFFFFFFF)
    return out


def install_seccomp(launcher_pid: int | None) -> bool:
    """Filter this process and everything it starts; False where the ABI is not x86-64."""
    if platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "no_new_privs")
    filt = _assemble(_program(launcher_pid))
    buf = ctypes.create_string_buffer(filt, len(filt))

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Fprog(len(filt) // 8, ctypes.addressof(buf))
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, MODE_FILTER
        raise OSError(ctypes.get_errno(), "seccomp")
    return True


# --- cgroups ---------------------------------------------------------------------------
def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class ItemCgroup:
    """The cgroups items run in (one per mounted hierarchy), one item at a time: ``begin``
    takes the baselines its CPU and memory events are read against."""

    def __init__(self, name: str) -> None:
        self.dirs = {}
        self._cpu0 = 0.0
        self._mem0 = 0
        if CG_ROOT.is_dir():
            for root in sorted(CG_ROOT.iterdir()):
                path = root / name
                try:
                    path.mkdir(exist_ok=True)
                except OSError:
                    continue  # that hierarchy does not bound this item
                self.dirs[root.name] = path

    @property
    def active(self) -> bool:
        """Whether CPU is accounted over the whole item (else: no forking)."""
        return "cpuacct" in self.dirs or "unified" in self.dirs

    def limit(self, memory_bytes: int, pids: int) -> None:
        mem = self.dirs.get("memory")
        if mem is not None:
            files = [mem / "memory.limit_in_bytes"]
            if (mem / "memory.memsw.limit_in_bytes").exists():  # no swap escape
                files.append(mem / "memory.memsw.limit_in_bytes")
            try:  # memory ≤ memory+swap at every step: lowering goes memory first
                for path in files:
                    _write(path, str(memory_bytes))
            except OSError:
                try:
                    for path in reversed(files):
                        _write(path, str(memory_bytes))
                except OSError:
                    pass  # usage above a lower limit that reclaim could not free: the last one holds
        if "pids" in self.dirs:
            _write(self.dirs["pids"] / "pids.max", str(pids))
        v2 = self.dirs.get("unified")
        if v2 is not None:
            if (v2 / "memory.max").exists():
                _write(v2 / "memory.max", str(memory_bytes))
                if (v2 / "memory.swap.max").exists():
                    _write(v2 / "memory.swap.max", "0")
            if (v2 / "pids.max").exists():
                _write(v2 / "pids.max", str(pids))

    def begin(self) -> None:
        """Baselines for the next item (the last one's processes are all gone)."""
        self._cpu0, self._mem0 = 0.0, 0
        self._cpu0 = self.cpu_seconds() or 0.0
        self._mem0 = self._memory_events()

    def join(self) -> None:
        """Move the calling process (the item, before it runs anything) in."""
        for path in self.dirs.values():
            _write(path / "cgroup.procs", "0")

    def cpu_seconds(self) -> float | None:
        """CPU used by every process the item had, or None without accounting."""
        try:
            if "cpuacct" in self.dirs:
                return int((self.dirs["cpuacct"] / "cpuacct.usage").read_text()) / 1e9 - self._cpu0
            if "unified" in self.dirs:
                for line in (self.dirs["unified"] / "cpu.stat").read_text().splitlines():
                    if line.startswith("usage_usec "):
                        return int(line.split()[1]) / 1e6 - self._cpu0
        except (OSError, ValueError):
            return None
        return None

    def hit_memory(self) -> bool:
        """Whether the item reached its memory bound (the kernel refused or killed)."""
        return self._memory_events() > self._mem0

    def _memory_events(self) -> int:
        try:
            if "memory" in self.dirs:
                return int((self.dirs["memory"] / "memory.failcnt").read_text())
            v2 = self.dirs.get("unified")
            if v2 is not None and (v2 / "memory.events").exists():
                events = dict(ln.split() for ln in (v2 / "memory.events").read_text().splitlines())
                return int(events.get("max", 0)) + int(events.get("oom_kill", 0))
        except (OSError, ValueError):
            return 0
        return 0

    def remove(self) -> None:
        """Remove the cgroups (every process in them is dead and reaped); the host also
        removes what a killed launcher left."""
        for path in self.dirs.values():
            try:
                path.rmdir()
            except OSError:
                pass
