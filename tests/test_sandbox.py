"""The sandbox against hostile programs: each attempt is stopped, scores 0, reports the
same outcome on every run, and leaves the host and the next item untouched."""

from __future__ import annotations

import os
import socket
import textwrap
import threading
from pathlib import Path

import pytest

from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.sandbox import Limits, Sandbox, bwrap_path
from tests.support.sandbox import need_bwrap

LIMITS = Limits(cpu_seconds=1, memory_mb=256, wall_seconds=12)  # wall: a loaded CI host


def run(box: Sandbox, *programs: str, test: str = "", limits: Limits = LIMITS) -> list:
    items = [{"program": textwrap.dedent(p), "test": test} for p in programs]
    return box.run("python", items, limits=limits)


# (name, program, expected status, expected error): the README's hostile-program table.
HOSTILE = [
    ("infinite loop", "while True: pass", "timeout", ""),
    ("fork bomb", "import os\nwhile True: os.fork()", "failed", "BlockingIOError"),
    ("memory hog", "x = bytearray(8 << 30)", "memory", "MemoryError"),
    ("memory hog, small steps", "x = []\nwhile True: x.append(bytearray(1 << 20))", "memory", "MemoryError"),
    ("huge output", "while True: print('x' * 65536)", "output_limit", ""),
    ("sleep forever (no CPU)", "import time; time.sleep(3600)", "wall_timeout", ""),
    ("kill the launcher", "import os, signal; os.kill(os.getppid(), signal.SIGKILL)", "failed", "PermissionError"),
    ("write to /usr", "open('/usr/pwned', 'w')", "failed", "OSError"),
    ("exit 0 before the tests", "import sys; sys.exit(0)", "failed", "SystemExit"),
    ("fake a result on stdout", "print('{\"status\": \"ok\", \"value\": 1.0}')\nraise ValueError", "failed",
     "ValueError"),
    ("huge file", "open('/tmp/big', 'wb').write(b'x' * (64 << 20))", "failed", "OSError"),
]


@pytest.mark.slow
def test_hostile_programs_are_stopped_and_score_nothing(box):
    outcomes = run(box, *[p for _, p, _, _ in HOSTILE])
    got = [(name, o.status, o.error) for (name, *_), o in zip(HOSTILE, outcomes, strict=True)]
    assert got == [(name, status, error) for name, _, status, error in HOSTILE]
    assert all(o.value is None for o in outcomes)
    # and the same outcomes again: CPU-bounded, so deterministic (the wall net aside)
    again = run(box, *[p for _, p, _, _ in HOSTILE if "sleep" not in p])
    assert [o.status for o in again] == [s for _, p, s, _ in HOSTILE if "sleep" not in p]


def test_a_good_program_passes_between_hostile_ones(box):
    good = "def f(x):\n    return x + 1\n"
    outcomes = box.run("python", [
        {"program": good, "test": "assert f(1) == 2"},
        {"program": "import os, signal; os.kill(os.getppid(), signal.SIGKILL)", "test": ""},
        {"program": good, "test": "assert f(1) == 2"},
        {"program": "import os\nwhile True: os.fork()", "test": ""},
        {"program": "import os; os.fork(); os.fork()\ndef f(x): return x + 1", "test": "assert f(1) == 2"},
        {"program": good, "test": "assert f(1) == 3"},
    ], limits=LIMITS)
    assert [o.status for o in outcomes] == ["ok", "failed", "ok", "failed", "ok", "failed"]
    assert outcomes[0].value == 1.0 and outcomes[-1].error == "AssertionError"


