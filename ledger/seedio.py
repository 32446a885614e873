"""Seed files and the ledger: export a run's lineage as a file, import a file as a run.

The file format (layout, limits, checks) is ledger.seedfile; this module only moves
records between it and a `Ledger`, and decides what an import accepts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from seedledger.ledger import historyfile
from seedledger.ledger.durable import check_file_target, publish_file, remove_durably, stage_file
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.historyfile import History, companion, read_history
from seedledger.ledger.ledger import Ledger
from seedledger.ledger.names import RUN_NAME_RULE, printable, valid_run_name
from seedledger.ledger.provenance import (
    INPUTS_EVENT,
    base_provenance,
    exported_inputs,
    inputs_along,
)
from seedledger.ledger.records import (
    EventInfo,
    RunInfo,
    RunSpec,
    missing_fingerprint,
)
from seedledger.ledger.seedfile import KeyFn, SeedFile, SeedMember, encode, read_seedfile
from seedledger.ledger.seedformat import IMPORT_MAX_MEMBERS
from seedledger.ledger.seedread import parse_seedfile


def export_seedfile(
    ledger: Ledger,
    run: str,
    g: int | None,
    path: str | os.PathLike[str],
    *,
    key_fn: KeyFn | None = None,
    force: bool = False,
    member: int | None = None,
    history: str | os.PathLike[str] | None = None,
    step: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Write `run@g` (default latest) and its lineage to `path`; returns the header. With
    `member`, the file names `run@g#member` instead: the lineage up to g - 1 and that
    member's key, sign, σ and perturbation kind (format 3, `member_entry`). With
    `history` (a path: `historyfile.companion(path)` is the one `import` finds), the
    lineage's rewards, batches and events go there too (ledger.historyfile), tied to this
    seed file.

    Pass `key_fn=replay.noise.member_key` for compact files (keys stored as indices).
    An existing file is replaced only with `force`, and a directory or a ledger (any SQLite
    database) never (`durable.check_file_target`). Two files cannot be renamed at once, so
    the pair is published in an order whose every prefix leaves a consistent pair on disk
    (`_publish`): a kill at any point leaves the old pair, the old or new seed file alone,
    or the new pair, never a history beside a seed file it was not written for. `step`
    (tests: engine.runtime.failpoints) is called at each point of that order.
    """
    info = ledger.get_run(run)
    g = ledger.latest_generation(run) if g is None else g
    ledger.check_chain(run, g)  # never ship a history edited outside seedledger
    entry = None if member is None else member_entry(ledger, run, g, member)
    if entry is not None and history is not None:
        raise SeedLedgerError(f"{run}@{g}#{member} is one member's weights: it has no history to carry; "
                              f"export {run}@{g} with its history instead")
    upto = g if member is None else g - 1
    segments = ledger.ancestors(run, upto)
    segment_runs = {name: ledger.get_run(name) for name, _a, _b in segments}
    records = ledger.records(run, upto)
    header, data = encode(info, upto, segments, segment_runs, records, key_fn, entry,
                          base_provenance=base_provenance(ledger, run),
                          inputs=exported_inputs(ledger, run, upto))
    companion_data = None
    if history is not None:
        check_file_target(Path(path), force)  # before either file is staged
        companion_data = historyfile.encode(parse_seedfile(data, key_fn=key_fn), records,
                                            lineage_events(ledger, run, upto), ledger.chain_links(run, upto))
    _publish(Path(path), data, None if history is None else (Path(history), companion_data), force,
             step or (lambda _point: None))
    return header


def _publish(path: Path, data: bytes, history: tuple[Path, bytes] | None, force: bool,
             step: Callable[[str], None]) -> None:
    """Stage both files, then: remove the history now beside `path` (it describes the file
    being replaced) and the one at the new history's place, publish the seed file, then
    the history. Every state between is a consistent pair (`export_seedfile`)."""
    staged: list[Path] = []
    if history is None:  # the seed file's companion would describe another file
        check_file_target(companion(path), force)
    try:
        staged.append(stage_file(path, data, force))
        if history is not None:
            staged.append(stage_file(history[0], history[1], force))
        step("export-staged")
        if force:  # an earlier export's history: it was written for the file being replaced
            remove_durably(companion(path))
        if history is not None:
            remove_durably(history[0])
        step("export-cleared")
        publish_file(staged[0], path, force)
        step("export-seeds")
        if history is not None:
            publish_file(staged[1], history[0], force=True)  # cleared above: a new file in its place
    finally:
        for tmp in staged:
            tmp.unlink(missing_ok=True)


