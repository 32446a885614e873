"""Issue 46's sandbox findings, each a hostile item run through real bubblewrap on both
paths: the suite's own sandbox (root in CI: items as another uid, cgroups) and the one an
ordinary user gets (a real non-root user: bwrap's user namespace, no cgroups), which
was the weaker until every item got namespaces of its own."""

from __future__ import annotations

import pytest

from seedledger.trainers.sandbox import Sandbox
from tests.support.sandbox import need_bwrap, user_box
from tests.test_sandbox import LIMITS

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
