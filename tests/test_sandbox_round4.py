"""Issue 46's sandbox findings, each a hostile item run through real bubblewrap on both
paths: the suite's own sandbox (root in CI: items as another uid, cgroups) and the one an
ordinary user gets (a real non-root user: bwrap's user namespace, no cgroups), which
was the weaker until every item got namespaces of its own."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest

from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.sandbox import Limits, Sandbox
from tests.support.sandbox import need_bwrap, user_box
from tests.test_sandbox import HOSTILE, LIMITS

GOOD = {"program": "def f(x):\n    return x + 1\n", "test": "assert f(1) == 2"}


@pytest.fixture(scope="module", params=["own", "unprivileged"])
def anybox(request):
    need_bwrap()
    box = Sandbox() if request.param == "own" else user_box()
    yield box
    box.close()


def statuses(outcomes: list) -> list[tuple[str, str]]:
    return [(o.status, o.error) for o in outcomes]


def items(*programs: str, test: str = "") -> list[dict]:
    return [{"program": p, "test": test} for p in programs]


# --- 1. nothing an item writes reaches the next one -----------------------------------------
DEEP = """
import os
for root in ('/tmp', '/dev/shm'):
    os.chdir(root)
    for _ in range(3000):
        os.mkdir('d')
        os.chdir('d')
os.chdir('/')
os.rmdir('/tmp/work')
open('/tmp/work', 'w').write('a file where the next item makes its directory')
"""
FRESH = """
import os
assert os.getcwd() == '/tmp/work' and os.listdir('/tmp') == ['work'] and os.listdir('/dev/shm') == []
for root in ('/tmp', '/dev/shm'):
    st = os.statvfs(root)
    assert st.f_bfree == st.f_blocks, (root, st.f_bfree, st.f_blocks)
"""


def test_a_deep_tree_and_a_file_at_the_work_directory_leave_nothing_behind(anybox):
    """Round 4: a 3,000-deep tree beat the wipe's rmtree and a file at /tmp/work made every
    later item crash. Each item now mounts a fresh /tmp and /dev/shm: the next item, in
    the same launcher, finds them empty and whole."""
    anybox.ping()
    starts = anybox.starts
    outcomes = anybox.run("python", [*items(DEEP, FRESH), GOOD, GOOD], limits=LIMITS)
    assert statuses(outcomes) == [("ok", "")] * 4 and anybox.starts == starts


# --- 2a, 2b. no writable root: nothing left on the host, no module planted -------------------
FILL = """
import os, sys
for path in ('/fill', '/sandbox/fill', '/usr/fill', '/dev/fill', os.path.join(sys.prefix, 'fill')):
    try:
        open(path, 'wb')
    except OSError:
        continue
    raise SystemExit(f'{path} is writable')
for root in ('/tmp', '/dev/shm'):
    try:
        for i in range(64):
            with open(f'{root}/fill{i}', 'wb') as f:
                f.write(b'x' * (8 << 20))
    except OSError:
        pass
"""


def _shmem_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no Shmem in /proc/meminfo")


def test_items_leave_no_shared_memory_on_the_host(anybox):
    """Round 4: four items each `ok` left 2,055 MiB of host shared memory (an unsized,
    writable root as an ordinary user). The root is read-only now, and what an item
    writes to its own tmpfs (48 MiB here) is freed when its namespace goes."""
    anybox.ping()
    before = _shmem_mib()
    outcomes = anybox.run("python", items(FILL, FILL, FILL, FILL), limits=LIMITS)
    grown = _shmem_mib() - before
    assert statuses(outcomes) == [("ok", "")] * 4
    assert grown < 64, f"host shared memory grew by {grown:.0f} MiB"  # 192 MiB if the tmpfs stayed


PLANT = """
import os, sys
for d in ('/sandbox', '/', *sys.path):
    try:
        with open(os.path.join(d or '.', 'statistics.py'), 'w') as f:
            f.write('def mean(data):\\n    return 5\\n')
    except OSError:
        pass
