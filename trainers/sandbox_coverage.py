"""coverage.py inside the sandbox's cage, for ``make coverage`` only.

The caged modules (``sandbox_child.py`` and the siblings that ``sandbox.py`` passes in)
run in a launcher that bwrap starts with an empty environment on a read-only root, and
each item runs in forks of it with a fresh root of their own (``sandbox_ns.py``), which
end in ``os._exit``: coverage.py would neither start there nor find a place to write.
When this process is itself measured and passes coverage.py on to its subprocesses
(``COVERAGE_PROCESS_START`` or ``COVERAGE_PROCESS_CONFIG`` set: ``make coverage``),
``cage_coverage`` gives each launcher a writable data directory at ``/coverage`` (made
here, a fresh one per launcher), a configuration of its own at ``/sandbox/coveragerc``
(measure ``/sandbox/*.py``, save at ``os._exit``) and ``COVERAGE_PROCESS_START`` naming
it. ``close`` moves the data files beside this process's, where ``coverage combine``
finds them; ``[paths]`` in ``.coveragerc`` maps ``/sandbox/`` back to ``trainers/``.
Otherwise it is None and the cage is exactly as without it: no bind, no variable,
nothing started. Only in such a run may an item write there (its own data files).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

DATA = "/coverage"  # in the cage: outside /tmp, /dev/shm and /sandbox, which items get anew
RC = "/sandbox/coveragerc"


def measured() -> tuple[str, bool] | None:
    """This process's data file and branch setting, when coverage.py measures it and
    passes itself on to subprocesses (never imported here otherwise)."""
    if not (os.environ.get("COVERAGE_PROCESS_START") or os.environ.get("COVERAGE_PROCESS_CONFIG")):
        return None  # coverage.py 7.17's `patch = subprocess` sets the second
    module = sys.modules.get("coverage")
    current = module.Coverage.current() if module is not None else None
    if current is None:
        return None
    return os.path.abspath(current.config.data_file), bool(current.config.branch)


class CageCoverage:
    """One launcher's coverage data directory and configuration, on the host."""

    def __init__(self, data_file: str, branch: bool) -> None:
        self.data_file = Path(data_file)
        self.pid = os.getpid()  # a forked child's exit leaves our directory alone
        self.root = Path(tempfile.mkdtemp(prefix="seedledger-cage-coverage-"))
        self.data = self.root / "data"
        self.data.mkdir()
        self.data.chmod(0o1777)  # as root, items write as uids of their own
        self.rc = self.root / "coveragerc"
        self.rc.write_text(f"[run]\nparallel = True\nbranch = {branch}\ninclude = /sandbox/*.py\n"
                           f"data_file = {DATA}/{self.data_file.name}\npatch = _exit\n")
        atexit.register(self.close)  # a sandbox never closed: its items' data still counts

    def binds(self) -> list[str]:
        """bwrap arguments: the data directory writable, the configuration read-only."""
        return ["--bind", str(self.data), DATA, "--ro-bind", str(self.rc), RC]

    def env(self) -> dict[str, str]:
        return {"COVERAGE_PROCESS_START": RC}

    def finish(self, proc: subprocess.Popen[bytes]) -> None:
        """Let the launcher end on its own (stdin closed), saving its data as it exits;
        after a few seconds the host kills it as always."""
        if proc.poll() is None and proc.stdin is not None:
            try:
                proc.stdin.close()
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass

    def close(self) -> None:
        """Move the cage's data files beside this process's, then remove the directory."""
        if os.getpid() == self.pid and self.root.is_dir():
            move_data(self.data, self.data_file)
            shutil.rmtree(self.root, ignore_errors=True)


def move_data(source: Path, data_file: Path) -> None:
    """Move the whole data files in ``source`` beside ``data_file``: a process killed while
    it saved (the launcher kills an item's other processes once it has ended) leaves one
    without its schema, which ``coverage combine`` would warn about."""
    for path in source.glob(f"{data_file.name}.*"):
        if path.name.endswith(("-journal", "-wal", "-shm")):
            continue
        try:
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
                whole = db.execute("select version from coverage_schema").fetchone() is not None
            if whole:
                shutil.move(str(path), data_file.parent / path.name)
        except (sqlite3.Error, OSError):
            continue  # a data file is worth less than a sandbox that closes


def cage_coverage() -> CageCoverage | None:
    """A launcher's coverage set-up where this process is measured, else None."""
    found = measured()
    return CageCoverage(*found) if found is not None else None
