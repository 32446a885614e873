"""One replay pass along a lineage that scores the model at checkpoints and branches off
counterfactual histories on its way (`attribute`).

The main pass starts from the base (checked against the lineage's base fingerprint) and
applies every recorded generation with `replay.update.apply_step`, the code training and
`verify` use, checking each generation's recorded fingerprint: an audit is also a full
verify, and nothing is scored on weights the ledger does not vouch for.

A `Branch` is the recorded history with some generations' coefficients replaced (zeroed:
a generation removed; recomputed without a training row). Just before the main pass
applies the branch's first replaced generation s, it copies the master and the derived
optimizer state (θ_{s−1} and its momentum/Adam buffers), replays s..G on the copy with the
replacements, fingerprints and scores the result, and drops the copy. So each branch costs
G − s + 1 updates and one scoring, no rebuild from the base, and memory stays at two
masters. The result is exactly the model a run with those records would reach: the same
`apply_step` on the same bits (tests: a zeroed generation against a ledger run committed
with it zeroed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError, VerifyMismatch
from seedledger.replay.adapter import start_fingerprint
from seedledger.replay.fingerprint import fingerprint
from seedledger.replay.rules import check_lineage_rules
from seedledger.replay.update import OptimizerState, apply_step

Master = dict[str, torch.Tensor]
Score = Callable[[Master], list[float | None]]
Progress = Callable[[str, int, int], None]  # (what, done, total)


@dataclass(frozen=True)
class Branch:
    """A counterfactual: `key` names it for the caller; `overrides` maps a generation to the
    coefficients it gets instead of its recorded ones (member order)."""

    key: Any
    overrides: dict[int, list[float]]

    @property
    def start(self) -> int:
        return min(self.overrides)


@dataclass(frozen=True)
class Scored:
    """A model reached by replay: its per-row metric and fingerprint."""

    rows: list[float | None]
    fingerprint: str


def base_fingerprint(ledger: Ledger, run: str) -> str | None:
    """The recorded fingerprint of the lineage's base (its root run's)."""
    info = ledger.get_run(run)
    while info.parent is not None:
        info = ledger.get_run(info.parent[0])
    return info.base_fingerprint


def _copy(master: Master, state: OptimizerState) -> tuple[Master, OptimizerState]:
    bufs = {kind: {n: t.clone() for n, t in tensors.items()} for kind, tensors in state.buffers.items()}
    return {n: t.clone() for n, t in master.items()}, OptimizerState(state.name, state.step, bufs)


def walk(
    ledger: Ledger, run: str, upto: int, master: Master, score: Score, *, checkpoints: set[int],
    branches: list[Branch] = (), frozen: str | None = None, progress: Progress | None = None,
) -> tuple[dict[int, Scored], dict[Any, Scored]]:
    """Replay `run@upto` from `master` (the base as loaded, consumed), scoring the model at
    each generation of `checkpoints` (0: the base) and at the end of every branch. Returns
    (generation → scored model, branch key → scored counterfactual at `upto`)."""
    ledger.check_chain(run, upto)  # rows edited by hand: refused before any work
    want = base_fingerprint(ledger, run)
    got = start_fingerprint(master, frozen)
    if want is not None and got != want:
        raise SeedLedgerError(f"the base weights are not run {run!r}'s base (fingerprint {got}, expected {want})")
    steps = ledger.replay_history(run, upto=upto)
    check_lineage_rules(ledger, steps)
    if [s.index for s in steps] != list(range(1, upto + 1)):
        raise SeedLedgerError(f"run {run!r} does not hold generations 1..{upto}")
    expected = ledger.fingerprints(run, upto=upto)
    for b in branches:
        if not set(b.overrides) <= set(range(1, upto + 1)):
            raise SeedLedgerError(f"counterfactual {b.key!r} replaces generations outside 1..{upto}")
    starting: dict[int, list[Branch]] = {}
    for b in branches:
        starting.setdefault(b.start, []).append(b)
    work = upto + sum(upto - b.start + 1 for b in branches)
    done = 0
    curve: dict[int, Scored] = {}
    outcomes: dict[Any, Scored] = {}
    if 0 in checkpoints:
        curve[0] = Scored(score(master), got)
    state = OptimizerState()
    for step in steps:
        for b in starting.get(step.index, []):
            outcomes[b.key] = _branch(master, state, steps[step.index - 1 :], b, score)
            done += upto - b.start + 1
            if progress is not None:
                progress("counterfactual", done, work)
        apply_step(master, state, step)
        fp = fingerprint(master)
        if expected.get(step.index) is not None and fp != expected[step.index]:
            raise VerifyMismatch(f"{run}@{step.index} does not replay: fingerprint {fp}, the ledger says "
                                 f"{expected[step.index]}", generation=step.index)
        if step.index in checkpoints:
            curve[step.index] = Scored(score(master), fp)
        done += 1
        if progress is not None:
            progress("generation", done, work)
    return curve, outcomes


def _branch(master: Master, state: OptimizerState, steps: list, branch: Branch, score: Score) -> Scored:
    """`branch` replayed from a copy of the master and state before its first generation."""
    mine, st = _copy(master, state)
    for step in steps:
        if step.index in branch.overrides:
            coefficients = list(branch.overrides[step.index])
            if len(coefficients) != len(step.coefficients):
                raise SeedLedgerError(f"counterfactual {branch.key!r}: generation {step.index} has "
                                      f"{len(step.coefficients)} members, not {len(coefficients)}")
            step = dataclasses.replace(step, coefficients=coefficients)
        apply_step(mine, st, step)
    return Scored(score(mine), fingerprint(mine))
