"""The `seedledger` commands (engine.cli is the console script's entry point).

Command modules are light, since every start of the CLI imports them all: app (the typer
app, shared options, error mapping), training, evaluating, search, replaying, seeds,
auditing, attributing, remove, example, db. The work they call is imported when a command
runs: audit, audit_render, plot, demo (and the runtime of engine/, e.g. engine.api and
engine.rebuild.rebuilding). Nothing outside engine.cli imports it.
"""

# each module registers its commands on `app`; --help lists them in this order
# isort: off
from seedledger.engine.cli import (  # noqa: F401
    training, evaluating, search, replaying, seeds, auditing, attributing, remove, example, db,
)
from seedledger.engine.cli.app import app, main

# isort: on

__all__ = ["app", "main"]
