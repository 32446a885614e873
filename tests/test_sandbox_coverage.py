"""coverage.py in the sandbox's cage (``trainers/sandbox_coverage.py``): only a measured
process gives the cage a data directory and a variable; otherwise its command is as strict
as without it."""

from __future__ import annotations

import os

from seedledger.trainers import sandbox_coverage
from seedledger.trainers.sandbox import Sandbox
from seedledger.trainers.sandbox_coverage import CageCoverage


def _command(box: Sandbox) -> list[str]:
    return box._command(list(range(100, 107)))


def _env(argv: list[str]) -> dict[str, str]:
    return {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--setenv"}


def test_outside_coverage_runs_the_cage_has_no_coverage_bind_or_variable(monkeypatch):
    monkeypatch.delenv("COVERAGE_PROCESS_START", raising=False)
    monkeypatch.delenv("COVERAGE_PROCESS_CONFIG", raising=False)
    assert sandbox_coverage.cage_coverage() is None
    box = Sandbox(cgroups=False)
    box.coverage = sandbox_coverage.cage_coverage()
    argv = _command(box)
    assert not any("coverage" in a.lower() for a in argv)
    assert set(_env(argv)) == {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE",
                               "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}
    binds = [argv[i + 2] for i, a in enumerate(argv) if a == "--bind"]  # writable: none without cgroups
    assert binds == []


def test_a_variable_alone_starts_nothing_in_a_process_coverage_does_not_measure(monkeypatch):
    monkeypatch.setenv("COVERAGE_PROCESS_START", "/nonexistent/rc")
    monkeypatch.setattr(sandbox_coverage, "sys", type("S", (), {"modules": {}})())
    assert sandbox_coverage.cage_coverage() is None


def test_a_measured_process_binds_one_data_directory_and_names_the_cage_configuration(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox_coverage, "measured", lambda: (str(tmp_path / ".coverage"), False))
    cov = sandbox_coverage.cage_coverage()
    assert isinstance(cov, CageCoverage)
    box = Sandbox(cgroups=False)
    box.coverage = cov
    try:
        argv = _command(box)
        i = argv.index("--bind")
        assert argv[i:i + 3] == ["--bind", str(cov.data), "/coverage"] and argv.count("--bind") == 1
        assert argv.index("--ro-bind", i) == i + 3 and argv[i + 4:i + 6] == [str(cov.rc), "/sandbox/coveragerc"]
        assert i < argv.index("--remount-ro", argv.index("--dir", argv.index("--tmpfs")))
        assert _env(argv)["COVERAGE_PROCESS_START"] == "/sandbox/coveragerc"
        assert "include = /sandbox/*.py" in cov.rc.read_text() and os.stat(cov.data).st_mode & 0o1777 == 0o1777
        (cov.data / ".coverage.cage.pid2.X1").write_bytes(b"")  # a process killed while it saved
        (cov.data / ".coverage.cage.pid3.X2-journal").write_bytes(b"")
    finally:
        box.close()
    assert box.coverage is None and not cov.root.exists() and list(tmp_path.iterdir()) == []