"""


def test_a_module_planted_by_one_item_is_not_imported_by_the_next(anybox):
    """Round 4: an item wrote /sandbox/statistics.py and a later wrong program importing it
    scored 1.0. Nothing on the import path is writable; the wrong program fails."""
    wrong = {"program": "import statistics\ndef f():\n    return statistics.mean([1, 2])\n", "test": "assert f() == 5"}
    outcomes = anybox.run("python", [*items(PLANT), wrong], limits=LIMITS)
    assert statuses(outcomes) == [("ok", ""), ("failed", "AssertionError")]


# --- 2c, 2d. the launcher cannot be limited, stopped or named --------------------------------
PRLIMIT = """
import os, resource
hits = []
for pid in [os.getppid(), *range(1, 1 << 15)]:
    if pid == os.getpid():
        continue
    try:
        resource.prlimit(pid, resource.RLIMIT_AS, (1 << 20, 1 << 20))
        hits.append(pid)
    except (OSError, ValueError):
        pass
assert hits == [], hits
"""
STOP = """
import ctypes, fcntl, os, signal
libc = ctypes.CDLL(None, use_errno=True)
r, w = os.pipe()
info = (ctypes.c_int * 32)(signal.SIGSTOP, 0, -1)  # siginfo: signo, errno, SI_QUEUE
for pid in [os.getppid(), *range(1, 1 << 12)]:
    if pid in (0, os.getpid()):
        continue
    libc.syscall(129, pid, signal.SIGSTOP, info)  # rt_sigqueueinfo
    libc.syscall(297, pid, pid, signal.SIGSTOP, info)  # rt_tgsigqueueinfo
    try:
        fcntl.fcntl(r, fcntl.F_SETOWN, pid)
    except OSError:
        continue
    fcntl.fcntl(r, 10, signal.SIGSTOP)  # F_SETSIG: the owner gets SIGSTOP on I/O
    fcntl.fcntl(r, fcntl.F_SETFL, os.O_ASYNC | os.O_NONBLOCK)
    os.write(w, b'x')
    os.read(r, 1)
"""


def test_an_item_cannot_lower_the_launchers_limits(anybox):
    """Round 4: `prlimit` on the launcher (same uid) made every later item crash. Tried
    on every pid it could name: refused, and a later item that needs memory runs."""
    anybox.ping()
    starts = anybox.starts
    big = {"program": "x = bytearray(128 << 20)", "test": ""}
    outcomes = anybox.run("python", [*items(PRLIMIT), big, GOOD], limits=LIMITS)
    assert statuses(outcomes) == [("ok", "")] * 3 and anybox.starts == starts


def test_an_item_cannot_stop_the_launcher_by_sigqueue_or_io_signals(anybox):
    """Round 4: SIGSTOP reached the launcher through rt_sigqueueinfo and a pipe set to
    signal its owner on I/O (F_SETOWN/F_SETSIG), 94-190 s stalls. Sent to every pid the
    item can name: the next items answer at once, from the same launcher."""
    anybox.ping()
    starts = anybox.starts
    assert statuses(anybox.run("python", items(STOP), limits=LIMITS)) == [("ok", "")]
    t = time.monotonic()
    outcomes = anybox.run("python", [GOOD, GOOD], limits=LIMITS)
    assert statuses(outcomes) == [("ok", "")] * 2 and anybox.starts == starts
    assert time.monotonic() - t < 10


NAMES = """
import os
me = os.getpid()
assert os.getppid() == 1 and sorted(p for p in os.listdir('/proc') if p.isdigit()) == sorted(['1', str(me)])
named = []
for pid in range(2, 1 << 15):
    if pid != me:
        try:
            os.kill(pid, 0)
            named.append(pid)
        except ProcessLookupError:
            pass