def test_the_host_filesystem_and_the_ledger_are_out_of_reach(box, tmp_path, tiny_model_dir):
    ledger = tmp_path / "seedledger.db"
    ledger.write_text("secret")
    target = tmp_path / "written"
    model = next(p for p in Path(tiny_model_dir).iterdir() if p.is_file())  # under the home dir
    outcomes = run(
        box,
        f"open({str(ledger)!r}).read()",
        f"open({str(target)!r}, 'w').write('x')",
        f"open({str(model)!r}, 'rb').read()",
        "open('/proc/1/environ').read()",
        # only the Python installation is there: the venv's directory holds the venv alone
        "import os, sys; assert not os.path.exists('/etc/passwd')\n"
        "assert os.listdir(os.path.dirname(sys.prefix)) == [os.path.basename(sys.prefix)]",
    )
    assert [(o.status, o.error) for o in outcomes] == [
        ("failed", "FileNotFoundError"), ("failed", "FileNotFoundError"), ("failed", "FileNotFoundError"),
        ("failed", "PermissionError"), ("ok", ""),
    ]
    assert not target.exists() and ledger.read_text() == "secret"


def test_items_do_not_see_each_others_files_or_processes(box):
    """The first item's daemon would run as the program's uid: no process of that uid but
    the program itself (and, without root, the PID namespace's reaper, pid 1) is left."""
    outcomes = run(
        box,
        "open('/tmp/left', 'w').write('x')\nimport os, time\nif os.fork() == 0:\n    time.sleep(3600)",
        "import os; assert not os.path.exists('/tmp/left')\n"
        "mine = [p for p in os.listdir('/proc') if p.isdigit() and os.stat(f'/proc/{p}').st_uid == os.getuid()]\n"
        "assert set(mine) <= {'1', str(os.getpid())}, mine",
    )
    assert [o.status for o in outcomes] == ["ok", "ok"]


def test_no_network_even_to_the_hosts_loopback(box):
    """A listener on the host's 127.0.0.1: the sandbox has its own, empty loopback (and no
    other interface), so the connection is refused there and nothing reaches the host."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(2.0)
    port = server.getsockname()[1]
    accepted: list = []

    def accept() -> None:
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    outcomes = run(
        box,
        f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1)",
        "import socket; assert [n for _, n in socket.if_nameindex()] == ['lo']",
    )
    thread.join()
    server.close()
    assert [(o.status, o.error) for o in outcomes] == [("failed", "ConnectionRefusedError"), ("ok", "")]
    assert accepted == []


def test_as_root_the_launcher_drops_to_a_uid_of_its_own(box):
    uid = box.ping()
    assert uid != 0 if os.geteuid() == 0 else uid == os.geteuid()


def test_a_missing_bwrap_is_a_one_line_error_naming_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SeedLedgerError, match=r"needs bubblewrap.*apt-get install bubblewrap") as err:
        bwrap_path()
    assert "\n" not in str(err.value)
    with pytest.raises(SeedLedgerError, match="bubblewrap"):
        Sandbox().ping()


def test_a_sandbox_that_cannot_start_is_an_error_not_a_reward(monkeypatch, tmp_path):
    need_bwrap()
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    with pytest.raises(SeedLedgerError, match="failed to start: bwrap: No permissions"):
        Sandbox().run("python", [{"program": "", "test": ""}])


def test_launcher_source_is_standard_library_only():
    """It runs with nothing of seedledger importable: no import of ours may creep in."""
    source = (Path(__file__).resolve().parents[1] / "trainers" / "sandbox_child.py").read_text()
    for name in ("seedledger", "ledger", "replay", "engine", "trainers"):
        assert f"import {name}" not in source and f"from {name}" not in source


def test_a_deeply_nested_result_is_a_verdict_not_a_crash(box):
    """A program that writes a 5,000-deep JSON document as its result and exits 0: the
    launcher's parser gives up (no nonce, and RecursionError) and the item is ``malformed``,
    scoring nothing; the launcher lives on, so the next item runs in it."""
    deep = "import os\nos.write(3, b'[' * 5000 + b']' * 5000)\nos._exit(0)"
    outcomes = box.run("python", [
        {"program": deep, "test": ""},
        {"program": "def f(x):\n    return x + 1\n", "test": "assert f(1) == 2"},
    ], limits=LIMITS)
    assert [o.status for o in outcomes] == ["malformed", "ok"]
    assert outcomes[0].value is None
