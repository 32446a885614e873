"""A fresh, sized root for every caged process of an item (``trainers/sandbox_item.py``).

Standard library only, never imported by seedledger itself: the host passes this file's
text into the sandbox. A fork of the launcher calls ``enter`` before anything of the item
runs. It makes a user namespace of its own uid (the item uid as root, the launcher's uid
otherwise) and in it a mount namespace where ``/tmp`` and ``/dev/shm`` are new tmpfs of
a fixed size and ``/sandbox`` (the launcher's code and cgroups) is covered by an empty
read-only one; the rest is the launcher's read-only root. When the item's last process
exits the namespace goes, and its files with it: nothing an item writes (a tree too deep
to remove, a file where the next item's directory goes, its shared memory) is there for
the next item or left on the host, and nothing needs wiping.

Where the item shares the launcher's uid (an ordinary user: bwrap's user namespace maps
that uid alone) it also gets a PID namespace with its own ``/proc``, so it cannot name
the launcher: no signal (``kill``, ``rt_sigqueueinfo``, ``F_SETOWN``), ``prlimit`` or
``setpriority`` reaches it. Pid 1 there is a reaper of ours (or a ``python`` item's
grader, the program being pid 2); the process that made the namespace waits outside and
exits as the item did, so the launcher reads one status.
As root the item runs as a uid of its own, which guards the launcher already.
"""

from __future__ import annotations

import ctypes
import os
import signal
import struct

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 0x4000, 0x40000
_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                       data.encode() if data else None), f"mount {target}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def enter(tmp_mb: int, shm_mb: int, pidns: bool, reaper: bool = True) -> None:
    """Move this process (and what it starts) into the item's namespaces. With ``pidns``
    it returns in a new process: pid 2 of a PID namespace whose pid 1 is our reaper, or
    without ``reaper`` pid 1 itself (which must then reap, and which the kernel shields
    from its namespace's signals)."""
    uid, gid = os.getuid(), os.getgid()
    _libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: a uid switch cleared it; our uid_map is ours to write
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | (CLONE_NEWPID if pidns else 0)), "unshare")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmp_mb << 20},mode=1777")
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={shm_mb << 20},mode=1777")
    _mount("tmpfs", "/sandbox", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
           "size=4096,nr_inodes=1,mode=555")
    if pidns:
        _pid1(reaper)


def drop_capabilities() -> None:
    """Give up the capabilities the new user namespace granted (bounding, ambient,
    permitted, effective): the item must not remount or unmount its own root."""
    for cap in range(64):
        if _libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP, until EINVAL past the last
            break
    _libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL
    header = ctypes.create_string_buffer(struct.pack("Ii", 0x20080522, 0), 8)  # v3, this process
    _check(_libc.capset(header, ctypes.create_string_buffer(24)), "capset")


def _pid1(reaper: bool) -> None:
    """Fork pid 1 of the new PID namespace, which mounts its /proc and, as ``reaper``,
    forks the item and reaps. The caller stays outside and exits as the namespace's
    process did; returns in the item (pid 2), or without ``reaper`` in pid 1."""
    status_r, status_w = os.pipe()
    init = os.fork()
    if init:
        os.closerange(0, status_r)
        os.closerange(status_r + 1, 1 << 16)
        _mirror(init, status_r)
    os.close(status_r)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.setsid()  # pid 1 leads the namespace's session: kill(0) from the item stays inside
    if not reaper:
        os.close(status_w)  # its own exit status is the one the waiter outside reads
        return
    item = os.fork()
    if item == 0:
        os.close(status_w)
        return
    os.closerange(0, status_w)
    os.closerange(status_w + 1, 1 << 16)
    while True:  # reap orphans until the item ends; our exit then kills the rest
        pid, status = os.waitpid(-1, 0)
        if pid == item:
            os.write(status_w, struct.pack("i", status))
            os._exit(0)


def _mirror(init: int, status_r: int) -> None:
    """Wait for pid 1 and end as the item ended: its exit code, or its signal."""
    _, status = os.waitpid(init, 0)
    data = os.read(status_r, 4)
    if len(data) == 4:
        status = struct.unpack("i", data)[0]
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)
