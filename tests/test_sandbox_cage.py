"""The cage bounds the whole item, not each process (issue 31, item 2): one test per hole
the red team measured, each a hostile program made here and run through the sandbox's
entry point in real bubblewrap."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from seedledger.trainers.sandbox import Limits, Sandbox
from seedledger.trainers.sandbox_cgroup import SandboxCgroups
from tests.support.sandbox import need_bwrap
from tests.test_sandbox import LIMITS, run


def _have_cgroups() -> bool:
    probe = SandboxCgroups()
    try:
        return bool(probe.dirs)
    finally:
        probe.close()


CGROUPS = _have_cgroups()

# three children burn 0.6 CPU-s each, under a 1 CPU-s limit, and the parent waits for them
FORKING_BURNER = """
import os, time
def burn(s):
    t = time.process_time()
    while time.process_time() - t < s:
        pass
pids = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        burn(0.6)
        os._exit(0)
    pids.append(pid)
for p in pids:
    os.waitpid(p, 0)
"""


def statuses(outcomes: list) -> list[tuple[str, str]]:
    return [(o.status, o.error) for o in outcomes]


def busy_neighbours(n: int = 2) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


@pytest.mark.skipif(not CGROUPS, reason="needs a writable cgroup (cpuacct or v2)")
def test_cpu_is_counted_over_all_processes_whatever_the_load(box):
    """Alone or beside two busy loops on this host, the forking burner gets the CPU-limit
    verdict: its CPU is summed over its cgroup, and the wall net waits while it computes."""
    alone = run(box, FORKING_BURNER)
    neighbours = busy_neighbours()
    try:
        loaded = run(box, FORKING_BURNER)
    finally:
        for p in neighbours:
            p.kill()
            p.wait()
    assert statuses(alone) == statuses(loaded) == [("timeout", "")]


def test_without_cgroups_an_item_may_not_fork():
    """The fallback: no cgroup, so no forking: one process's RLIMIT_CPU bounds the item,
    and the burner's verdict is the same every time (its first fork fails)."""
    need_bwrap()
    box = Sandbox(cgroups=False)
    try:
        assert box.cgroups.dirs == {}
        outcomes = run(box, FORKING_BURNER, FORKING_BURNER, "while True: pass", "def f(): return 1",
                       test="assert f() == 1")
    finally:
        box.close()
    assert statuses(outcomes) == [("failed", "BlockingIOError")] * 2 + [("timeout", ""), ("ok", "")]


def test_no_namespaces_no_mounts_and_nothing_written_survives(box):
    host_shm = sorted(os.listdir("/dev/shm"))
    hostile = [
        # a user namespace (then a tmpfs of its own), straight or through bwrap itself
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.unshare(0x10000000) != 0: raise OSError(ctypes.get_errno(), 'unshare')",
        "import subprocess\nsubprocess.run(['bwrap', '--unshare-user', '--dev-bind', '/', '/', 'true'], check=True)",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) != 0: raise OSError(ctypes.get_errno(), 'mount')",
        # SysV shared memory outlives a process: refused
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.shmget(0, 1 << 20, 0o1600) < 0: raise OSError(ctypes.get_errno(), 'shmget')",
        # /dev/shm fills at its size (files count), /dev itself is read-only
        "for i in range(8):\n    open(f'/dev/shm/f{i}', 'wb').write(b'x' * (4 << 20))",
        "open('/dev/shm/left', 'w').write('x')\nopen('/tmp/left', 'w').write('x')",
        "open('/dev/left', 'w')",
        "import os; assert os.listdir('/dev/shm') == [] and os.listdir('/tmp') == ['work']",
        # threads (clone3 refused: glibc falls back to clone) and plain subprocesses still work
        "import subprocess, threading\nr = []\nt = threading.Thread(target=lambda: r.append(1))\n"
        "t.start(); t.join(); assert r == [1] and subprocess.run(['true']).returncode == 0",
    ]
    outcomes = run(box, *hostile)
    assert statuses(outcomes) == [
        ("failed", "PermissionError"), ("failed", "CalledProcessError"), ("failed", "PermissionError"),
        ("failed", "PermissionError"), ("failed", "OSError"), ("ok", ""), ("failed", "OSError"), ("ok", ""),
        ("ok", ""),
    ]
    assert sorted(os.listdir("/dev/shm")) == host_shm


@pytest.mark.skipif(not CGROUPS, reason="needs a writable memory cgroup")
def test_memory_is_bounded_over_all_processes(box):
    """Two children hold 200 MiB each under a 256 MiB limit: each is within its own
    address-space limit, but together they pass the item's bound and one is killed."""
    program = """
    import os, time
    pids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            x = bytearray(200 << 20)
            for i in range(0, len(x), 4096):
                x[i] = 1
            time.sleep(1.5)
            os._exit(0)
        pids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids]
    assert codes == [0, 0], codes
    """
    assert statuses(run(box, program)) == [("failed", "AssertionError")]


