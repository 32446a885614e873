"""Every command at least once through the installed console script, end to end.

The suite runs commands in process (tests/support/cli.py: `main(argv)` with what a new
process would have set fresh); this file and the ones named in `ELSEWHERE` keep the real
`seedledger` executable in the loop for each command: its entry point, its exit statuses,
stdout and stderr as pipes. A command added to the app without a place here fails
`test_every_command_runs_through_the_console_script_somewhere`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seedledger.engine.cli import app
from tests.support.cli import seedledger
from tests.support.configs import tiny_config

pytestmark = pytest.mark.slow  # make test-quick leaves it to make test

# commands whose console-script run lives in another file
ELSEWHERE = {
    # the README walkthrough, run through bash as printed (test_cli_walkthrough.py)
    "example": "test_cli_walkthrough", "train": "test_cli_walkthrough", "log": "test_cli_walkthrough",
    "show": "test_cli_walkthrough", "fork": "test_cli_walkthrough", "diff": "test_cli_walkthrough",
    "verify": "test_cli_walkthrough", "export": "test_cli_walkthrough", "rebuild": "test_cli_walkthrough",
    "plot": "test_cli_walkthrough",
    "tune": "test_tune_lease",  # tuners killed and rerun as processes
    "pbt": "test_pbt",  # a study SIGKILLed at a failpoint, then rerun
    "attribute": "test_attribute",  # --json and --plot of an audit
}
HERE = {"resume", "evaluate", "import", "rm", "db", "demo"}


def commands() -> set[str]:
    return {c.name or c.callback.__name__ for c in app.registered_commands} | {g.name for g in app.registered_groups}


def test_every_command_runs_through_the_console_script_somewhere():
    assert commands() == set(ELSEWHERE) | HERE
    assert not set(ELSEWHERE) & HERE


def run(work: Path, *args: str, code: int = 0):
    proc = seedledger(args, cwd=work, process=True, timeout=600)
    assert proc.returncode == code, f"seedledger {' '.join(args)} exited {proc.returncode}: {proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A run `r` of one generation, trained through the console script."""
    work = tmp_path_factory.mktemp("script")
    (work / "c.yaml").write_text(tiny_config(generations=1, sigma=0.05, lr=0.01, evaluation={"rows": 2}))
    run(work, "train", "c.yaml", "--run", "r", "--json")
    return work


def test_resume_evaluate_import_rm_and_db(work):
    assert json.loads(run(work, "resume", "r", "--generations", "1", "--json").stdout)["generations_committed"] == [2]
    report = json.loads(run(work, "evaluate", "r", "--json").stdout)
    assert (report["run"], report["against"], report["rows"], len(report["rewards"])) == ("r", "r@0", 2, 2)
    run(work, "export", "r", "-o", "r.seeds")
    imported = json.loads(run(work, "import", "r.seeds", "--run", "copy", "--json").stdout)
    assert imported == {"run": "copy", "latest_generation": 2, "verified": True}
    assert run(work, "rm", "copy", "--force").returncode == 0
    runs = [r["name"] for r in json.loads(run(work, "log", "--json").stdout)]
    assert runs == ["r"]
    assert run(work, "db", "current").stdout.strip()
    assert run(work, "db", "history").stdout.strip()


def test_usage_and_input_errors_exit_2_with_one_line(work):
    for args in (["resume", "nope"], ["evaluate", "r@99"], ["import", "missing.seeds"], ["rm", "nope"],
                 ["db", "nonsense"], ["demo", "--config", "missing.yaml", "--workdir", "d"]):
        err = run(work, *args, code=2).stderr
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, (args, err)


def test_demo_runs_on_tiny(work):
    (work / "demo.yaml").write_text(tiny_config(generations=1, sigma=0.05, lr=0.01, evaluation={"rows": 2}))
    figures = json.loads(run(work, "demo", "--config", "demo.yaml", "--workdir", "demo-out", "--json").stdout)
    assert figures["generations"] == 1 and figures["verified"] is True, figures
    assert (work / "demo-out" / "seedledger.db").is_file()
