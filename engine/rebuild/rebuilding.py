"""Rebuild and verify: what to rebuild, resolved once, and the fp32 master it stands for.

The replay arithmetic is `replay.rebuild`; this module adds what replay must not know:
where the base model comes from, and whether SOURCE is a run of the ledger or a seed
file (`resolved`: one resolver for the CLI and engine.api, giving one `Source` record that
one builder, `build_master` / `build`, replays). The output side (a Hugging Face
directory, atomically) is engine.rebuild.output.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from seedledger.engine.config import is_module_model
from seedledger.engine.rebuild.memory import check_rebuild_memory, check_replay_memory
from seedledger.engine.rebuild.module_start import factory_check, module_start
from seedledger.engine.rebuild.output import check_output, write_output
from seedledger.engine.rebuild.output import merged_weights as merged_weights  # engine.api's names
from seedledger.engine.rebuild.output import model_from_master as model_from_master
from seedledger.engine.rebuild.sources import FileSource, RunSource, Source, Start, load_start
from seedledger.engine.refs import parse_ref, resolve_ref, split_member
from seedledger.engine.runtime.models.resolve import resolve_model
from seedledger.ledger import Ledger
from seedledger.ledger.db import sqlite_path, to_url
from seedledger.ledger.errors import NotVerified, SeedLedgerError, VerifyMismatch
from seedledger.ledger.records import missing_fingerprint
from seedledger.replay.fingerprint import fingerprint
from seedledger.replay.kinds import from_run
from seedledger.replay.rebuild import rebuild


def _fits(what: str, base: str, noise_spec: str, param_selection: str, steps: list) -> None:
    """Refuse, before the base is loaded, a replay of `steps` that needs more memory than
    the bound (`engine.rebuild.memory`): a planted file's paths each cost a copy of the model.
    A module run has no safetensors headers to size it by: `_start` counts its base once
    loaded (a bounded read: engine.rebuild.module_start), before any replay state exists."""
    if is_module_model(base):
        return
    kind = from_run(noise_spec, param_selection)  # adapter None: the model's own weights are trained
    check_rebuild_memory(what, resolve_model(base), [s.optimizer for s in steps], kind.adapter, len(kind.carried))


def _start(src: Source, base: str | None, device: str) -> Start:
    """Generation 0 of `src`, on `base` (else its recorded base), checked to be its base; a
    module run's replay memory is estimated from it here (`_fits` cannot)."""
    if is_module_model(src.base_model):  # any torch.nn.Module (engine.rebuild.module_start)
        start = module_start(src, base, device)
        trained = sum(t.numel() for n, t in start.master.items() if start.kind.trained(n, t.shape))
        check_replay_memory(src.what, sum(t.numel() for t in start.master.values()), trained,
                            [s.optimizer for s in src.steps()], len(start.kind.carried))
    else:
        start = load_start(base or src.base_model, src.config, src.noise_spec, src.param_selection, device)
    src.check_base(start, base)
    return start


def _unchecked(missing: tuple[int, str] | None, what: str, allow_unverified: bool) -> dict:
    """The report's `verified` fields; NotVerified (exit 1) when nothing checks `what` and
    the user did not pass --allow-unverified."""
    if missing is None:
        return {"verified": True}
    if not allow_unverified:
        raise NotVerified(
            f"{what} could not be verified: {missing[1]}; pass --allow-unverified to rebuild it anyway"
        )
    return {"verified": False, "not_verified": missing[1]}


def _with_event(ledger: Ledger, run: str, payload: dict, report: dict) -> dict:
    """`report`, after recording `payload` as the run's `verify` event; when the ledger
    cannot take it (read-only), the result still stands and `event_error` says why."""
    try:
        ledger.log_event(run, "verify", payload)
    except SeedLedgerError as exc:
        report["event_error"] = str(exc)
    return report


