"""The public Python API (`import seedledger as sl`): what the command line does, from a
script or a notebook. The `seedledger` commands call these functions, so both stay one.

Every function takes `ledger=`: an open `Ledger` (from `open_ledger`, left open), a path
or SQLAlchemy URL (opened and closed around the call), or None for `$SEEDLEDGER_DB`, else
`./seedledger.db`. References are `RUN` (its latest generation), `RUN@G`, or for `rebuild`,
`rebuild_model`, `rebuild_to` and `export` also `RUN@G#M` (member M of generation G). Bad input
raises `SeedLedgerError` with a one-line message; nothing already committed is lost.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seedledger.engine.api.ledger import (
    DEFAULT_LEDGER,
    LedgerArg,
    ledger_for_call,
    open_ledger,
)
from seedledger.engine.api.models import rebuild, rebuild_model, rebuild_to
from seedledger.ledger import GenerationRecord, Ledger, RunInfo
from seedledger.ledger.seedformat import IMPORT_MAX_MEMBERS

if TYPE_CHECKING:
    import pandas

    from seedledger.engine.rebuild.attribute import Attribution
    from seedledger.engine.runtime.hooks import Hooks
    from seedledger.engine.runtime.scoring.heldout import EvaluationResult
    from seedledger.engine.runtime.session import SessionResult

__all__ = [
    "DEFAULT_LEDGER", "attribute", "evaluate", "export", "fork", "history", "history_frame", "import_seeds",
    "open_ledger", "rebuild", "rebuild_model", "rebuild_to", "resume", "train", "verify",
]
# ledger_for_call, with_final_run and progress_hooks: public (not in __all__) for the engine's
# other Python entry points (engine.evolve), which open, report and print as these do.


def with_final_run(ledger: Ledger, result: SessionResult) -> SessionResult:
    """`result` with its run read again: its status is the one the session left."""
    from dataclasses import replace

    return replace(result, run=ledger.get_run(result.run.name))


def _printing_hooks() -> Hooks:
    """One line per committed generation: progress for scripts and notebooks."""
    from seedledger.engine.runtime.hooks import Hooks

    def end(record: GenerationRecord, seconds: float) -> None:
        mean = record.reward_stats()["mean"]
        reward = "n/a" if mean is None else f"{mean:.4f}"
        print(f"generation {record.index}: reward mean {reward} ({seconds:.1f}s)", flush=True)

    return Hooks(on_generation_end=end, on_notice=lambda level, message: print(f"{level}: {message}"))


def progress_hooks(hooks: Hooks | None, progress: bool) -> Hooks | None:
    """The caller's `hooks`, else with `progress` one printed line per generation."""
    return hooks if hooks is not None or not progress else _printing_hooks()


def train(
    config: str | os.PathLike[str] | dict[str, Any] | None = None,
    *,
    run: str | None = None,
    overrides: Sequence[str] = (),
    generations: int | None = None,
    ledger: LedgerArg = None,
    hooks: Hooks | None = None,
    progress: bool = False,
) -> SessionResult:
    """Start a new run and train it (`seedledger train`).

    `config` is a YAML file, a dict of config keys, or None for the defaults; `overrides`
    are `key=value` strings as `--set` takes them. The run is named `run`, else the config
    file's stem (`run` for a dict). `generations` trains that many in this session (default:
    the config's `generations`). `progress` prints a line per generation. The ledger is
    created when it does not exist (and removed again if this fails before the run
    exists). The result's `run` is read after training (`run.status`: finished, stopped)."""
    from seedledger.engine.runtime import session

    with ledger_for_call(ledger, create=True) as led:
        return with_final_run(led, session.start(led, config, run, list(overrides), generations,
                                                 progress_hooks(hooks, progress)))


def resume(
    run: str,
    *,
    generations: int | None = None,
    ledger: LedgerArg = None,
    take_over: bool = False,
    trust_code: bool = False,
    accept_changed_inputs: bool = False,
    hooks: Hooks | None = None,
    progress: bool = False,
) -> SessionResult:
    """Continue `run` from its last committed generation (`seedledger resume`): towards its
    config's `generations` by default (no records when it is there), or `generations` more.
    `take_over` takes the writer lease from a session on another host that is gone;
    `trust_code` allows the reward code its stored config names to be imported. Inputs
    (data, reward code, scoring libraries, tokenizer) that differ from the last session's
    are refused (`InputsChanged`) unless `accept_changed_inputs`, which is recorded."""
    from seedledger.engine.runtime import session

    with ledger_for_call(ledger) as led:
        return with_final_run(led, session.resume(led, run, generations, progress_hooks(hooks, progress), take_over,
                                                  trust_code=trust_code, accept_changed_inputs=accept_changed_inputs))


