"""Commands that replay a history: `verify` (check every fingerprint) and `rebuild`
(write the model as a Hugging Face directory). The work is engine.api and engine.rebuild.rebuilding,
imported when a command runs.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from seedledger.engine.cli.app import (
    DEFAULT_LEDGER,
    AllowUnverified,
    JsonOpt,
    LedgerOpt,
    State,
    app,
    emit,
    open_ledger,
    say,
)


@app.command()
def verify(
    ref: Annotated[str, typer.Argument(help="RUN or RUN@G.")],
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    quick: Annotated[
        bool,
        typer.Option("--quick", help="Only recompute the rows' hash chain (no model, no replay): "
                     "finds rows edited outside seedledger in seconds."),
    ] = False,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Replay RUN up to G from its base and check every fingerprint (exit 1 on a mismatch).
    Every replay first checks the rows' hash chain; --quick checks only that."""
    from seedledger.engine.api import check_device
    from seedledger.ledger.errors import NotVerified, VerifyMismatch

    check_device(device)
    from seedledger.engine import api

    with open_ledger(ledger) as led:
        report = api.verify(ref, ledger=led, device=device, quick=quick)
    if quick and report["ok"]:
        emit(report, as_json, f"chain verified {report['run']}@{report['generation']}: "
             f"{report['generations_checked']} rows match their digests (head {report['digest']})")
        return
    if "event_error" in report:  # the result stands; only the audit trail missed it
        say(f"warning: the verify event was not recorded: {report['event_error']}")
    if not report["ok"]:
        emit(report, as_json)  # the JSON report says which generation; stderr the one line
        raise (NotVerified if "not_verified" in report else VerifyMismatch)(report["error"])
    emit(report, as_json, f"verified {report['run']}@{report['generation']}: "
         f"{report['generations_checked']} fingerprints match ({report['fingerprint']})\n"
         f"weights match; inputs: {report['inputs']['text']}")


class VerifyWhen(StrEnum):
    every = "every"
    end = "end"


VerifyOpt = Annotated[
    VerifyWhen,
    typer.Option("--verify", help="Check the fingerprint of every replayed generation, or only the last."),
]


@app.command()
def rebuild(
    source: Annotated[str, typer.Argument(help="RUN, RUN@G, RUN@G#M in the ledger, or a FILE.seeds.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Directory to write.")],
    base: Annotated[str | None, typer.Option("--base", help="Base model alias or directory.")] = None,
    device: Annotated[str, typer.Option("--device", help="cpu or cuda.")] = "cpu",
    verify_: VerifyOpt = VerifyWhen.end,
    force: Annotated[
        bool, typer.Option("--force", help="Replace DIR even if it is not an earlier rebuild's output.")
    ] = False,
    allow_unverified: AllowUnverified = False,
    merge: Annotated[
        bool, typer.Option("--merge", help="LoRA runs: write the base with the adapter merged in.")
    ] = False,
    ledger: LedgerOpt = DEFAULT_LEDGER,
    as_json: JsonOpt = False,
):
    """Rebuild the model at RUN@G (or from a seed file) as a Hugging Face directory.

    SOURCE is a run when it names one in the ledger (RUN or RUN@G), else a seed file;
    write ./NAME for a file that shares its name with a run. A LoRA run gives a PEFT
    adapter directory (adapter_config.json, adapter_model.safetensors), or with --merge
    the merged model.
    """
    from seedledger.engine import api

    api.check_device(device)
    report = api.rebuild_to(
        source, output, ledger=ledger or DEFAULT_LEDGER, base=base, device=device,
        verify=verify_.value, force=force, upgrade=State.upgrade, allow_unverified=allow_unverified,
        merge=merge,
    )
    unverified = f"; NOT VERIFIED: {report['not_verified']}" if not report["verified"] else ""
    from seedledger.engine.refs import format_ref

    named = format_ref(report["run"], report["generation"], report.get("member"))
    emit(report, as_json, f"wrote {report['output']} ({named}, "
         f"fingerprint {report['fingerprint']}{unverified})")