def test_items_cannot_stop_kill_or_trace_the_launcher(box):
    """SIGSTOP to the launcher, to everyone, to pid 1; ptrace: all refused, and the next
    item runs at once in the same launcher (no stall, no restart)."""
    starts = box.starts
    outcomes = run(
        box,
        "import os, signal; os.kill(os.getppid(), signal.SIGSTOP)",
        "import os, signal; os.kill(-1, signal.SIGSTOP)",
        "import os, signal; os.kill(1, signal.SIGSTOP)",
        "import os, signal; os.killpg(os.getpgid(os.getppid()), signal.SIGSTOP)",
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.ptrace(16, os.getppid(), 0, 0) != 0: raise OSError(ctypes.get_errno(), 'ptrace')",
        "def f(): return 1",
        test="assert f() == 1",
    )
    assert statuses(outcomes) == [("failed", "PermissionError")] * 5 + [("ok", "")]
    assert box.starts == max(starts, 1)


FAKE = b'{"status": "ok", "value": 1.0}'


def test_a_fake_verdict_on_any_fd_does_not_score(box):
    """Written to fd 3 or every fd, then exit 0 (or go on and fail): never ``ok``."""
    spray = (f"import os\nfor fd in range(64):\n    try:\n        os.write(fd, {FAKE!r})\n"
             "    except OSError:\n        pass\n")
    outcomes = run(
        box,
        f"import os\nos.write(3, {FAKE!r})\nos._exit(0)",
        spray + "os._exit(0)",
        spray + "def f(): return 2",
        test="assert f() == 1",
    )
    assert [o.status for o in outcomes] == ["malformed", "malformed", "malformed"]
    assert all(o.value is None for o in outcomes)


def test_a_fake_verdict_from_an_evaluated_answer_does_not_score(box):
    """reasoning-gym's string_insertion scorer ``eval``s the answer in the child: an answer
    writing a perfect verdict to fd 3 and exiting scores nothing."""
    pytest.importorskip("reasoning_gym")
    answer = f"__import__('os').write(3, {FAKE!r}) and __import__('os')._exit(0)"
    setup = {"name": "string_insertion", "seed": 1, "size": 2, "options": {}}
    outcomes = box.run("rg_score", [{"index": 0, "answer": answer}, {"index": 1, "answer": "x"}],
                       setup=setup, limits=Limits(cpu_seconds=5, memory_mb=512))
    assert [o.status for o in outcomes] == ["malformed", "ok"]
    assert outcomes[1].value == 0.0


@pytest.mark.parametrize("garbage", [
    "print('[' * 5000 + ']' * 5000)",
    "import sys; sys.stdout.buffer.write(b'\\xff\\xfe{not json\\n')",
    "print('{\"id\": 1, \"i\": 0, \"status\": \"pwned\", \"value\": 9}')",
])
def test_any_bytes_from_the_cage_are_a_verdict(tmp_path, monkeypatch, garbage):
    """A cage that answers garbage (here a fake bwrap that says ready, then junk): the
    item is ``malformed``; nothing raises."""
    need_bwrap()
    fake = tmp_path / "bwrap"
    fake.write_text(f"#!{sys.executable}\n"
                    "import sys\nprint('{\"ready\": true, \"uid\": 5}', flush=True)\n"
                    f"sys.stdin.readline()\n{garbage}\nsys.stdout.flush()\nsys.stdin.readline()\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    box = Sandbox(cgroups=False)
    try:
        outcomes = box.run("python", [{"program": "", "test": ""}], limits=LIMITS, item_seconds=2)
    finally:
        box.close()
    assert [o.status for o in outcomes] == ["malformed"]


@pytest.mark.skipif(not CGROUPS, reason="needs a writable cgroup")
def test_cgroups_of_a_dead_sandbox_are_removed_by_the_next():
    """A training process killed with its sandbox leaves empty cgroups; the next one's
    start removes those whose pid is gone, and its own on close."""
    probe = SandboxCgroups()
    parents = [path.parent for path in probe.dirs.values()]
    probe.close()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = [parent / f"seedledger-sandbox-{dead.pid}-0" for parent in parents]
    for path in stale:
        (path / "item-1-0").mkdir(parents=True)
    fresh = SandboxCgroups()
    mine = list(fresh.dirs.values())
    assert not any(path.exists() for path in stale) and all(path.is_dir() for path in mine)
    fresh.close()
    assert not any(path.exists() for path in mine)


def test_a_launcher_killed_from_outside_is_died_and_replaced():
    """Items can no longer kill the launcher, but the host still copes when it dies (the
    OOM killer, an operator): the item in flight is ``died``, the next runs in a fresh one."""
    need_bwrap()
    box = Sandbox()
    try:
        box.ping()
        first = box._proc
        assert first is not None
        timer = threading.Timer(1.0, lambda: os.killpg(first.pid, signal.SIGKILL))
        timer.start()
        outcomes = run(box, "import time; time.sleep(60)", "def f(): return 1", test="assert f() == 1")
        timer.join()
        assert statuses(outcomes) == [("died", ""), ("ok", "")] and box.starts == 2
    finally:
        box.close()