def fork(
    ref: str,
    run: str,
    *,
    overrides: Sequence[str] = (),
    generations: int | None = None,
    ledger: LedgerArg = None,
    trust_code: bool = False,
    accept_changed_inputs: bool = False,
    hooks: Hooks | None = None,
    progress: bool = False,
) -> SessionResult:
    """Start the child run `run` at `ref` (RUN@G), with `overrides` changing its settings,
    and train it (`seedledger fork`). The child replays its parent up to G, then trains
    on its own; the parent is untouched. Inputs that differ from those that trained `ref`
    are refused unless `accept_changed_inputs` (as for `resume`)."""
    from seedledger.engine.runtime import session

    with ledger_for_call(ledger) as led:
        return with_final_run(led, session.fork(led, ref, run, list(overrides), generations,
                                                progress_hooks(hooks, progress), trust_code=trust_code,
                                                accept_changed_inputs=accept_changed_inputs))


def evaluate(
    ref: str,
    *,
    rows: int | None = None,
    skip: int = 0,
    against: str = "base",
    ledger: LedgerArg = None,
    trust_code: bool = False,
    record: bool = True,
    progress: bool = False,
) -> EvaluationResult:
    """Score `ref` (RUN or RUN@G) on held-out test rows, greedily (a module run: on its
    task's held-out seeds, nothing decoded), against `against`
    (`base`: generation 0 of its lineage, or another RUN@G of the same model and task) on
    the same rows (`seedledger evaluate`): both means, the paired change with its standard
    error, per-component means and a few before/after samples. `rows` test rows after
    `skip` (default: the config's `evaluation.rows`, else the test rows up to 64); recorded
    as an `evaluation` event unless `record=False`. `trust_code` as for `resume` (a module
    run's stored factory and fitness are code); `progress` says on stderr what it scores."""
    import sys

    from seedledger.engine.runtime.scoring.heldout import evaluate as score

    with ledger_for_call(ledger) as led:
        return score(led, ref, rows, skip, against, trust_code=trust_code, record=record,
                     say=(lambda line: print(line, file=sys.stderr, flush=True)) if progress else None)


def attribute(ref: str, *, ledger: LedgerArg = None, **options: Any) -> Attribution:
    """Audit `ref` (RUN or RUN@G) on a set of rows (`seedledger attribute`; docs/audit.md): the
    metric along the lineage, and with `generations=True` / `training_rows=True` (or a list
    of rows) / `retrain=[rows]` which generations and training rows made it. `options` are
    `seedledger.engine.rebuild.attribute.attribute`'s (`rows`, `held_out`, `prompt` + `answer`,
    `by`, `every`, `into`, `trust_code`, `progress`)."""
    from seedledger.engine.rebuild.attribute import attribute as audit

    with ledger_for_call(ledger) as led:
        return audit(led, ref, **options)


def history(run: str, *, ledger: LedgerArg = None) -> list[GenerationRecord]:
    """Every generation record along `run`'s lineage (RUN or RUN@G), oldest first:
    hyperparameters in force, members with their keys, coefficients and rewards, fingerprint."""
    from seedledger.engine.refs import resolve_ref

    with ledger_for_call(ledger) as led:
        info, gen = resolve_ref(led, run)
        return led.records(info.name, gen)


def history_frame(run: str, *, ledger: LedgerArg = None) -> pandas.DataFrame:
    """`run`'s lineage as a pandas DataFrame indexed by `generation`, one row per
    generation (what `seedledger log` shows), with columns run, reward_mean, reward_max,
    reward_min, reward_std, lr, sigma, population, fingerprint, committed_at and one
    `time_<phase>` per timed phase (`generation` is the index, not a column). Needs pandas."""
    from seedledger.ledger.extras import require

    pandas = require("pandas", "history_frame")
    from seedledger.engine.refs import resolve_ref

    with ledger_for_call(ledger) as led:
        info, gen = resolve_ref(led, run)
        rows = led.summaries(info.name, gen)
    flat = [{**{k: v for k, v in r.items() if k != "timings"},
             **{f"time_{k}": v for k, v in (r["timings"] or {}).items()}} for r in rows]
    return pandas.DataFrame(flat).set_index("generation") if flat else pandas.DataFrame()


