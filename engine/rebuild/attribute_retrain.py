"""The retrain counterfactual: what the run would have become had one training row never
been in it, by training again without it.

A fork of the run at the generation before the row was first drawn, with the row in
`exclude_rows` (every later batch keeps its other rows) and everything else as the run
had it: the same seed, so the same member keys and batches, the same settings, trained to
the audited generation. Unlike the replay counterfactual, every later generation is
evaluated again on the changed weights, so their coefficients change too: it answers what
the row did through everything that followed, at the cost of retraining. It is an ordinary
run of the ledger (named `RUN-without-R` unless named otherwise), so it can be verified,
compared, exported; asking again reuses it.
"""

from __future__ import annotations

import json

from seedledger.engine.runtime import session
from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.names import check_run_name


def fork_name(run: str, row: int) -> str:
    """The default name of `run`'s fork without training row `row`."""
    return f"{run[:40]}-without-{row}"


def retrain(ledger: Ledger, run: str, upto: int, row: int, first: int, name: str | None = None, *,
            trust_code: bool = False) -> str:
    """The name of `run`'s fork at `first − 1` without `row`, trained to `upto` (made now,
    or an existing one that is exactly this counterfactual)."""
    name = check_run_name(name or fork_name(run, row))
    segments = ledger.ancestors(run, upto)
    holder = next(r for r, a, b in segments if a <= first <= b)
    if holder != segments[-1][0]:
        raise SeedLedgerError(f"attribute --retrain {row}: the row was first drawn at generation {first}, in run "
                              f"{holder}, not in the audited run's own generations; audit {holder} instead")
    info = ledger.get_run(holder)
    excluded = sorted({*info.config.get("exclude_rows", []), row})
    if ledger.has_run(name):
        if _is_counterfactual(ledger, name, holder, first - 1, excluded, upto):
            return name
        raise SeedLedgerError(f"run {name} exists and is not {holder}@{first - 1} retrained without row {row} to "
                              f"generation {upto}; name the counterfactual another way")
    session.fork(ledger, f"{holder}@{first - 1}", name, [f"exclude_rows={json.dumps(excluded)}"], upto - first + 1,
                 trust_code=trust_code)
    if ledger.latest_generation(name) != upto:  # stopped early (a signal): not the counterfactual
        raise SeedLedgerError(f"run {name} stopped at generation {ledger.latest_generation(name)} before {upto}; "
                              "resume it, then attribute again")
    return name


def _is_counterfactual(ledger: Ledger, name: str, parent: str, at: int, excluded: list[int], upto: int) -> bool:
    """Whether run `name` is `parent@at` forked with `excluded`, trained to `upto`."""
    info = ledger.get_run(name)
    return (info.parent == (parent, at) and sorted(info.config.get("exclude_rows", [])) == excluded
            and ledger.latest_generation(name) == upto)
