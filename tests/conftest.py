"""Shared fixtures. Models come from the real cache (`$SEEDLEDGER_HOME`), provisioned once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `tests.support` imports from the checkout
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# `backend: auto` takes hf in the suite (subprocesses inherit this): its runs last seconds,
# less than a vLLM engine's start-up; vLLM tests say `backend: vllm`, and
# tests/test_backend_choice.py unsets it to test the choice itself
os.environ.setdefault("SEEDLEDGER_AUTO_BACKEND", "hf")
# Two workers on two cores, each with vLLM engines, Ray actors and CLI subprocesses running
# torch's OpenMP: threads that spin while they wait for a core take it from the thread they
# wait for. Sleeping instead cut test_vllm_lora + test_vllm_backend at -n 2 from 434 to 252
# CPU s (227 to 158 s wall, 2026-12-06); set before torch loads OpenMP here or in a child.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The `tiny` alias (~3.3M random parameters, SmolLM2 tokenizer), provisioned once."""
    from seedledger.engine.runtime.models.resolve import resolve_model

    return resolve_model("tiny")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The default model, SmolLM2-135M-Instruct in fp32 (a one-time ~30 s provisioning)."""
    import importlib.metadata

    from seedledger.engine.runtime.models.resolve import INSTALL_HINT, SMOLLM2_PACKAGE, resolve_model

    try:
        importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{SMOLLM2_PACKAGE} is not installed: {INSTALL_HINT}")
    return resolve_model("smollm2-135m-instruct")


# -- PostgreSQL: one throw-away server per session, one database per test ----------------

_pg_outcomes: dict[str, int] = {}


@pytest.fixture(scope="session")
def pg_server():
    """A real PostgreSQL server on a random loopback port (tests.support.pgserver); the
    tests that need it skip, with the reason, where none can be started."""
    from tests.support.pgserver import PgServer, PgUnavailable

    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("PostgreSQL tests need psycopg (pip install -e '.[postgres]')")
    try:
        server = PgServer.start()
    except PgUnavailable as exc:
        pytest.skip(f"no PostgreSQL server: {exc}")
    yield server
    server.stop()


@pytest.fixture
def pg_url(pg_server) -> str:
    """A fresh, empty database on the session's server (postgresql+psycopg:// URL)."""
    return pg_server.database()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def ledger_url(request, tmp_path) -> str:
    """The ledger location for tests that run on both databases: an SQLite file in
    tmp_path, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "l.db")
    return request.getfixturevalue("pg_url")


def pytest_runtest_logreport(report) -> None:
    """Count the PostgreSQL tests' outcomes for the summary line below (from the report's
    keywords, which carry the marker: under pytest-xdist the reports reach this process
    from the workers, and the items were collected there)."""
    if "postgres" not in report.keywords:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _pg_outcomes[report.outcome] = _pg_outcomes.get(report.outcome, 0) + 1


def pytest_terminal_summary(terminalreporter) -> None:
    """One line with the PostgreSQL tests' counts, so CI's log shows them."""
    if _pg_outcomes:
        counts = ", ".join(f"{_pg_outcomes.get(k, 0)} {k}" for k in ("passed", "failed", "skipped"))
        terminalreporter.write_line(f"postgresql tests (real server): {counts}")


@pytest.fixture(scope="module")
def box():
    """A real bubblewrap sandbox shared by a module's tests (skips where bwrap is missing)."""
    from seedledger.trainers.sandbox import Sandbox
    from tests.support.sandbox import need_bwrap

    need_bwrap()
    sandbox = Sandbox()
    yield sandbox
    sandbox.close()


# Worker-minutes each long file took (wall, from a cgroup-per-file profile of make test,
# 2026-12-06, a quiet 2-core machine, before that day's cuts). `--dist loadfile` hands whole
# files to the workers in collection order, so the long files go first: the short ones then
# fill the gaps, and the workers finish together instead of one running a long file alone
# (make test passes --no-loadscope-reorder: xdist's default reorders files by their number
# of tests, which put test_many_writers' two long tests last).
LONG_FILES = {
    "test_ray_cluster.py": 5.6, "test_ray_pool.py": 3.6, "test_many_writers.py": 2.4, "test_vllm_lora.py": 2.4,
    "test_pbt.py": 2.2, "test_lifecycle.py": 2.0, "test_vllm_lora_es.py": 1.9, "test_extras.py": 1.7,
    "test_cli_walkthrough.py": 1.5, "test_newcomer.py": 1.4, "test_vllm_backend.py": 1.4, "test_newcomer_vllm.py": 1.3,
    "test_training.py": 1.3, "test_console_script.py": 1.2, "test_vllm_rebuild.py": 0.9, "test_cli_friction.py": 0.8,
    "test_notebook.py": 0.7, "test_attribute.py": 0.7, "test_training_hard_tasks.py": 0.6, "test_module_es.py": 0.6,
    "test_tune.py": 0.5, "test_untrusted_signals.py": 0.5, "test_tasks_reasoning_gym.py": 0.5,
    "test_tune_lease.py": 0.4, "test_provenance.py": 0.4, "test_passk_vllm.py": 0.4,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Long files first (LONG_FILES), the rest in their usual order (a stable sort)."""
    items.sort(key=lambda item: -LONG_FILES.get(item.path.name, 0.0))