def verify_ref(ledger: Ledger, ref: str, device: str = "cpu") -> dict:
    """Replay from the base (no anchors) and compare every generation's fingerprint.

    Every outcome is logged as a `verify` event (where the ledger can be written: else the
    report's `event_error` says so); a mismatch, or a base or generation with no
    fingerprint to compare against ("not verified"), is reported (`ok: false`, the first
    generation concerned, the message), not raised, so that the CLI can print the report
    before it exits 1.
    """
    run, gen = resolve_ref(ledger, ref)
    missing = missing_fingerprint(run.base_fingerprint, ledger.fingerprints(run.name, gen))
    if missing is not None:
        bad, why = missing
        message = f"{run.name}@{gen} not verified: {why}"
        return _with_event(
            ledger, run.name,
            {"generation": gen, "ok": False, "device": device, "first_bad_generation": bad,
             "error": message, "not_verified": why},
            {
                "run": run.name,
                "generation": gen,
                "generations_checked": 0,
                "first_bad_generation": bad,
                "fingerprint": None,
                "ok": False,
                "not_verified": why,
                "error": message,
            },
        )
    src = RunSource.of(ledger, run, gen)
    src.check_rules()  # before the memory estimate counts a rule's state
    _fits(src.what, src.base_model, src.noise_spec, src.param_selection, src.steps())
    start = _start(src, None, device)
    try:
        master, _ = rebuild(ledger, run.name, gen, start.master, verify="every", anchors_dir=None,
                            frozen=start.frozen)
    except VerifyMismatch as exc:
        bad = exc.generation
        message = f"{run.name}@{gen} does not verify: {exc}"
        return _with_event(
            ledger, run.name,
            {"generation": gen, "ok": False, "device": device, "first_bad_generation": bad,
             "error": str(exc)},
            {
                "run": run.name,
                "generation": gen,
                "generations_checked": bad,
                "first_bad_generation": bad,
                "fingerprint": None,
                "ok": False,
                "error": message,
            },
        )
    fp = fingerprint(master)
    report = {"run": run.name, "generation": gen, "generations_checked": gen, "fingerprint": fp, "ok": True}
    factory = factory_check(ledger, run, gen)  # a module run's model is code the replay never ran
    if factory is not None:
        report["factory"] = factory
    if factory is not None and factory["status"] == "changed":
        message = f"{run.name}@{gen} does not verify: {factory['text']}"
        return _with_event(ledger, run.name, {"generation": gen, "ok": False, "device": device, "fingerprint": fp,
                                              "error": message}, report | {"ok": False, "error": message})
    return _with_event(ledger, run.name, {"generation": gen, "ok": True, "device": device, "fingerprint": fp}, report)


def build_master(
    src: Source, base: str | None = None, device: str = "cpu",
    *, verify: str = "end", allow_unverified: bool = False,
) -> tuple[Start, dict[str, torch.Tensor], dict, dict]:
    """The fp32 master `src` stands for, in memory: (its start, the master, meta, the
    report's `verified` fields). A member is its parent generation (checked against its
    fingerprint) plus the member's perturbation, the weights that member was evaluated
    with (`replay.rebuild.apply_member`). The one builder of `rebuild` and the Python API."""
    fps = src.fingerprints()
    wanted = fps if verify == "every" else {g: fp for g, fp in fps.items() if g == src.upto}
    checked = _unchecked(missing_fingerprint(src.base_fingerprint, wanted), src.lineage, allow_unverified)
    src.check_rules()  # before the memory estimate counts a rule's state
    base_ref = src.base_model if is_module_model(src.base_model) else base or src.base_model
    _fits(src.what, base_ref, src.noise_spec, src.param_selection, src.steps())
    start = _start(src, base, device)
    master, state = src.replay(start, verify)
    fp = None
    if src.final_fingerprint is not None:
        fp = fingerprint(master)
        if fp != src.final_fingerprint:
            raise VerifyMismatch(
                f"{src.what}: rebuilt fingerprint {fp} differs from the file's {src.final_fingerprint}"
            )
    meta: dict = {"run": src.run, "generation": src.generation}
    if src.member is not None:
        src.add_member(master, state)
        meta |= {"member": src.member, "parent_fingerprint": src.parent_fingerprint(fps)}
        fp = None
    meta |= {"fingerprint": fp or fingerprint(master), "base_model": src.base_model}
    return start, master, meta, checked


def build(
    src: Source, output: Path, base: str | None = None, device: str = "cpu",
    *, verify: str = "end", force: bool = False, allow_unverified: bool = False, merge: bool = False,
) -> dict:
    """Write the model `src` stands for (`build_master`) to `output`; the output is judged
    (`check_output`) before any work. Returns the report."""
    check_output(output, force, src.keep)
    start, master, meta, checked = build_master(src, base, device, verify=verify,
                                                allow_unverified=allow_unverified)
    written = write_output(start, master, output, meta, merge=merge, force=force, keep=src.keep)
    return {**meta, **written, "output": str(output), "verify": verify, **checked}