def lineage_events(ledger: Ledger, run: str, upto: int) -> list[EventInfo]:
    """The events that travel with `run@upto`, in the order they happened: the sessions'
    `inputs` the seed file lists (ledger.provenance.inputs_along), every other event of
    `run` but those naming a later generation, and its ancestors' events that name a
    generation of their segment of the lineage (evaluations, no-signal, resumes, ...).
    Events an import brought travel again at their sender's time; the run's own `import`
    event does not (the next import writes its own), so a history re-exported after an
    import is no larger than the one imported (historyfile.GenerationHistory.of)."""
    sessions = [(name, payload) for _start, name, payload in inputs_along(ledger, run, upto)]
    out: list[EventInfo] = []
    for name, first, last in ledger.ancestors(run, upto):
        for e in ledger.events(name, imported=True):
            g = _generation_named(e.payload)
            if e.kind == "import" and not e.imported:
                continue
            if e.kind == INPUTS_EVENT:
                keep = (name, e.payload) in sessions
            elif name == run:
                keep = g is None or g <= upto
            else:
                keep = g is not None and (0 if first == 1 else first) <= g <= last
            if keep:
                out.append(e)
    return sorted(out, key=lambda e: e.id)


def _generation_named(payload: dict[str, Any]) -> int | None:
    """The generation an event is about: its `generation`, or the first one a session
    (`from_generation`) trained; None when it names none."""
    for key, offset in (("generation", 0), ("from_generation", 1)):
        g = payload.get(key)
        if isinstance(g, int) and not isinstance(g, bool):
            return g + offset
    return None


def check_member_file(ref: str, optimizer: dict | None) -> None:
    """What a member file (format 3) may be, for `export` and for `rebuild`/`import` of one:
    a member whose generation's rule (`optimizer`, that of the member's lineage) rides no
    vectors of the replay state, which the file cannot name."""
    if (optimizer or {}).get("name") == "paths":  # replay.paths.NAME; ledger cannot import replay
        raise SeedLedgerError(f"{ref} rides vectors of the replay state (an LM-MA-ES member's "
                              "evolution paths, a GA's survivor offsets), which a seed file (format 3) does not "
                              f"name; export the run, or rebuild {ref} -o DIR from its ledger")


def member_entry(ledger: Ledger, run: str, g: int, index: int) -> SeedMember:
    """Member `index` of `run@g` as a seed file names it: its key and sign from the
    generation's row, σ and the perturbation kind from the replay step that generation is
    (its recording run's kind, or the generation's own)."""
    if g < 1:
        raise SeedLedgerError(f"{run}@0 is the base model: it has no members")
    members = ledger.generation(run, g).members
    if not 0 <= index < len(members):
        raise SeedLedgerError(f"{run}@{g} has members 0..{len(members) - 1}, not {index}")
    step = ledger.replay_history(run, upto=g)[-1]
    check_member_file(f"{run}@{g}#{index}", step.optimizer)
    m = members[index]
    return SeedMember(g, index, m.key, m.sign, step.sigma, step.run, step.noise_spec, step.param_selection)


