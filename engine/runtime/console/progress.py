"""Progress for long commands: live bars at a terminal, plain lines in logs.

When stdout is a terminal, training draws one rich bar per generation on stderr (so that
`--json` output on stdout stays one clean document). When it is not (CI logs,
`make demo > log`, a pipe), bars would print nothing until the end, so each generation
prints one flushed line on stdout instead, and model provisioning one line per step
(`line`). A generation that takes minutes (SmolLM2 on a CPU) also prints how far it got,
at most once per `$SEEDLEDGER_PROGRESS_SECONDS` (default 30; 0 = after every member
group): `generation 3: 4/8 members, 61.2s`, so a log never looks stuck and fast
generations add nothing. Under `--json` these lines are off; notices (a lease taken over)
always go to stderr.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from seedledger.engine.runtime.console.terminal import interactive, line
from seedledger.ledger.errors import SeedLedgerError

if TYPE_CHECKING:
    from seedledger.engine.runtime.hooks import Hooks
    from seedledger.ledger import GenerationRecord


PROGRESS_SECONDS = 30.0
"""Default least time between two in-generation lines in a log."""


def progress_seconds() -> float:
    """`$SEEDLEDGER_PROGRESS_SECONDS` (seconds >= 0), else `PROGRESS_SECONDS`."""
    text = os.environ.get("SEEDLEDGER_PROGRESS_SECONDS", "").strip()
    if not text:
        return PROGRESS_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise SeedLedgerError(f"SEEDLEDGER_PROGRESS_SECONDS: expected seconds >= 0, got {text[:40]!r}")
    return value


class TrainingProgress:
    """Hooks for the training loop: live bars (terminal) or one line per generation (log)."""

    def __init__(self, enabled: bool = True, live: bool | None = None):
        self.console = Console(stderr=True)
        self.enabled = enabled
        self.live = interactive() if live is None else live
        self.progress = Progress(
            TextColumn("gen {task.fields[generation]:>4}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("mean {task.fields[mean]:.3f}  best {task.fields[best]:.3f}"),
            TimeElapsedColumn(),
            console=self.console,
            disable=not (enabled and self.live),
            transient=False,
        )
        self.rows: list[tuple[int, float, float, float, str]] = []
        self.every = progress_seconds() if enabled and not self.live else PROGRESS_SECONDS
        self._generation = (0, 0)  # (index, members) of the generation in flight
        self._began = self._last = 0.0  # its start, and the last line about it (monotonic)
        self._task = None
        self._rewards: list[float] = []
        self._started = False

    def __enter__(self) -> TrainingProgress:
        return self  # the live display starts with the first generation (_start)

    def __exit__(self, *exc) -> None:
        if self._started:  # a session that failed before training leaves stderr to its error line
            self.progress.stop()

    def hooks(self) -> Hooks:
        from seedledger.engine.runtime.hooks import Hooks

        return Hooks(self._start, self._member, self._end, on_notice=self._notice)

    def _start(self, generation: int, members: int) -> None:
        if not self._started:
            self.progress.start()
            self._started = True
        self._rewards = []
        self._generation = (generation, members)
        self._began = self._last = time.monotonic()
        self._task = self.progress.add_task(
            "", total=members, generation=generation, mean=0.0, best=0.0
        )

    def _member(self, result) -> None:
        self._rewards.append(result.reward)
        self.progress.update(
            self._task,
            advance=1,
            mean=sum(self._rewards) / len(self._rewards),
            best=max(self._rewards),
        )
        self._log_partial()

    def _log_partial(self) -> None:
        """In a log, how many members are done, once `every` seconds have passed since the
        last line (the generation's own line reports the last member)."""
        generation, members = self._generation
        now = time.monotonic()
        if not self.enabled or self.live or len(self._rewards) >= members or now - self._last < self.every:
            return
        self._last = now
        line(f"generation {generation}: {len(self._rewards)}/{members} members, {now - self._began:.1f}s")

    def _end(self, record: GenerationRecord, seconds: float) -> None:
        stats = record.reward_stats()
        self.rows.append((record.index, stats["mean"], stats["max"], seconds, record.fingerprint))
        if self.enabled and not self.live:
            line(
                f"generation {record.index}: reward mean {_num(stats['mean'])} max "
                f"{_num(stats['max'])}, {seconds:.1f}s, fingerprint {record.fingerprint[:12]}"
            )

    def _notice(self, level: str, message: str) -> None:
        """Notes and warnings go to stderr, above the bars, with --json too (stdout stays
        the JSON)."""
        style = "yellow" if level == "warning" else "cyan"
        self.console.print(Text.assemble((f"{level}: ", style), message), soft_wrap=True)

    def summary(self) -> Table:
        table = Table(title="generations committed")
        for col in ("gen", "reward mean", "reward max", "seconds", "fingerprint"):
            table.add_column(col, justify="right")
        for gen, mean, best, seconds, fp in self.rows:
            table.add_row(str(gen), _num(mean), _num(best), f"{seconds:.1f}", fp[:12])
        return table


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"