assert named == [], named
"""


def test_an_unprivileged_item_cannot_name_the_launcher():
    """The root fix for an ordinary user, where items share the launcher's uid: a PID
    namespace per item with its own /proc, holding the item and our reaper (pid 1) only."""
    box = user_box()
    try:
        assert statuses(box.run("python", items(NAMES), limits=LIMITS)) == [("ok", "")]
    finally:
        box.close()


def test_the_hostile_programs_on_the_unprivileged_path():
    """The hostile table of tests/test_sandbox.py as an ordinary user (no cgroups: the
    fork bomb's first fork fails); the sleeper is left out (the wall net is the same)."""
    box = user_box()
    try:
        table = [row for row in HOSTILE if "sleep" not in row[1]]
        outcomes = box.run("python", items(*[p for _, p, _, _ in table]), limits=LIMITS)
    finally:
        box.close()
    assert [(n, o.status, o.error) for (n, *_), o in zip(table, outcomes, strict=True)] == \
        [(n, s, e) for n, _, s, e in table]


# --- 4. generator options are built in the cage first ---------------------------------------
def test_generator_options_are_built_within_the_item_limits(anybox):
    """Round 4: count_primes with max_n = 2e8 took 3.4 GB and 27 CPU-s in the unlimited
    launcher. The generator is built in a cage under the task's limits first; one that
    does not fit is refused in one line, and the launcher goes on serving."""
    pytest.importorskip("reasoning_gym")
    hog = {"name": "count_primes", "seed": 1, "size": 4, "options": {"max_n": 20_000_000}}
    with pytest.raises(SeedLedgerError, match=r"building count_primes within the task's limits "
                                              r"\(128 MiB, 60 CPU-s\): memory") as err:
        anybox.run("rg_rows", [{"index": 0}], setup=hog, limits=Limits(cpu_seconds=5, memory_mb=128))
    assert "\n" not in str(err.value)
    fine = {**hog, "options": {"max_n": 1000}}
    outcomes = anybox.run("rg_rows", [{"index": 0}], setup=fine, limits=Limits(cpu_seconds=5, memory_mb=512))
    assert outcomes[0].ok and "prime" in outcomes[0].value["question"]


def test_a_stored_configs_generator_options_are_refused_by_the_task():
    """The same through the task, as `resume` or `evaluate` of a foreign run builds it."""
    need_bwrap()
    pytest.importorskip("reasoning_gym")
    from seedledger.trainers.tasks import reasoning_gym_task

    with pytest.raises(SeedLedgerError, match=r"^task reasoning_gym:count_primes: .*building count_primes "
                                              r"within the task's limits \(128 MiB") as err:
        reasoning_gym_task.load("count_primes", options={"max_n": 20_000_000}, memory_mb=128)
    assert "\n" not in str(err.value)


# --- 13. no io_uring, nor any system call newer than those vetted -----------------------------
URING = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
got = []
for nr in (425, 426, 427, 447, 459, 470):  # io_uring_setup, _enter, _register, memfd_secret, lsm, next
    got.append((nr, libc.syscall(nr, 8, params, 0, 0, 0), ctypes.get_errno()))
assert all(ret == -1 and err == 38 for _, ret, err in got), got  # ENOSYS, as on an older kernel
os.closerange(5, 64)  # close_range, vetted, still works
"""


def test_io_uring_and_unvetted_new_system_calls_are_refused(anybox):
    """Round 4: the cage allowed io_uring_setup (its operations pass seccomp unseen)."""
    assert statuses(anybox.run("python", items(URING), limits=LIMITS)) == [("ok", "")]


# --- the verdict is graded outside the program's process --------------------------------------
VERDICT = '{"status": "ok", "value": 1.0}'
FORGERIES = [
    ("read the nonce, write a verdict",
     f"import os, select\nnonce = os.read(4, 64) if select.select([4], [], [], 0.2)[0] else b''\n"
     f"for fd in range(3, 64):\n    try:\n        os.write(fd, nonce + {VERDICT!r}.encode())\n    except OSError:\n"
     f"        pass\nos._exit(0)", "assert False", ("malformed", "program")),
    ("patch json.dumps", f"import json\njson.dumps = lambda *a, **k: {VERDICT!r}\ndef f():\n    return 1",
     "assert f() == 2", ("failed", "AssertionError")),
    ("always equal", "class A:\n    def __eq__(self, other):\n        return True\ndef f():\n    return A()",
     "assert f() == 2", ("failed", "TypeError")),
    ("an int equal to anything", "class I(int):\n    def __eq__(self, other):\n        return True\ndef f():\n"
     "    return I(7)", "assert f() == 2", ("failed", "AssertionError")),
    ("always true", "class T:\n    def __bool__(self):\n        return True\ndef valid():\n    return T()",
     "assert valid()", ("failed", "TypeError")),
    ("exit 0 inside a call", "import os\ndef f():\n    os._exit(0)", "assert f() == 2", ("crashed", "exit 0")),
]


def test_a_program_cannot_forge_its_verdict(anybox):
    """The limit documented until round 4: the program graded itself. Now its test runs
    in another process that holds the verdict and gets plain data from it."""
    outcomes = anybox.run("python", [{"program": p, "test": t} for _, p, t, _ in FORGERIES], limits=LIMITS)
    assert [(n, o.status, o.error) for (n, *_), o in zip(FORGERIES, outcomes, strict=True)] == \
        [(n, *want) for n, _, _, want in FORGERIES]
    assert all(o.value is None for o in outcomes)


HONEST = [
    ("def f(x):\n    return [x, (x,), {x}, {x: [x]}, b'x', bytearray(b'y'), 1.5, None, True, 10 ** 40, 'é',"
     " frozenset({x}), 2j, range(3)]",
     "assert f(1) == [1, (1,), {1}, {1: [1]}, b'x', bytearray(b'y'), 1.5, None, True, 10 ** 40, 'é', "
     "frozenset({1}), 2j, range(3)]"),
    ("def squares(n):\n    return (i * i for i in range(n))", "assert list(squares(3)) == [0, 1, 4]"),
    ("import math\ndef area(r):\n    return math.pi * r * r", "assert math.isclose(area(1), 3.14159, rel_tol=1e-4)"),
    ("class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\ndef widest(pairs):\n"
     "    return max(p.b - p.a for p in pairs)", "assert widest([Pair(1, 5), Pair(2, 3)]) == 4"),
    ("class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n"
     "        self.items.append(x)\n    def __len__(self):\n        return len(self.items)",
     "s = Stack()\ns.push(1)\ns.push(2)\nassert len(s) == 2 and s.items == [1, 2] and list(s.items) == [1, 2]"),
    ("def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x",
     "try:\n    f(-1)\nexcept ValueError:\n    pass\nelse:\n    raise AssertionError('no ValueError')"),
    ("from fractions import Fraction\ndef half():\n    return Fraction(1, 2)",
     "from fractions import Fraction\nassert half() == Fraction(1, 2)"),
    ("def double(x):\n    return 2 * x",
     "METADATA = {}\ndef check(candidate):\n    assert candidate(2) == 4\ncheck(double)"),
    ("import numpy as np\ndef f():\n    return np.int64(3), np.arange(3)", "assert f() == (3, [0, 1, 2])"),
]


def test_honest_programs_still_pass_their_tests(anybox):
    """Plain data of every standard kind crosses intact; the program's own objects are
    called and read where they live; its exceptions reach the test by type."""
    outcomes = anybox.run("python", [{"program": p, "test": t} for p, t in HONEST], limits=LIMITS)
    assert statuses(outcomes) == [("ok", "")] * len(HONEST)


# --- a machine that cannot cage items ----------------------------------------------------------
def test_a_machine_without_nested_user_namespaces_is_refused_with_what_to_do():
    """Items need user namespaces inside the sandbox; where there are none (here a bwrap
    that disables them) the sandbox refuses to start, in one line saying what to allow."""
    need_bwrap()
    bin_dir = Path(tempfile.mkdtemp(prefix="sbx-fake-bwrap-"))  # the non-root user must reach it
    bin_dir.chmod(0o755)
    fake = bin_dir / "bwrap"
    fake.write_text(f"#!/bin/sh\nexec {shutil.which('bwrap')} --unshare-user --disable-userns \"$@\"\n")
    fake.chmod(0o755)
    box = user_box(extra_path=str(bin_dir))
    try:
        with pytest.raises(SeedLedgerError, match=r"failed to start: items cannot be caged here: unshare: .*"
                                                  r"allow unprivileged user namespaces") as err:
            box.ping()
    finally:
        box.close()
        shutil.rmtree(bin_dir)
    assert "\n" not in str(err.value)


SHADOWS = [
    ("a builtin the test uses", "def abs(x):\n    return 0\ndef f():\n    return 5", "assert abs(f() - 1) < 0.5"),
    ("a module the test uses",
     "class math:\n    @staticmethod\n    def isclose(*args, **kwargs):\n        return True\n"
     "def f():\n    return 5", "assert math.isclose(f(), 1)"),
    ("a module under the name of another", "import json as math\ndef f():\n    return 5",
     "assert math.isclose(f(), 1)"),
]


def test_a_program_cannot_replace_what_its_test_relies_on(anybox):
    """A global named like a builtin or a standard-library module is not the program's
    in its test: `abs` and `math` are Python's, so these wrong programs fail."""
    outcomes = anybox.run("python", [{"program": p, "test": t} for _, p, t in SHADOWS], limits=LIMITS)
    assert [(n, o.status, o.error) for (n, *_), o in zip(SHADOWS, outcomes, strict=True)] == \
        [(n, "failed", "AssertionError") for n, _, _ in SHADOWS]
