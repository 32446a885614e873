"""What an audit measures: a set of audited rows (held-out rows of the task, rows of a file,
or one prompt with a target answer) and the metric a model gets on them.

- `likelihood`: the mean over the rows of the reference answer's mean token
  log-probability given the row's prompt (nats per token, teacher forcing: no decoding).
  It moves with every update, however small, so it answers "when did the model learn to
  say this" at every generation. The reference is the row's answer written as the task's
  `loglik` reward writes it (`<answer>{answer}</answer>` for the demo), else the answer
  cell as it is; `--answer` is scored exactly as given.
  With an alternative (`--instead TEXT` for a prompt, `--instead-column COL` for rows) the
  metric is the likelihood of the answer minus that of the alternative, each scored so:
  how much the model prefers one answer to the other. What both share (the answer tags,
  the end of the turn) cancels, so the audit sees what tells them apart.
- `reward`: the task's held-out reward of greedy answers (exact match for jsonl), the
  figure `evaluate` reports; a step function of the weights, so most updates leave it
  where it was.

Prompts are built by the task (its system message, its prompt column), so an audited row
is asked exactly as a training row was. Rows come from `read_rows`, the tasks' own reader
(bounded, one-line errors).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from seedledger.engine.runtime.backends.base import Population
from seedledger.engine.runtime.scoring.evaluator import Evaluator, _prompt_text
from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.tasks.datafiles import read_rows

Metric = Literal["likelihood", "reward"]
METRICS = ("likelihood", "reward")
MAX_PROBE_ROWS = 4096  # an audit scores every row at every checkpoint: keep it a probe, not a dataset


@dataclass(frozen=True)
class Probe:
    """The audited rows and the metric (`by`); `label` says which rows they are."""

    rows: list[dict[str, Any]]
    by: Metric
    label: str
    answers: list[str] | None = None  # exact references (`--answer`), else built per row
    instead: list[str] | str | None = None  # exact alternatives (`--instead`), or the rows' column holding them

    def __post_init__(self) -> None:
        if self.by not in METRICS:
            raise SeedLedgerError(f"attribute: --by must be one of {', '.join(METRICS)}, not {self.by!r}")
        if not self.rows or len(self.rows) > MAX_PROBE_ROWS:
            raise SeedLedgerError(f"attribute: audit 1 to {MAX_PROBE_ROWS} rows, not {len(self.rows)}")

        if self.instead is not None and self.by != "likelihood":
            raise SeedLedgerError(
                "attribute: an alternative answer (--instead, --instead-column) needs --by likelihood"
            )

    def describe(self) -> dict[str, Any]:
        out = {"rows": self.label, "count": len(self.rows), "by": self.by}
        if self.instead is not None:
            out["instead"] = f"column {self.instead}" if isinstance(self.instead, str) else repr(self.instead[0])
        return out

    def with_instead(self, instead: list[str] | str | None) -> Probe:
        return dataclasses.replace(self, instead=instead)


def held_out(task: Any, count: int, skip: int = 0, by: Metric = "likelihood") -> Probe:
    """The task's held-out rows `skip`..`skip + count - 1` (rows no generation trained on)."""
    rows = task.test_rows()[skip : skip + count]
    if count < 1 or skip < 0 or len(rows) < count:
        raise SeedLedgerError(f"attribute: the task has {task.held_out_size} held-out rows; "
                              f"--held-out {count} --skip {skip} asks for rows {skip}..{skip + count - 1}")
    return Probe(rows, by, f"held-out rows {skip}..{skip + count - 1}")


def from_file(path: str | Path, by: Metric = "likelihood") -> Probe:
    """Every row of a .jsonl/.parquet file, in the task's columns."""
    rows = read_rows(path)
    if len(rows) > MAX_PROBE_ROWS:
        raise SeedLedgerError(f"{path}: {len(rows)} rows; attribute audits at most {MAX_PROBE_ROWS}")
    return Probe(rows, by, f"{Path(path).name} ({len(rows)} rows)")


def from_prompt(task: Any, prompt: str, answer: str, instead: str | None = None) -> Probe:
    """One question, asked as the task asks its rows, and the exact answer whose likelihood
    is measured (less that of `instead`, when given)."""
    if not prompt.strip() or not answer or instead == "":
        raise SeedLedgerError("attribute: --prompt and --answer (and --instead, when given) must not be empty")
    return Probe([_row_asking(task, prompt)], "likelihood", f"prompt {prompt[:40]!r}", [answer],
                 None if instead is None else [instead])


def _row_asking(task: Any, text: str) -> dict[str, Any]:
    """A row of the task whose prompt asks `text`: a test row with its prompt column (the
    cell the task's prompt shows as the question) replaced."""
    sample = dict(task.test_rows()[0])
    shown = _prompt_text(task.prompt(sample))
    column = next((k for k, v in sample.items() if isinstance(v, str) and v == shown), None)
    if column is None:
        raise SeedLedgerError(f"attribute --prompt: task {task.name} does not ask a row's cell as it is; "
                              "audit rows of a file (--rows FILE) instead")
    return {**sample, column: text}


def references(task: Any, probe: Probe, column: str = "answer") -> list[str]:
    """Each row's reference completion for `likelihood`: `--answer`, else the row's `column`
    cell as the task's `loglik` reward writes an answer (the raw cell when it has none)."""
    if probe.answers is not None and column == "answer":
        return list(probe.answers)
    missing = [i for i, row in enumerate(probe.rows) if not isinstance(row.get(column), str | int | float)]
    if missing:
        raise SeedLedgerError(f"attribute --by likelihood: row {missing[0]} has no `{column}` to score")
    writers = task.likelihood_rewards
    if writers:
        return dataclasses.replace(writers[0], column=column).references(probe.rows)
    return [str(row[column]) for row in probe.rows]


def alternatives(task: Any, probe: Probe) -> list[str] | None:
    """The alternative completions a preference audit compares with (None: plain likelihood)."""
    if probe.instead is None or isinstance(probe.instead, list):
        return probe.instead
    return references(task, probe, probe.instead)


def scorer(evaluator: Evaluator, probe: Probe) -> Callable[[dict[str, torch.Tensor]], list[float | None]]:
    """The per-row metric of a master on `probe` (None: a row the reward could not score),
    with prompts and references built once."""
    task, backend = evaluator.task, evaluator.backend
    prompts = [task.prompt(row) for row in probe.rows]
    if probe.by == "likelihood":
        refs, other = references(task, probe), alternatives(task, probe)
        alone = Population(keys=(0,), signs=(0,), sigma=1.0, seeds=(None,))  # sign 0: the master itself
        asked = prompts if other is None else prompts + prompts

        def likelihood(master: dict[str, torch.Tensor]) -> list[float | None]:
            backend.load_master(master)
            with torch.no_grad():
                scores = backend.loglik(master, alone, asked, refs + (other or [])).scores[0]
            n = len(prompts)
            return list(scores) if other is None else [a - b for a, b in zip(scores[:n], scores[n:], strict=True)]

        return likelihood

    def reward(master: dict[str, torch.Tensor]) -> list[float | None]:
        backend.load_master(master)
        completions = backend.generate(prompts, evaluator.cfg.max_new_tokens, seed=None, temperature=0.0)
        rewards, _ = task.held_out_reward(prompts, completions, probe.rows)
        return list(rewards)

    return reward


def mean(values: list[float | None]) -> float:
    """The metric of one model: the mean over the rows that could be scored (0.0: none)."""
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else 0.0
