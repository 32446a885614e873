"""A fork's refusals, taken before its child run exists (issue 31 item 6).

A policy restored from the parent's records says whether it can continue them (LM-MA-ES
keeps its parent's path layout; it cannot read a GA's survivor offsets): asked before
`create_run`, so a refusal is one line and leaves no empty child holding the name. What
depends on the loaded weights (LM-MA-ES's default memory, its rates' dimension) is asked
again while the fork is set up, where a failure deletes the child before anything trains.
"""

from __future__ import annotations

from typing import Any

from seedledger.engine.config import TrainConfig
from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay.paths import StateView
from seedledger.trainers.policy import make_policy


def check_policy(ledger: Ledger, parent: str, generation: int, cfg: TrainConfig, pool: Any = None,
                 trained: Any = None) -> None:
    """SeedLedgerError if `cfg`'s policy cannot continue `parent@generation`; with `pool`
    (holding that generation) and `trained`, the check that needs the weights too."""
    try:
        policy = make_policy(cfg)
        state = policy.restore(ledger.records(parent, upto=generation))
        if pool is not None and policy.needs_state:
            policy.attach(state, StateView(*pool.state(), trained))
        else:
            policy.check_parent(state)
    except ValueError as exc:
        raise SeedLedgerError(f"cannot fork {parent}@{generation}: {exc}") from None