def verify(ref: str, *, ledger: LedgerArg = None, device: str = "cpu", quick: bool = False) -> dict[str, Any]:
    """Replay `ref` from its base and compare every generation's fingerprint, or with
    `quick` only recompute the rows' hash chain (no model). Returns the report (`ok`, the
    first bad generation, `error`); a mismatch is reported, not raised. Recorded as a
    `verify` event. A full verify's report adds `inputs`: whether the generations were
    trained on unchanged inputs (ledger.provenance.verdict: `status` unchanged, changed
    at `generation` (`what`), or not recorded; `text` in words)."""
    from seedledger.engine.rebuild import rebuilding
    from seedledger.ledger.provenance import input_ranges, verdict

    with ledger_for_call(ledger) as led:
        if quick:
            return rebuilding.quick_report(led, ref)
        report = rebuilding.verify_ref(led, ref, device)
        return report | {"inputs": verdict(input_ranges(led, report["run"], report["generation"]))}


def export(ref: str, path: str | os.PathLike[str], *, ledger: LedgerArg = None,
           force: bool = False, with_history: bool = False) -> dict[str, Any]:
    """Write RUN@G with its whole lineage as a seed file (keys and exact coefficients:
    kilobytes); returns run, generation, file and bytes. `RUN@G#M` writes a file that
    names member M (the lineage to G-1 and the member's key, sign, σ and perturbation;
    `rebuild` takes it, `import` refuses it) and the report adds `member`. An existing
    file is replaced only with `force` (never a directory or a ledger). `with_history`
    also writes the lineage's rewards, batches and events to `PATH.history`
    (ledger.historyfile), which `import` restores; the report adds `history` and
    `history_bytes`. A kill while the files are published leaves a consistent pair
    (ledger.seedio.export_seedfile; failpoints `export-staged`, `export-cleared`,
    `export-seeds` at the exported generation)."""
    from seedledger.engine.refs import resolve_member
    from seedledger.engine.runtime.failpoints import failpoint
    from seedledger.ledger.historyfile import companion
    from seedledger.ledger.seedio import export_seedfile
    from seedledger.replay.noise import member_key

    output = Path(path)
    history = companion(output) if with_history else None
    with ledger_for_call(ledger) as led:
        info, gen, member = resolve_member(led, ref)
        export_seedfile(led, info.name, gen, output, key_fn=member_key, force=force, member=member,
                        history=history, step=lambda point: failpoint(point, gen))
    report: dict[str, Any] = {"run": info.name, "generation": gen}
    if member is not None:
        report["member"] = member
    report |= {"file": str(output), "bytes": output.stat().st_size}
    if history is not None:
        report |= {"history": str(history), "history_bytes": history.stat().st_size}
    return report


def import_seeds(
    path: str | os.PathLike[str],
    run: str | None = None,
    *,
    ledger: LedgerArg = None,
    allow_unverified: bool = False,
    max_members: int = IMPORT_MAX_MEMBERS,
    history: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Import a seed file as one new run (named `run`, else as in the file), checked in
    full first and committed in one transaction; refused when it holds no fingerprint to
    check a replay against, unless `allow_unverified`. Its history file (`history`, else
    `PATH.history` when it exists: what `export(..., with_history=True)` wrote) is checked
    as fully and restored with it: the sender's rewards, batches and events. Returns run,
    latest_generation, verified (with `not_verified` saying why not) and, when one was
    restored, history (its file). The ledger is created if need be."""
    from seedledger.engine.rebuild.seedcheck import check_seedfile
    from seedledger.ledger.seedio import import_seedfile
    from seedledger.replay.noise import member_key

    with ledger_for_call(ledger, create=True) as led:
        info: RunInfo = import_seedfile(
            led, path, run, key_fn=member_key, allow_unverified=allow_unverified,
            check=check_seedfile, max_members=max_members, history=history,
        )
        latest = led.latest_generation(info.name)
        event = led.events(info.name, "import")[0].payload  # its own: restored events come after it
    why = event.get("not_verified")
    report: dict[str, Any] = {"run": info.name, "latest_generation": latest, "verified": why is None}
    if why is not None:
        report["not_verified"] = why
    if "history" in event:
        report["history"] = event["history"]["file"]
    return report


# what the commands use of the runtime beside the API (engine.api.support; not in __all__)
from seedledger.engine.api.support import (  # noqa: E402, F401
    anchors_dir,
    check_device,
    describe_model,
    removed_if_unused,
    stored_code,
)