@contextmanager
def resolved(source: str | os.PathLike[str], ledger: Ledger | str, *, upgrade: bool = True) -> Iterator[Source]:
    """The one answer to "what is SOURCE": a run of `ledger` (RUN, RUN@G, RUN@G#M) when
    the ledger has one by that name, else a seed file; both at once is refused as
    ambiguous (write ./FILE for the file). A `Path` is a file whatever the ledger holds.
    `ledger` is an open ledger (the caller closes it) or a location, opened here only
    when SOURCE may be a run, and closed after."""
    location = ledger.location if isinstance(ledger, Ledger) else ledger
    ledger_file = sqlite_path(to_url(location))
    if isinstance(source, os.PathLike):
        yield FileSource.read(Path(source), ledger_file)
        return
    has_ledger = isinstance(ledger, Ledger) or ledger_file is None or ledger_file.exists()
    is_file = Path(source).is_file()
    if "#" in source and not is_file:
        split_member(source)  # a malformed RUN@G#M: say what is wrong with it
    run_name = _run_part(source)
    led = ledger if isinstance(ledger, Ledger) else None
    if led is None and has_ledger and (run_name is not None or not is_file):
        try:
            led = Ledger.open(location, upgrade=upgrade, create=False)
        except SeedLedgerError:
            if not is_file:
                raise  # a seed file needs no ledger: one that cannot be opened is no run
    try:
        is_run = led is not None and run_name is not None and led.has_run(run_name)
        if is_run and is_file:
            raise SeedLedgerError(f"{source!r} is both a run in {location} and a file; write ./{source} for the file")
        if not is_run and not is_file:
            where = f"in {location}" if has_ledger else f"(no ledger at {location})"
            raise SeedLedgerError(f"{source!r} is neither a run {where} nor a seed file")
        yield RunSource.resolve(led, source) if is_run else FileSource.read(Path(source), ledger_file)
    finally:
        if led is not None and led is not ledger:
            led.close()


def _run_part(source: str) -> str | None:
    """The run name of `source` read as RUN or RUN@G; None when it cannot be one."""
    try:
        name, _ = parse_ref(split_member(source)[0])
    except SeedLedgerError:
        return None
    return name


def rebuild_source(
    ledger: Ledger | str, source: str | os.PathLike[str], output: Path, base: str | None, device: str,
    *, verify: str = "end", force: bool = False, upgrade: bool = True,
    allow_unverified: bool = False, merge: bool = False,
) -> dict:
    """`seedledger rebuild SOURCE -o DIR` and `engine.api.rebuild_to`: `resolved`, then `build`."""
    with resolved(source, ledger, upgrade=upgrade) as src:
        return build(src, output, base, device, verify=verify, force=force,
                     allow_unverified=allow_unverified, merge=merge)


def source_master(
    source: str | os.PathLike[str], ledger: Ledger | str, base: str | None = None, device: str = "cpu",
    *, verify: str = "end", allow_unverified: bool = False,
) -> tuple[Start, dict[str, torch.Tensor], dict, dict]:
    """`engine.api.rebuild` and `rebuild_model`: `resolved`, then `build_master`."""
    with resolved(source, ledger) as src:
        return build_master(src, base, device, verify=verify, allow_unverified=allow_unverified)


def ref_master(ledger: Ledger, ref: str, base: str | None = None, device: str = "cpu", *, verify: str = "end",
               allow_unverified: bool = False) -> tuple[Start, dict[str, torch.Tensor], dict, dict]:
    """`build_master` of `RUN@G` or `RUN@G#M` in `ledger`."""
    return build_master(RunSource.resolve(ledger, ref), base, device, verify=verify, allow_unverified=allow_unverified)


def seedfile_master(path: Path, base: str | None = None, device: str = "cpu", *, verify: str = "end",
                    allow_unverified: bool = False) -> tuple[Start, dict[str, torch.Tensor], dict, dict]:
    """`build_master` of a seed file."""
    return build_master(FileSource.read(path), base, device, verify=verify, allow_unverified=allow_unverified)


def rebuild_ref(ledger: Ledger, ref: str, output: Path, base: str | None, device: str, *, verify: str = "end",
                force: bool = False, allow_unverified: bool = False, merge: bool = False) -> dict:
    """`build` of `RUN@G` or `RUN@G#M` in `ledger` (a bad reference is reported before the output is judged)."""
    return build(RunSource.resolve(ledger, ref), output, base, device, verify=verify, force=force,
                 allow_unverified=allow_unverified, merge=merge)


def rebuild_seedfile(path: Path, output: Path, base: str | None, device: str, *, verify: str = "end",
                     force: bool = False, allow_unverified: bool = False, merge: bool = False) -> dict:
    """`build` of a seed file."""
    return build(FileSource.read(path), output, base, device, verify=verify, force=force,
                 allow_unverified=allow_unverified, merge=merge)


def quick_report(led: Ledger, ref: str) -> dict:
    """`verify --quick`: the hash chain of RUN@G's lineage, recomputed from the rows (no
    model, no replay); a `verify` event records the outcome either way."""
    from seedledger.ledger.errors import ChainBroken

    run, gen = resolve_ref(led, ref)
    report = {"run": run.name, "generation": gen, "quick": True}
    try:
        digest, checked = led.check_chain(run.name, gen)
    except ChainBroken as exc:
        report |= {"ok": False, "generations_checked": 0, "first_bad_generation": exc.generation,
                   "error": f"{run.name}@{gen} does not verify: {exc}"}
    else:
        report |= {"ok": True, "generations_checked": checked, "digest": digest}
    led.log_event(run.name, "verify", {k: v for k, v in report.items() if k != "run"})
    return report