def import_seedfile(
    ledger: Ledger,
    path: str | os.PathLike[str],
    run_name: str | None = None,
    *,
    key_fn: KeyFn | None = None,
    allow_unverified: bool = False,
    check: Callable[[SeedFile], None] | None = None,
    max_members: int = IMPORT_MAX_MEMBERS,
    history: str | os.PathLike[str] | None = None,
) -> RunInfo:
    """Import a seed file as ONE new run holding generations 1..g (lineage flattened). A
    file that names a member (`RUN@G#M`, format 3) is refused: a member is weights, not a
    generation a run could hold or continue from.

    The file is fully checked first (`check`: what a replay can apply, see read_seedfile;
    at most `max_members` members), and so is its history file (`history`, else its
    companion when there is one: ledger.historyfile); the run, all its generations and
    the events then commit in one transaction, so a bad file or a name clash writes
    nothing. With a history, the generations get the sender's rewards, reward components,
    batches, timings and `extra`, and the run the lineage's events; without one, rewards
    are unknown (NaN) and the events are the sessions' inputs the seed file lists.
    The run takes the exported run's perturbation; a generation whose segment used another
    (a fork that changed kind) records its own, so replay applies each as it was trained.
    A file without a base or generation fingerprint holds nothing a replay could be
    checked against: refused unless `allow_unverified` (the import event then says why).
    The run is named `run_name`, else as in the file; either must be a valid run name.
    """
    sf = read_seedfile(path, key_fn=key_fn, check=check, max_members=max_members)
    if sf.member is not None:
        raise SeedLedgerError(
            f"seed file {path} names one member ({printable(sf.ref)}), not a run's history: "
            f"a member has no generation record to import; rebuild it with `seedledger rebuild {path} -o DIR`"
        )
    name = run_name or sf.header["run"]
    if run_name is None and not valid_run_name(name):
        raise SeedLedgerError(
            f"seed file {path} names its run {printable(repr(name))}, which is not a valid run name "
            f"({RUN_NAME_RULE}); pass --run NAME"
        )
    missing = missing_fingerprint(sf.base_fingerprint, dict(enumerate(sf.fingerprints, 1)))
    if missing is not None and not allow_unverified:
        raise SeedLedgerError(
            f"seed file {path}: {missing[1]}, so nothing in it can be verified; "
            "pass --allow-unverified to import it anyway"
        )
    unverified = {"not_verified": missing[1]} if missing is not None else {}
    hpath = Path(history) if history is not None else companion(path)
    past = read_history(hpath, sf) if history is not None or hpath.is_file() else None
    records = historyfile.join(sf, past)
    h = sf.header
    spec = RunSpec(
        base_model=sf.base_model,
        base_revision=sf.base_revision,
        base_fingerprint=sf.base_fingerprint,
        noise_spec=h["noise_spec"],
        dtype_policy=h["dtype_policy"],
        param_selection=h["param_selection"],
        config=h["config"],
        seed=h["seed"],
        run_key=int(h["run_key"]),
        software=h["software"],
    )
    source = f"{h['run']}@{h['generation']}"
    event = {"file": str(path), "digest": sf.digest, "source": source, **unverified}
    if sf.base_provenance is not None:  # what the base is travels on (ledger.provenance.base_provenance)
        event["base_provenance"] = sf.base_provenance
    return ledger.import_run(name, records, spec, event=event | _restored(hpath, past),
                             trail=_trail(sf, past), origin=sf.digest, keep_times=past is not None)


def _restored(path: Path, past: History | None) -> dict[str, Any]:
    """What the import event says of the history it restored (nothing without one); with
    `chain` (format 2) how many generations hash to their sender's digests, and the last
    generation's digest when it does (what the sender's `verify --quick` prints)."""
    if past is None:
        return {}
    chained = {"chain": {"checked": past.checked, "digest": past.head}} if past.chain is not None else {}
    return {"history": {"file": str(path), "digest": past.digest, "events": len(past.events), **chained}}


def _trail(sf: SeedFile, past: History | None) -> list[tuple[str, dict[str, Any], datetime | None]]:
    """The events an import writes after its own, as imported ones (kind, payload, the
    sender's time): the history's as the sender held them, else the sessions' inputs the
    seed file lists (their payload also names its digest); show, log and verify read them."""
    if past is not None:
        return [(e.kind, e.payload, _when(e.at)) for e in past.events]
    return [(INPUTS_EVENT, {**e, "imported_from": sf.digest}, None) for e in sf.inputs]


def _when(text: str | None) -> datetime | None:
    """A history file's time (ISO 8601, checked by ledger.historyfile)."""
    return datetime.fromisoformat(text) if text else None
