"""Progress for long commands: live bars at a terminal, plain lines in logs.

When stdout is a terminal, training draws one rich bar per generation on stderr (so that
`--json` output on stdout stays one clean document). When it is not (CI logs,
`make demo > log`, a pipe), bars would print nothing until the end, so each generation
prints one flushed line on stdout instead, and model provisioning one line per step
(`line`). Under `--json` the per-generation lines are off; notices (a lease taken over)
always go to stderr.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from engine.loop import Hooks
    from ledger import GenerationRecord


def interactive() -> bool:
    """Whether stdout is a terminal (live bars) rather than a log (plain lines)."""
    return sys.stdout.isatty()


def line(text: str) -> None:
    """One progress line for a log: on stdout, flushed at once."""
    print(text, file=sys.stdout, flush=True)


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
        self._task = None
        self._rewards: list[float] = []

    def __enter__(self) -> TrainingProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def hooks(self) -> Hooks:
        from engine.loop import Hooks

        return Hooks(self._start, self._member, self._end, self._notice)

    def _start(self, generation: int, members: int) -> None:
        self._rewards = []
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

    def _end(self, record: GenerationRecord, seconds: float) -> None:
        stats = record.reward_stats()
        self.rows.append((record.index, stats["mean"], stats["max"], seconds, record.fingerprint))
        if self.enabled and not self.live:
            line(
                f"generation {record.index}: reward mean {_num(stats['mean'])} max "
                f"{_num(stats['max'])}, {seconds:.1f}s, fingerprint {record.fingerprint[:12]}"
            )

    def _notice(self, text: str) -> None:
        print(f"note: {text}", file=sys.stderr, flush=True)

    def summary(self) -> Table:
        table = Table(title="generations committed")
        for col in ("gen", "reward mean", "reward max", "seconds", "fingerprint"):
            table.add_column(col, justify="right")
        for gen, mean, best, seconds, fp in self.rows:
            table.add_row(str(gen), _num(mean), _num(best), f"{seconds:.1f}", fp[:12])
        return table


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"
