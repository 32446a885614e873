"""Issue 52 items 8-9 on a `backend: vllm` run: every command's stdout under `--json` is
exactly one JSON document, no vLLM log line shows on either stream, and vLLM's log shows
on stderr with `--verbose` only. In process (tests/support/cli.py captures file
descriptors 1 and 2, so what vLLM's C code or children wrote would be seen too).

One module ledger of SmolLM2 on vLLM: train, resume, fork and evaluate each start an engine
(the costly part, ~30-60 s on 2 cores); the other commands read the ledger and replay.
`evaluate` runs once, with `--verbose`: its stdout is still one JSON document with no vLLM
line, and vLLM's log is on its stderr (train, resume and fork show the quiet default).
"""

from __future__ import annotations

import json
import re

import pytest
import yaml
from test_cli_walkthrough import Cli

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

VLLM_LINE = re.compile(r"\(MainProcess pid=|\bINFO\b|\bWARNING\b|Loading safetensors")


@pytest.fixture(scope="module")
def cli(tmp_path_factory, smollm2_dir) -> Cli:
    pytest.importorskip("vllm")
    work = tmp_path_factory.mktemp("vllm-json")
    cli = Cli(work)
    (work / "opposites.jsonl").write_text(cli.run("example", "opposites.jsonl").stdout)
    (work / "v.yaml").write_text(yaml.safe_dump({
        "model": "smollm2-135m-instruct", "backend": "vllm", "population": 2, "generations": 1,
        "batch_size": 2, "max_new_tokens": 4, "evaluation": {"rows": 2},
        "task": {"name": "jsonl", "path": "opposites.jsonl", "rewards": ["loglik"]},
    }))
    cli.trained = _one_document(cli, "train", "v.yaml", "--run", "v")
    return cli


def _one_document(cli: Cli, *args: str):
    """`seedledger ARGS --json`'s stdout as one document; no vLLM log line on either stream
    (without --verbose it shows errors only)."""
    proc = cli.run(*args, "--json")
    assert not VLLM_LINE.search(proc.stdout + proc.stderr), (proc.stdout + proc.stderr)[:3000]
    return json.loads(proc.stdout)  # the whole of stdout, nothing before or after


def test_every_command_prints_one_json_document_on_vllm(cli):
    assert cli.trained["generations_committed"] == [1]
    assert _one_document(cli, "resume", "v", "--generations", "1")["generations_committed"] == [2]
    assert _one_document(cli, "fork", "v@1", "--run", "k", "--generations", "1")["generations_committed"] == [2]
    assert {r["name"] for r in _one_document(cli, "log")} == {"v", "k"}
    assert _one_document(cli, "log", "k")["run"]["backend"] == "vllm"
    assert _one_document(cli, "show", "k@2")["generation"] == 2
    assert _one_document(cli, "diff", "v@2", "k@2")["total"]["tensors"] > 0
    assert _one_document(cli, "verify", "k")["ok"] is True
    assert _one_document(cli, "export", "k", "-o", "k.seeds")["generation"] == 2
    assert _one_document(cli, "rebuild", "k", "-o", "k-model")["generation"] == 2
    assert _one_document(cli, "plot", "v", "k", "-o", "p.png")["runs"]


def test_vllm_logs_with_verbose_on_stderr_only(cli):
    """`evaluate`'s one engine start: with `--verbose`, vLLM's log on stderr, and stdout
    still exactly one JSON document without a vLLM line."""
    verbose = cli.run("--verbose", "evaluate", "v@1", "--json")
    assert "(MainProcess pid=" in verbose.stderr and " INFO " in verbose.stderr
    assert not VLLM_LINE.search(verbose.stdout), verbose.stdout[:3000]
    report = json.loads(verbose.stdout)  # the whole of stdout, nothing before or after
    assert report["run"] == "v" and report["rows"] == 2
